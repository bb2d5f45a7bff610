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

use std::sync::atomic::{AtomicU64, Ordering};

use super::instance::{align_up, Item, Sections};

/// How to choose among the gaps an item fits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// The smallest gap (lowest offset on ties): TFLite's greedy by size.
    Best,
    /// The lowest gap.
    First,
}

/// A placed item as a block stores it: its byte range and its sections, inline,
/// so a scan streams through memory.
#[derive(Clone, Copy, Debug)]
struct Entry {
    off: u64,
    end: u64,
    lo: u32,
    hi: u32,
}

/// The gap search: fed occupied ranges in offset order, it tracks the best
/// (or first) gap that fits.
struct Gaps {
    size: u64,
    align: u64,
    fit: Fit,
    reach: u64,
    best: Option<(u64, u64)>,
}

impl Gaps {
    fn new(size: u64, align: u64, fit: Fit) -> Gaps {
        Gaps {
            size,
            align,
            fit,
            reach: 0,
            best: None,
        }
    }

    /// Takes the next occupied range; true when the answer is final.
    #[inline]
    fn next(&mut self, s: u64, e: u64) -> bool {
        if s > self.reach {
            let cand = align_up(self.reach, self.align);
            if cand + self.size <= s {
                let gap = s - self.reach;
                if self.best.is_none_or(|(g, _)| gap < g) {
                    self.best = Some((gap, cand));
                }
                if self.fit == Fit::First {
                    return true;
                }
            }
        }
        self.reach = self.reach.max(e);
        false
    }

    fn finish(&self) -> u64 {
        match self.best {
            Some((_, off)) => off,
            None => align_up(self.reach, self.align),
        }
    }
}

/// Incremental placement of items at gaps among placed items that meet them.
pub(crate) struct Placer<'a> {
    items: &'a [Item],
    lo: &'a [u32],
    hi: &'a [u32],
    shift: u32,
    blocks: Vec<Vec<Entry>>,
    /// Offset of every placed item (`u64::MAX` until placed).
    pub offsets: Vec<u64>,
    /// The highest end of any placed item.
    pub height: u64,
    scratch: Vec<(u64, u64)>,
    merged: Vec<(u64, u64)>,
    runs: Vec<usize>,
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
            scratch: Vec::new(),
            merged: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// Fills `scratch` with the byte ranges of placed items meeting item `i`, in
    /// offset order, for an item that spans several blocks: each block gives a
    /// run already in offset order, and the runs are merged pairwise.
    fn occupied(&mut self, i: usize) {
        let (lo, hi) = (self.lo[i], self.hi[i]);
        let (b0, b1) = (
            (lo >> self.shift) as usize,
            ((hi - 1) >> self.shift) as usize,
        );
        self.scratch.clear();
        self.runs.clear();
        self.runs.push(0);
        let shift = self.shift;
        for b in b0..=b1 {
            // An item stored in several of these blocks is taken from the first.
            self.scratch.extend(
                self.blocks[b]
                    .iter()
                    .filter(|e| e.lo < hi && lo < e.hi && ((e.lo >> shift) as usize).max(b0) == b)
                    .map(|e| (e.off, e.end)),
            );
            if self.scratch.len() > *self.runs.last().unwrap_or(&0) {
                self.runs.push(self.scratch.len());
            }
        }
        while self.runs.len() > 2 {
            self.merged.clear();
            let mut bounds = vec![0];
            let mut k = 0;
            while k + 1 < self.runs.len() {
                let (s0, s1) = (self.runs[k], self.runs[k + 1]);
                let s2 = self.runs.get(k + 2).copied().unwrap_or(s1);
                let (mut x, mut y) = (s0, s1);
                while x < s1 && y < s2 {
                    if self.scratch[y] < self.scratch[x] {
                        self.merged.push(self.scratch[y]);
                        y += 1;
                    } else {
                        self.merged.push(self.scratch[x]);
                        x += 1;
                    }
                }
                self.merged.extend_from_slice(&self.scratch[x..s1]);
                self.merged.extend_from_slice(&self.scratch[y..s2]);
                bounds.push(self.merged.len());
                k += 2;
            }
            std::mem::swap(&mut self.scratch, &mut self.merged);
            self.runs = bounds;
        }
    }

    /// The offset `fit` chooses for item `i` (which is not placed yet).
    pub fn choose(&mut self, i: usize, fit: Fit) -> u64 {
        let (lo, hi) = (self.lo[i], self.hi[i]);
        let (size, align) = (self.items[i].size, self.items[i].align);
        let mut gaps = Gaps::new(size, align, fit);
        let (b0, b1) = (
            (lo >> self.shift) as usize,
            ((hi - 1) >> self.shift) as usize,
        );
        if b0 == b1 {
            // One block: its list is already in offset order.
            for e in &self.blocks[b0] {
                if e.lo < hi && lo < e.hi && gaps.next(e.off, e.end) {
                    break;
                }
            }
        } else {
            self.occupied(i);
            for &(s, e) in &self.scratch {
                if gaps.next(s, e) {
                    break;
                }
            }
        }
        gaps.finish()
    }

    /// Records item `i` at `offset`.
    pub fn put(&mut self, i: usize, offset: u64) {
        self.offsets[i] = offset;
        self.height = self.height.max(offset + self.items[i].size);
        let (b0, b1) = (
            (self.lo[i] >> self.shift) as usize,
            ((self.hi[i] - 1) >> self.shift) as usize,
        );
        let e = Entry {
            off: offset,
            end: offset + self.items[i].size,
            lo: self.lo[i],
            hi: self.hi[i],
        };
        for b in b0..=b1 {
            let v = &mut self.blocks[b];
            let pos = v.partition_point(|x| x.off < offset);
            v.insert(pos, e);
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
    place_racing(items, sections, order, fit, &AtomicU64::new(cutoff))
}

/// [`place_in_order`] with a cutoff that other threads may lower while it runs
/// (the best height found so far, minus one).
pub(crate) fn place_racing(
    items: &[Item],
    sections: &Sections,
    order: &[usize],
    fit: Fit,
    cutoff: &AtomicU64,
) -> Option<(Vec<u64>, u64)> {
    let mut p = Placer::new(items, sections);
    for &i in order {
        p.place(i, fit);
        if p.height > cutoff.load(Ordering::Relaxed) {
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
