//! Placing items one at a time at the best (or first) gap: the engine of the
//! greedy strategies.
//!
//! Greedy by size, greedy by breadth and the orders tried by the `best` strategy
//! all do the same thing: take the items in some order, and put each one into
//! the gap among the already placed items *that meet it in time* that fits it
//! best (the smallest gap it fits in, lowest offset on ties), or on top of them
//! when no gap fits. Only the order differs. [`Placer`] does that step fast.
//!
//! The naive way (look at every placed item) is quadratic, and the large traces
//! have 60k buffers. [`Placer`] cuts time (in sections, see
//! [`Sections`](super::instance::Sections)) into blocks and keeps, per block, the
//! placed items that meet the block, sorted by offset. An item that lies in one
//! block reads that one sorted list and skips the items that do not meet it; an
//! item spanning several blocks gathers their lists, removes duplicates and sorts.
//! Either way it sees the occupied byte ranges in offset order and finds the gaps
//! in one pass.

use super::instance::{align_up, Item, Sections};

/// How to choose among the gaps an item fits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// The smallest gap (lowest offset on ties): TFLite's greedy by size.
    Best,
    /// The lowest gap.
    First,
}

/// Incremental placement of items at gaps among placed items that meet them.
pub(crate) struct Placer<'a> {
    items: &'a [Item],
    lo: &'a [u32],
    hi: &'a [u32],
    shift: u32,
    blocks: Vec<Vec<(u64, u32)>>,
    /// Offset of every placed item (`u64::MAX` until placed).
    pub offsets: Vec<u64>,
    /// The highest end of any placed item.
    pub height: u64,
    stamp: Vec<u32>,
    epoch: u32,
    scratch: Vec<(u64, u64)>,
}

impl<'a> Placer<'a> {
    pub fn new(items: &'a [Item], sections: &'a Sections) -> Placer<'a> {
        // Aim for a few hundred blocks on large traces, one on small ones.
        let mut shift = 0;
        while (sections.count >> shift) > 256 {
            shift += 1;
        }
        let nblocks = (sections.count >> shift) + 1;
        Placer {
            items,
            lo: &sections.lo,
            hi: &sections.hi,
            shift,
            blocks: vec![Vec::new(); nblocks],
            offsets: vec![u64::MAX; items.len()],
            height: 0,
            stamp: vec![0; items.len()],
            epoch: 0,
            scratch: Vec::new(),
        }
    }

    /// Fills `scratch` with the byte ranges of placed items meeting item `i`, in
    /// offset order.
    fn occupied(&mut self, i: usize) {
        let (lo, hi) = (self.lo[i], self.hi[i]);
        let (b0, b1) = (
            (lo >> self.shift) as usize,
            ((hi - 1) >> self.shift) as usize,
        );
        self.scratch.clear();
        if b0 == b1 {
            for &(off, j) in &self.blocks[b0] {
                let j = j as usize;
                if self.lo[j] < hi && lo < self.hi[j] {
                    self.scratch.push((off, off + self.items[j].size));
                }
            }
        } else {
            self.epoch = self.epoch.wrapping_add(1);
            if self.epoch == 0 {
                self.stamp.iter_mut().for_each(|s| *s = 0);
                self.epoch = 1;
            }
            for b in b0..=b1 {
                for &(off, j) in &self.blocks[b] {
                    let ju = j as usize;
                    if self.stamp[ju] != self.epoch && self.lo[ju] < hi && lo < self.hi[ju] {
                        self.stamp[ju] = self.epoch;
                        self.scratch.push((off, off + self.items[ju].size));
                    }
                }
            }
            self.scratch.sort_unstable();
        }
    }

    /// The offset `fit` chooses for item `i` (which is not placed yet).
    pub fn choose(&mut self, i: usize, fit: Fit) -> u64 {
        self.occupied(i);
        let (size, align) = (self.items[i].size, self.items[i].align);
        let mut reach = 0u64;
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        for &(s, e) in &self.scratch {
            if s > reach {
                let cand = align_up(reach, align);
                if cand + size <= s {
                    let gap = s - reach;
                    if fit == Fit::First {
                        return cand;
                    }
                    if best.is_none_or(|(g, _)| gap < g) {
                        best = Some((gap, cand));
                    }
                }
            }
            reach = reach.max(e);
        }
        match best {
            Some((_, off)) => off,
            None => align_up(reach, align),
        }
    }

    /// Records item `i` at `offset`.
    pub fn put(&mut self, i: usize, offset: u64) {
        self.offsets[i] = offset;
        self.height = self.height.max(offset + self.items[i].size);
        let (b0, b1) = (
            (self.lo[i] >> self.shift) as usize,
            ((self.hi[i] - 1) >> self.shift) as usize,
        );
        for b in b0..=b1 {
            let v = &mut self.blocks[b];
            let pos = v.partition_point(|&(o, _)| o < offset);
            v.insert(pos, (offset, i as u32));
        }
    }

    /// Places item `i` where `fit` says and returns its offset.
    pub fn place(&mut self, i: usize, fit: Fit) -> u64 {
        let off = self.choose(i, fit);
        self.put(i, off);
        off
    }
}

/// Places all items in `order` with `fit`; returns the offsets (by item) and the
/// arena height. Stops early and returns `None` once the height exceeds `cutoff`.
pub(crate) fn place_in_order(
    items: &[Item],
    sections: &Sections,
    order: &[usize],
    fit: Fit,
    cutoff: u64,
) -> Option<(Vec<u64>, u64)> {
    let mut p = Placer::new(items, sections);
    for &i in order {
        p.place(i, fit);
        if p.height > cutoff {
            return None;
        }
    }
    Some((p.offsets, p.height))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_takes_the_smallest_gap() {
        // Three long items at 0..4, 4..10 (dies early), 10..12; then a gap of 6
        // opens when the middle one dies... use time to make gaps.
        let items = vec![
            Item {
                lower: 0,
                upper: 10,
                size: 4,
                align: 1,
            },
            Item {
                lower: 0,
                upper: 2,
                size: 6,
                align: 1,
            },
            Item {
                lower: 0,
                upper: 10,
                size: 2,
                align: 1,
            },
            Item {
                lower: 0,
                upper: 2,
                size: 3,
                align: 1,
            },
            Item {
                lower: 0,
                upper: 10,
                size: 1,
                align: 1,
            },
            Item {
                lower: 5,
                upper: 9,
                size: 3,
                align: 1,
            },
        ];
        let s = Sections::new(&items);
        let mut p = Placer::new(&items, &s);
        for i in 0..5 {
            p.place(i, Fit::First);
        }
        assert_eq!(&p.offsets[..5], &[0, 4, 10, 12, 15]);
        // Gaps for item 5 (steps 5..9): 4..10 (6 bytes) and 12..15 (3 bytes).
        assert_eq!(p.choose(5, Fit::Best), 12);
        assert_eq!(p.choose(5, Fit::First), 4);
    }
}
