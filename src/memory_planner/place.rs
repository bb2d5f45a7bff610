//! Placing items one at a time at the best (or first) gap: the engine of the
//! greedy strategies.
//!
//! Greedy by size, greedy by breadth and the orders tried by the `best` strategy
//! all do the same thing: take the items in some order, and put each one into
//! the gap among the already placed items *that meet it in time* that fits it
//! best (the smallest gap it fits in, lowest offset on ties), or on top of them
//! when no gap fits. Only the order differs. [`Placer`] does that step fast.
//!
//! Only the *union* of the byte ranges of the placed items that meet an item
//! matters for its gaps, and items are never removed, so [`Placer`] keeps unions.
//! It lays a segment tree over time (in sections, see
//! [`super::instance::Sections`]). A placed item is recorded at the
//! O(log S) nodes whose ranges tile its lifetime (its *own* nodes), and its byte
//! range is added to two kinds of union: `own[v]`, the items recorded at node
//! `v`, and `sub[v]`, the items recorded at `v` or below it. The items meeting a
//! time range are then exactly those in `sub` of the nodes tiling the range plus
//! those in `own` of the nodes above them that stick out of the range; merging
//! those few unions (each a sorted list of disjoint byte ranges, usually short:
//! over a long range everything is packed solid) gives the gaps in one pass.
//! The naive way (look at every placed item) is quadratic, and so was scanning
//! every item of a block of time, which made greedy by size take minutes on a
//! million buffers with long-lived ones among them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::instance::{align_up, Item, Sections};

/// How to choose among the gaps an item fits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// The smallest gap (lowest offset on ties): TFLite's greedy by size.
    Best,
    /// The lowest gap.
    First,
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

/// Adds the byte range `s..e` to `set`, a list of disjoint ranges in offset
/// order, merging it with the ranges it overlaps or touches.
fn add(set: &mut Vec<(u64, u64)>, s: u64, e: u64) {
    let k = set.partition_point(|r| r.1 < s);
    let j = set.partition_point(|r| r.0 <= e);
    if k == j {
        set.insert(k, (s, e));
    } else {
        set[k] = (set[k].0.min(s), set[j - 1].1.max(e));
        set.drain(k + 1..j);
    }
}

/// Incremental placement of items at gaps among placed items that meet them.
pub(crate) struct Placer<'a> {
    items: &'a [Item],
    lo: &'a [u32],
    hi: &'a [u32],
    /// Leaves of the segment tree (a power of two, at least the section count).
    leaves: usize,
    /// `own[v]`: union of the items recorded at internal node `v`.
    own: Vec<Vec<(u64, u64)>>,
    /// `sub[v]`: union of the items recorded at node `v` or below it.
    sub: Vec<Vec<(u64, u64)>>,
    /// Offset of every placed item (`u64::MAX` until placed).
    pub offsets: Vec<u64>,
    /// The highest end of any placed item.
    pub height: u64,
    scratch: Vec<(u64, u64)>,
    merged: Vec<(u64, u64)>,
    runs: Vec<usize>,
    bounds: Vec<usize>,
    tiles: Vec<usize>,
    above: Vec<usize>,
}

/// The tree nodes for the section range `lo..hi` of a tree with `leaves`
/// leaves: `tiles` those whose ranges tile it, `above` those above them whose
/// ranges stick out of it (each once).
fn nodes(leaves: usize, lo: usize, hi: usize, tiles: &mut Vec<usize>, above: &mut Vec<usize>) {
    tiles.clear();
    above.clear();
    let (mut l, mut r) = (lo + leaves, hi + leaves);
    while l < r {
        if l & 1 == 1 {
            tiles.push(l);
            l += 1;
        }
        if r & 1 == 1 {
            r -= 1;
            tiles.push(r);
        }
        l >>= 1;
        r >>= 1;
    }
    // Every node above a tile lies on the path from leaf lo or leaf hi - 1 to
    // the root, and sticks out of lo..hi; path nodes inside it are tiles or below.
    let (mut a, mut b) = ((lo + leaves) >> 1, (hi - 1 + leaves) >> 1);
    let mut h = 1;
    while a >= 1 {
        for v in if a == b { [a, 0] } else { [a, b] } {
            if v != 0 && ((v << h) - leaves < lo || ((v + 1) << h) - leaves > hi) {
                above.push(v);
            }
        }
        a >>= 1;
        b >>= 1;
        h += 1;
    }
}

