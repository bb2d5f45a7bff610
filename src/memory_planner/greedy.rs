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
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

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

/// The free blocks of a linear scan, indexed by offset (to merge neighbours)
/// and by (length, offset) (to find the best fit in O(log n)).
#[derive(Default)]
struct FreeBlocks {
    by_offset: BTreeMap<u64, u64>,
    by_length: BTreeSet<(u64, u64)>,
}

impl FreeBlocks {
    fn insert(&mut self, off: u64, len: u64) {
        self.by_offset.insert(off, len);
        self.by_length.insert((len, off));
    }

    fn remove(&mut self, off: u64, len: u64) {
        self.by_offset.remove(&off);
        self.by_length.remove(&(len, off));
    }

    /// Frees `off..off + len`, merging it with the free blocks it touches.
    fn release(&mut self, mut off: u64, mut len: u64) {
        if let Some((&po, &pl)) = self.by_offset.range(..off).next_back() {
            if po + pl == off {
                self.remove(po, pl);
                off = po;
                len += pl;
            }
        }
        if let Some(&nl) = self.by_offset.get(&(off + len)) {
            self.remove(off + len, nl);
            len += nl;
        }
        self.insert(off, len);
    }

    /// The smallest free block that holds `size` bytes at a multiple of
    /// `align` (the lowest such block on ties): `(offset, length, start)`.
    fn best_fit(&self, size: u64, align: u64) -> Option<(u64, u64, u64)> {
        // Blocks of at least size + align - 1 bytes always fit, so the scan
        // goes past the first of them only for misaligned shorter ones.
        self.by_length
            .range((size, 0)..)
            .map(|&(len, off)| (off, len, align_up(off, align)))
            .find(|&(off, len, start)| start + size <= off + len)
    }
}

/// A free list walked in time order, best fit, growing the arena when needed.
///
/// `O(n log n)`: this is also the plan `best` starts from on large problems, so
/// that a plan exists however early its time limit ends.
pub(crate) fn linear_scan(items: &[Item]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_unstable_by_key(|&i| (items[i].lower, Reverse(items[i].size), i));
    let mut offsets = vec![0u64; items.len()];
    let mut live: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut free = FreeBlocks::default();
    let mut top = 0u64;
    for i in order {
        let it = items[i];
        while let Some(&Reverse((up, j))) = live.peek() {
            if up > it.lower {
                break;
            }
            live.pop();
            free.release(offsets[j], items[j].size);
        }
        let off = match free.best_fit(it.size, it.align) {
            Some((fo, fl, start)) => {
                free.remove(fo, fl);
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
                let base = match free.by_offset.iter().next_back() {
                    Some((&fo, &fl)) if fo + fl == top => {
                        free.remove(fo, fl);
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
    order.sort_unstable_by_key(|&i| {
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
    // A segment tree of (load, Reverse(section)) maxima: O(sections) memory
    // (a sparse table took hundreds of MB on a million buffers).
    let m = loads.len();
    let leaves = m.next_power_of_two();
    let mut tree = vec![(0u64, Reverse(u32::MAX)); 2 * leaves];
    for (s, &l) in loads.iter().enumerate() {
        tree[leaves + s] = (l, Reverse(s as u32));
    }
    for v in (1..leaves).rev() {
        tree[v] = tree[2 * v].max(tree[2 * v + 1]);
    }
    (0..items.len())
        .map(|i| {
            let (mut a, mut b) = (
                sections.lo[i] as usize + leaves,
                sections.hi[i] as usize + leaves,
            );
            let mut best = (0u64, Reverse(u32::MAX));
            while a < b {
                if a & 1 == 1 {
                    best = best.max(tree[a]);
                    a += 1;
                }
                if b & 1 == 1 {
                    b -= 1;
                    best = best.max(tree[b]);
                }
                a >>= 1;
                b >>= 1;
            }
            (best.0, best.1 .0)
        })
        .collect()
}

/// Steps by decreasing breadth, each step's items by decreasing size.
pub(crate) fn breadth_order(items: &[Item], sections: &Sections) -> Vec<usize> {
    let loads = section_loads(items, sections);
    breadth_order_with(items, &heaviest_section(items, sections, &loads))
}

/// [`breadth_order`] from the [`heaviest_section`] of every item.
pub(crate) fn breadth_order_with(items: &[Item], heavy: &[(u64, u32)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_unstable_by_key(|&i| (Reverse(heavy[i].0), heavy[i].1, Reverse(items[i].size), i));
    order
}

/// Greedy by breadth with best-fit gaps.
pub(crate) fn greedy_breadth(items: &[Item], sections: &Sections) -> Vec<u64> {
    let order = breadth_order(items, sections);
    place_in_order(items, sections, &order, Fit::Best, u64::MAX)
        .map(|r| r.0)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_items(seed: u64, n: usize) -> Vec<Item> {
        let mut rng = super::super::testutil::Lcg(seed);
        let mut below = move |m: u64| rng.below(m);
        (0..n)
            .map(|_| {
                let lower = below(60);
                let longest = if below(4) == 0 { 60 } else { 5 };
                Item {
                    lower,
                    upper: lower + 1 + below(longest),
                    size: 1 + below(50),
                    align: [1, 4, 16][below(3) as usize],
                }
            })
            .collect()
    }

    #[test]
    fn heaviest_section_is_the_earliest_maximum_of_the_range() {
        for seed in 0..30 {
            let items = random_items(seed, 80);
            let s = Sections::new(&items);
            let loads = section_loads(&items, &s);
            let got = heaviest_section(&items, &s, &loads);
            for (i, &(l, sec)) in got.iter().enumerate() {
                let range = s.lo[i] as usize..s.hi[i] as usize;
                let max = loads[range.clone()].iter().copied().max().unwrap();
                let first = range.clone().find(|&k| loads[k] == max).unwrap();
                assert_eq!((l, sec as usize), (max, first), "seed {seed}, item {i}");
            }
        }
    }

    #[test]
    fn linear_scan_gives_aligned_disjoint_offsets() {
        for seed in 0..30 {
            let items = random_items(seed, 150);
            let offs = linear_scan(&items);
            for (i, a) in items.iter().enumerate() {
                assert_eq!(offs[i] % a.align, 0);
                for (j, b) in items.iter().enumerate().take(i) {
                    if a.meets(b) {
                        let apart = offs[i] + a.size <= offs[j] || offs[j] + b.size <= offs[i];
                        assert!(apart, "seed {seed}: items {j} and {i} share bytes");
                    }
                }
            }
        }
    }
}
