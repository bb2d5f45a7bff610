//! The simple strategies: naive, linear scan, greedy by size, greedy by breadth.
//!
//! * **naive** gives every item bytes of its own, one after the other. The arena
//!   is the sum of all sizes: a baseline, and what a planner must never exceed.
//! * **linear scan** walks time forward like a run-time allocator would: items
//!   that died are freed (and merged with free neighbours), and each newly born
//!   item takes the best-fitting free block, or grows the arena.
//! * **greedy by size** (Pisarchyk & Lee 2020, TFLite's default) takes items from
//!   the largest down and puts each in the best-fitting gap among the placed items
//!   that meet it in time.
//! * **greedy by breadth** (same paper) visits steps from the one with most live
//!   bytes down, and places that step's unplaced items, largest first, the same
//!   way.
//!
//! All return offsets per item; [`solve`](super::solve) maps them back to buffers.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::instance::{align_up, Item, Sections};
use super::place::{place_in_order, Fit};

/// Every item after the previous one, in input order.
pub(crate) fn naive(items: &[Item]) -> Vec<u64> {
    let mut top = 0;
    items
        .iter()
        .map(|it| {
            let off = align_up(top, it.align);
            top = off + it.size;
            off
        })
        .collect()
}

/// A free list walked in time order, best fit, growing the arena when needed.
pub(crate) fn linear_scan(items: &[Item]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (items[i].lower, Reverse(items[i].size), i));
    let mut offsets = vec![0u64; items.len()];
    let mut live: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut free: BTreeMap<u64, u64> = BTreeMap::new(); // offset -> length
    let mut top = 0u64;
    let release = |free: &mut BTreeMap<u64, u64>, mut off: u64, mut len: u64| {
        if let Some((&po, &pl)) = free.range(..off).next_back() {
            if po + pl == off {
                free.remove(&po);
                off = po;
                len += pl;
            }
        }
        if let Some(&nl) = free.get(&(off + len)) {
            free.remove(&(off + len));
            len += nl;
        }
        free.insert(off, len);
    };
    for i in order {
        let it = items[i];
        while let Some(&Reverse((up, j))) = live.peek() {
            if up > it.lower {
                break;
            }
            live.pop();
            release(&mut free, offsets[j], items[j].size);
        }
        // Best fit among free blocks.
        let mut best: Option<(u64, u64, u64)> = None; // (len, block offset, start)
        for (&fo, &fl) in &free {
            let start = align_up(fo, it.align);
            if start + it.size <= fo + fl && best.is_none_or(|b| fl < b.0) {
                best = Some((fl, fo, start));
            }
        }
        let off = match best {
            Some((fl, fo, start)) => {
                free.remove(&fo);
                if start > fo {
                    free.insert(fo, start - fo);
                }
                if start + it.size < fo + fl {
                    free.insert(start + it.size, fo + fl - start - it.size);
                }
                start
            }
            None => {
                // Grow the arena, reusing a free block that ends at the top.
                let base = match free.iter().next_back() {
                    Some((&fo, &fl)) if fo + fl == top => {
                        free.remove(&fo);
                        fo
                    }
                    _ => top,
                };
                let start = align_up(base, it.align);
                if start > base {
                    free.insert(base, start - base);
                }
                top = start + it.size;
                start
            }
        };
        offsets[i] = off;
        live.push(Reverse((it.upper, i)));
    }
    offsets
}

/// Items from the largest down (longer lifetime first on ties).
pub(crate) fn size_order(items: &[Item]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| {
        let it = &items[i];
        (Reverse(it.size), Reverse(it.upper - it.lower), i)
    });
    order
}

/// Greedy by size with best-fit gaps.
pub(crate) fn greedy_size(items: &[Item], sections: &Sections) -> Vec<u64> {
    let order = size_order(items);
    place_in_order(items, sections, &order, Fit::Best, u64::MAX)
        .map(|r| r.0)
        .unwrap_or_default()
}

/// Live bytes in every section.
pub(crate) fn section_loads(items: &[Item], sections: &Sections) -> Vec<u64> {
    let mut diff = vec![0i128; sections.count + 1];
    for (i, it) in items.iter().enumerate() {
        diff[sections.lo[i] as usize] += it.size as i128;
        diff[sections.hi[i] as usize] -= it.size as i128;
    }
    let mut acc = 0i128;
    diff[..sections.count]
        .iter()
        .map(|d| {
            acc += d;
            acc as u64
        })
        .collect()
}

/// For each item, the heaviest section it lives in (earliest on ties) and that
/// section's load.
pub(crate) fn heaviest_section(
    items: &[Item],
    sections: &Sections,
    loads: &[u64],
) -> Vec<(u64, u32)> {
    // Sparse table of (load, Reverse(section)) maxima.
    let m = loads.len();
    let mut table: Vec<Vec<(u64, Reverse<u32>)>> = vec![loads
        .iter()
        .enumerate()
        .map(|(s, &l)| (l, Reverse(s as u32)))
        .collect()];
    let mut k = 1;
    while (1 << k) <= m {
        let prev = &table[k - 1];
        let half = 1 << (k - 1);
        let row: Vec<_> = (0..=m - (1 << k))
            .map(|s| prev[s].max(prev[s + half]))
            .collect();
        table.push(row);
        k += 1;
    }
    (0..items.len())
        .map(|i| {
            let (a, b) = (sections.lo[i] as usize, sections.hi[i] as usize);
            let k = (usize::BITS - 1 - (b - a).leading_zeros()) as usize;
            let (l, Reverse(s)) = table[k][a].max(table[k][b - (1 << k)]);
            (l, s)
        })
        .collect()
}

/// Steps by decreasing breadth, each step's items by decreasing size.
pub(crate) fn breadth_order(items: &[Item], sections: &Sections) -> Vec<usize> {
    let loads = section_loads(items, sections);
    let heavy = heaviest_section(items, sections, &loads);
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (Reverse(heavy[i].0), heavy[i].1, Reverse(items[i].size), i));
    order
}

/// Greedy by breadth with best-fit gaps.
pub(crate) fn greedy_breadth(items: &[Item], sections: &Sections) -> Vec<u64> {
    let order = breadth_order(items, sections);
    place_in_order(items, sections, &order, Fit::Best, u64::MAX)
        .map(|r| r.0)
        .unwrap_or_default()
}