impl<'a> Placer<'a> {
    pub(super) fn new(items: &'a [Item], sections: &'a Sections) -> Placer<'a> {
        let leaves = sections.count.next_power_of_two();
        Placer {
            items,
            lo: &sections.lo,
            hi: &sections.hi,
            leaves,
            own: vec![Vec::new(); leaves],
            sub: vec![Vec::new(); 2 * leaves],
            offsets: vec![u64::MAX; items.len()],
            height: 0,
            scratch: Vec::new(),
            merged: Vec::new(),
            runs: Vec::new(),
            bounds: Vec::new(),
            tiles: Vec::new(),
            above: Vec::new(),
        }
    }

    /// The offset `fit` chooses for item `i` (which is not placed yet).
    pub(super) fn choose(&mut self, i: usize, fit: Fit) -> u64 {
        let (lo, hi) = (self.lo[i] as usize, self.hi[i] as usize);
        nodes(self.leaves, lo, hi, &mut self.tiles, &mut self.above);
        self.scratch.clear();
        self.runs.clear();
        self.runs.push(0);
        let lists = self.tiles.iter().map(|&v| &self.sub[v]);
        for list in lists.chain(self.above.iter().map(|&v| &self.own[v])) {
            if !list.is_empty() {
                self.scratch.extend_from_slice(list);
                self.runs.push(self.scratch.len());
            }
        }
        self.merge_runs();
        let mut gaps = Gaps::new(self.items[i].size, self.items[i].align, fit);
        for &(s, e) in &self.scratch {
            if gaps.next(s, e) {
                break;
            }
        }
        gaps.finish()
    }

    /// Sorts `scratch` by offset: it holds sorted runs (ending at the offsets
    /// in `runs`), merged pairwise until one is left.
    fn merge_runs(&mut self) {
        while self.runs.len() > 2 {
            self.merged.clear();
            self.bounds.clear();
            self.bounds.push(0);
            for pair in self.runs[..].windows(2).step_by(2).map(|w| (w[0], w[1])) {
                let (s0, s1) = pair;
                let s2 = self.runs.get(self.bounds.len() * 2).copied().unwrap_or(s1);
                let (a, b) = (&self.scratch[s0..s1], &self.scratch[s1..s2]);
                let (mut x, mut y) = (0, 0);
                while x < a.len() && y < b.len() {
                    if b[y].0 < a[x].0 {
                        self.merged.push(b[y]);
                        y += 1;
                    } else {
                        self.merged.push(a[x]);
                        x += 1;
                    }
                }
                self.merged.extend_from_slice(&a[x..]);
                self.merged.extend_from_slice(&b[y..]);
                self.bounds.push(self.merged.len());
            }
            std::mem::swap(&mut self.scratch, &mut self.merged);
            std::mem::swap(&mut self.runs, &mut self.bounds);
        }
    }

    /// Records item `i` at `offset`.
    pub(super) fn put(&mut self, i: usize, offset: u64) {
        self.offsets[i] = offset;
        let end = offset + self.items[i].size;
        self.height = self.height.max(end);
        let (lo, hi) = (self.lo[i] as usize, self.hi[i] as usize);
        nodes(self.leaves, lo, hi, &mut self.tiles, &mut self.above);
        for &v in &self.tiles {
            if v < self.leaves {
                add(&mut self.own[v], offset, end);
            }
            add(&mut self.sub[v], offset, end);
        }
        for &v in &self.above {
            add(&mut self.sub[v], offset, end);
        }
    }

    /// Places item `i` where `fit` says and returns its offset.
    pub(super) fn place(&mut self, i: usize, fit: Fit) -> u64 {
        let off = self.choose(i, fit);
        self.put(i, off);
        off
    }
}

/// Why [`place_racing`] gave up before placing every item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// The height went above the cutoff: this order cannot win.
    Cutoff,
    /// The deadline passed.
    Deadline,
}

/// Items placed between two looks at the clock.
const CLOCK_EVERY: usize = 256;

/// Places all items in `order` with `fit`; returns the offsets (by item) and the
/// arena height. Stops early and returns `None` once the height exceeds `cutoff`.
pub(crate) fn place_in_order(
    items: &[Item],
    sections: &Sections,
    order: &[usize],
    fit: Fit,
    cutoff: u64,
) -> Option<(Vec<u64>, u64)> {
    place_racing(items, sections, order, fit, &AtomicU64::new(cutoff), None).ok()
}

/// [`place_in_order`] with a cutoff that other threads may lower while it runs
/// (the best height found so far, minus one), and a deadline (looked at before
/// the first item and every few hundred after) past which it gives up.
pub(crate) fn place_racing(
    items: &[Item],
    sections: &Sections,
    order: &[usize],
    fit: Fit,
    cutoff: &AtomicU64,
    deadline: Option<Instant>,
) -> Result<(Vec<u64>, u64), Stopped> {
    let mut p = Placer::new(items, sections);
    for (k, &i) in order.iter().enumerate() {
        if k % CLOCK_EVERY == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Stopped::Deadline);
        }
        p.place(i, fit);
        if p.height > cutoff.load(Ordering::Relaxed) {
            return Err(Stopped::Cutoff);
        }
    }
    Ok((p.offsets, p.height))
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

    /// Random items: mostly short lives, some long ones, mixed alignments.
    fn random_items(seed: u64, n: usize, steps: u64) -> Vec<Item> {
        let mut rng = super::super::testutil::Lcg(seed);
        let mut below = move |m: u64| rng.below(m);
        (0..n)
            .map(|_| {
                let lower = below(steps);
                let width = if below(5) == 0 {
                    1 + below(steps)
                } else {
                    1 + below(4)
                };
                Item {
                    lower,
                    upper: lower + width,
                    size: 1 + below(40),
                    align: [1, 1, 2, 8][below(4) as usize],
                }
            })
            .collect()
    }

    /// The offset `fit` chooses, found the slow way: the union of the byte
    /// ranges of every placed item that meets `i` in time, then its gaps.
    fn slow_choice(items: &[Item], offsets: &[u64], i: usize, fit: Fit) -> u64 {
        let it = items[i];
        let mut ranges: Vec<(u64, u64)> = (0..items.len())
            .filter(|&j| offsets[j] != u64::MAX)
            .filter(|&j| items[j].lower < it.upper && it.lower < items[j].upper)
            .map(|j| (offsets[j], offsets[j] + items[j].size))
            .collect();
        ranges.sort_unstable();
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        let mut reach = 0;
        for (s, e) in ranges {
            let start = align_up(reach, it.align);
            if s > reach && start + it.size <= s && best.is_none_or(|b| s - reach < b.0) {
                best = Some((s - reach, start));
                if fit == Fit::First {
                    break;
                }
            }
            reach = reach.max(e);
        }
        best.map_or(align_up(reach, it.align), |b| b.1)
    }

    #[test]
    fn placer_matches_a_scan_of_every_placed_item() {
        for seed in 0..40 {
            let items = random_items(seed, 120, 30 + seed * 7);
            let s = Sections::new(&items);
            for fit in [Fit::Best, Fit::First] {
                let mut p = Placer::new(&items, &s);
                // A scrambled order, different for each seed.
                let order: Vec<usize> = (0..items.len())
                    .map(|k| (k * 37 + seed as usize) % items.len())
                    .collect();
                for &i in &order {
                    let want = slow_choice(&items, &p.offsets, i, fit);
                    assert_eq!(p.place(i, fit), want, "seed {seed}, {fit:?}, item {i}");
                }
            }
        }
    }

    #[test]
    fn an_expired_deadline_stops_a_placement() {
        let items = random_items(3, 2 * CLOCK_EVERY, 500);
        let s = Sections::new(&items);
        let order: Vec<usize> = (0..items.len()).collect();
        let cutoff = AtomicU64::new(u64::MAX);
        let past = Some(Instant::now());
        for n in [1, items.len()] {
            let r = place_racing(&items, &s, &order[..n], Fit::Best, &cutoff, past);
            assert_eq!(r.err(), Some(Stopped::Deadline));
        }
        let r = place_racing(&items, &s, &order, Fit::Best, &cutoff, None);
        assert!(r.is_ok());
    }
}
