//! The normalized form every strategy works on.
//!
//! Strategies do not see aliases or in-place pairs. [`Instance::new`] validates a
//! [`Problem`] and folds those relations away:
//!
//! * every view is replaced by its root source (the buffer at the end of the view
//!   chain), whose lifetime grows to cover the view's and whose alignment grows to
//!   cover the view's (the view's byte offset inside the root is a multiple of the
//!   view's alignment, so aligning the root aligns the view);
//! * in-place pairs are merged into one *item* (same offset, lifetime the union,
//!   size the larger of the two) when that does not raise the peak of live bytes.
//!   Pairs of equal size are always merged: that only ever removes load.
//!
//! What is left is a list of [`Item`]s, plain rectangles in (time × bytes), and a
//! map from each buffer to its item and its byte offset inside it. The lower bound
//! and the profile are computed on items, so they count a merged in-place pair once.
//!
//! The constructor also checks that the sum of all sizes plus alignments fits in
//! `u64`; every offset any strategy computes is below that sum, so no arithmetic
//! after this point can overflow.

use super::error::PlanError;
use super::problem::Problem;

/// A rectangle to place: `size` bytes at a multiple of `align`, live over
/// `lower..upper`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Item {
    pub lower: u64,
    pub upper: u64,
    pub size: u64,
    pub align: u64,
}

impl Item {
    /// True when the two lifetimes share a step.
    #[cfg(test)]
    pub(super) fn meets(&self, other: &Item) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }
}

/// A validated problem reduced to rectangles.
#[derive(Clone, Debug)]
pub(crate) struct Instance {
    pub items: Vec<Item>,
    /// For each buffer of the problem: its item and its byte offset in the item.
    pub map: Vec<(usize, u64)>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Least common multiple, `None` on overflow.
pub(crate) fn lcm(a: u64, b: u64) -> Option<u64> {
    (a / gcd(a, b)).checked_mul(b)
}

/// Rounds `x` up to a multiple of `a` (`a > 0`). Callers guarantee no overflow.
#[inline]
pub(crate) fn align_up(x: u64, a: u64) -> u64 {
    if a <= 1 {
        x
    } else {
        x.div_ceil(a) * a
    }
}

struct UnionFind(Vec<usize>);

impl UnionFind {
    fn find(&mut self, mut x: usize) -> usize {
        while self.0[x] != x {
            self.0[x] = self.0[self.0[x]];
            x = self.0[x];
        }
        x
    }
    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.0[b] = a;
        }
    }
}

impl Instance {
    /// Validates `problem` and normalizes it.
    pub(super) fn new(problem: &Problem) -> Result<Instance, PlanError> {
        let bufs = &problem.buffers;
        let n = bufs.len();
        // Views first: which buffers are views, of what.
        let mut view_of: Vec<Option<(usize, u64, usize)>> = vec![None; n];
        for (entry, a) in problem.aliases.iter().enumerate() {
            for index in [a.view, a.source] {
                if index >= n {
                    return Err(PlanError::NoSuchBuffer {
                        relation: "alias",
                        entry,
                        index,
                    });
                }
            }
            if view_of[a.view].is_some() {
                return Err(PlanError::BadAlias {
                    entry,
                    message: format!(
                        "buffer {} (id {}) is already declared a view",
                        a.view, bufs[a.view].id
                    ),
                });
            }
            let (v, s) = (&bufs[a.view], &bufs[a.source]);
            let end = a.offset.checked_add(v.size);
            if end.is_none_or(|end| end > s.size) {
                return Err(PlanError::BadAlias {
                    entry,
                    message: format!(
                        "view buffer {} (id {}) of {} bytes at byte {} does not fit in source buffer {} (id {}) of {} bytes",
                        a.view, v.id, v.size, a.offset, a.source, s.id, s.size
                    ),
                });
            }
            view_of[a.view] = Some((a.source, a.offset, entry));
        }
        for (index, b) in bufs.iter().enumerate() {
            if b.upper <= b.lower {
                return Err(PlanError::EmptyLifetime {
                    index,
                    id: b.id,
                    lower: b.lower,
                    upper: b.upper,
                });
            }
            if b.alignment == 0 {
                return Err(PlanError::ZeroAlignment { index, id: b.id });
            }
            if b.size == 0 && view_of[index].is_none() {
                return Err(PlanError::ZeroSize { index, id: b.id });
            }
        }
        // Resolve every buffer to (root, offset in root), detecting cycles.
        const UNSEEN: u8 = 0;
        const ON_PATH: u8 = 1;
        const DONE: u8 = 2;
        let mut state = vec![UNSEEN; n];
        let mut root: Vec<(usize, u64)> = (0..n).map(|i| (i, 0)).collect();
        let mut path = Vec::new();
        for start in 0..n {
            let mut cur = start;
            while state[cur] == UNSEEN {
                state[cur] = ON_PATH;
                path.push(cur);
                match view_of[cur] {
                    Some((src, _, _)) => cur = src,
                    None => break,
                }
            }
            if state[cur] == ON_PATH && view_of[cur].is_some() {
                return Err(PlanError::AliasCycle {
                    index: cur,
                    id: bufs[cur].id,
                });
            }
            // Unwind the path from its end: each node's root is its source's root.
            while let Some(v) = path.pop() {
                if let Some((src, off, entry)) = view_of[v] {
                    let (r, o) = root[src];
                    let total = o.checked_add(off).ok_or_else(|| PlanError::Overflow {
                        context: format!("offset of view buffer {v} (id {})", bufs[v].id),
                    })?;
                    if total % bufs[v].alignment != 0 {
                        return Err(PlanError::BadAlias {
                            entry,
                            message: format!(
                                "view buffer {v} (id {}) would sit at byte {total} of its root buffer {r}, not a multiple of its alignment {}",
                                bufs[v].id, bufs[v].alignment
                            ),
                        });
                    }
                    root[v] = (r, total);
                }
                state[v] = DONE;
            }
        }
        // Roots with lifetimes and alignments extended by their views.
        let mut ext: Vec<(u64, u64, u64)> = bufs
            .iter()
            .map(|b| (b.lower, b.upper, b.alignment))
            .collect();
        for v in 0..n {
            let (r, _) = root[v];
            if r != v {
                let b = &bufs[v];
                let e = &mut ext[r];
                e.0 = e.0.min(b.lower);
                e.1 = e.1.max(b.upper);
                e.2 = lcm(e.2, b.alignment).ok_or_else(|| PlanError::Overflow {
                    context: format!("alignment of buffer {r} (id {}) with its views", bufs[r].id),
                })?;
            }
        }
        // In-place pairs.
        let mut is_input = vec![false; n];
        let mut is_output = vec![false; n];
        let mut pairs = Vec::new();
        for (entry, p) in problem.in_place.iter().enumerate() {
            for index in [p.input, p.output] {
                if index >= n {
                    return Err(PlanError::NoSuchBuffer {
                        relation: "in-place pair",
                        entry,
                        index,
                    });
                }
            }
            let bad = |message: String| Err(PlanError::BadInPlace { entry, message });
            if p.input == p.output {
                return bad(format!("buffer {} is both input and output", p.input));
            }
            for (what, i) in [("input", p.input), ("output", p.output)] {
                if root[i].0 != i {
                    return bad(format!("{what} buffer {i} (id {}) is a view", bufs[i].id));
                }
            }
            if std::mem::replace(&mut is_input[p.input], true) {
                return bad(format!(
                    "buffer {} (id {}) is the input of two pairs",
                    p.input, bufs[p.input].id
                ));
            }
            if std::mem::replace(&mut is_output[p.output], true) {
                return bad(format!(
                    "buffer {} (id {}) is the output of two pairs",
                    p.output, bufs[p.output].id
                ));
            }
            let (i_up, o_low) = (ext[p.input].1, ext[p.output].0);
            if i_up == o_low {
                continue; // never live together: nothing to do
            }
            if i_up != o_low + 1 {
                return bad(format!(
                    "input buffer {} (id {}) is live until step {} but output buffer {} (id {}) is born at step {}: the input must die at the step the output is born",
                    p.input, bufs[p.input].id, i_up, p.output, bufs[p.output].id, o_low
                ));
            }
            pairs.push((p.input, p.output));
        }
        // Overflow guard: everything placed end to end must fit in u64.
        let mut total: u64 = 0;
        for (i, b) in bufs.iter().enumerate() {
            if root[i].0 == i {
                total = total
                    .checked_add(b.size)
                    .and_then(|t| t.checked_add(ext[i].2))
                    .ok_or_else(|| PlanError::Overflow {
                        context: format!("sum of sizes up to buffer {i} (id {})", b.id),
                    })?;
            }
        }
        let build = |merge: &dyn Fn(usize, usize) -> bool| -> Result<Instance, PlanError> {
            let mut uf = UnionFind((0..n).collect());
            for &(a, b) in &pairs {
                if merge(a, b) {
                    uf.union(a, b);
                }
            }
            let mut item_of = vec![usize::MAX; n];
            let mut items: Vec<Item> = Vec::new();
            for i in 0..n {
                if root[i].0 != i {
                    continue;
                }
                let g = uf.find(i);
                let (lo, up, al) = ext[i];
                if item_of[g] == usize::MAX {
                    item_of[g] = items.len();
                    items.push(Item {
                        lower: lo,
                        upper: up,
                        size: bufs[i].size,
                        align: al,
                    });
                } else {
                    let it = &mut items[item_of[g]];
                    it.lower = it.lower.min(lo);
                    it.upper = it.upper.max(up);
                    it.size = it.size.max(bufs[i].size);
                    it.align = lcm(it.align, al).ok_or_else(|| PlanError::Overflow {
                        context: format!("alignment of in-place group of buffer {i}"),
                    })?;
                }
                item_of[i] = item_of[g];
            }
            let map = (0..n)
                .map(|i| {
                    let (r, off) = root[i];
                    (item_of[uf.find(r)], off)
                })
                .collect();
            Ok(Instance { items, map })
        };
        let equal = build(&|a, b| bufs[a].size == bufs[b].size)?;
        if pairs.iter().all(|&(a, b)| bufs[a].size == bufs[b].size) {
            return Ok(equal);
        }
        let all = build(&|_, _| true)?;
        if peak(&all.items) <= peak(&equal.items) {
            Ok(all)
        } else {
            Ok(equal)
        }
    }
}

/// Live bytes after each step at which the load changes, in step order.
pub(crate) fn load_profile(items: &[Item]) -> Vec<(u64, u64)> {
    let mut ev: Vec<(u64, bool, u64)> = Vec::with_capacity(items.len() * 2);
    for it in items {
        ev.push((it.lower, true, it.size));
        ev.push((it.upper, false, it.size));
    }
    ev.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut live: u64 = 0;
    for (t, start, s) in ev {
        if start {
            live += s;
        } else {
            live -= s;
        }
        match out.last_mut() {
            Some(last) if last.0 == t => last.1 = live,
            _ => out.push((t, live)),
        }
    }
    out
}

/// The largest sum of sizes live at one step.
pub(crate) fn peak(items: &[Item]) -> u64 {
    load_profile(items).iter().map(|p| p.1).max().unwrap_or(0)
}

/// The lifetimes of `items` compressed onto *sections*: the maximal sets of
/// items live together (maximal cliques of the interval graph), in time order.
/// Item `i` is live in sections `lo[i]..hi[i]`. Two items meet in time if and only
/// if their section ranges intersect, and the peak load is reached in a section,
/// so sections are all the time resolution a planner needs.
#[derive(Clone, Debug)]
pub(crate) struct Sections {
    pub lo: Vec<u32>,
    pub hi: Vec<u32>,
    pub count: usize,
}

impl Sections {
    pub(super) fn new(items: &[Item]) -> Sections {
        let n = items.len();
        // (time, is_start, item): ends sort before starts at the same time.
        let mut ev: Vec<(u64, bool, u32)> = Vec::with_capacity(2 * n);
        for (i, it) in items.iter().enumerate() {
            ev.push((it.lower, true, i as u32));
            ev.push((it.upper, false, i as u32));
        }
        ev.sort_unstable();
        let mut lo = vec![0u32; n];
        let mut hi = vec![0u32; n];
        let mut count: u32 = 0;
        let mut open = false;
        for (_, start, i) in ev {
            if start {
                lo[i as usize] = count;
                open = true;
            } else {
                if open {
                    count += 1;
                    open = false;
                }
                hi[i as usize] = count;
            }
        }
        Sections {
            lo,
            hi,
            count: count as usize,
        }
    }
}

impl Sections {
    /// Elementary sections: one per interval between consecutive distinct
    /// lifetime endpoints. More of them than maximal cliques, but each holds
    /// fewer items, which makes the exact search's section bounds sharper.
    pub(super) fn elementary(items: &[Item]) -> Sections {
        let mut pts: Vec<u64> = items.iter().flat_map(|it| [it.lower, it.upper]).collect();
        pts.sort_unstable();
        pts.dedup();
        let idx = |t: u64| pts.partition_point(|&p| p < t) as u32;
        Sections {
            lo: items.iter().map(|it| idx(it.lower)).collect(),
            hi: items.iter().map(|it| idx(it.upper)).collect(),
            count: pts.len().saturating_sub(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::problem::{Alias, Buffer, InPlace};
    use super::*;

    #[test]
    fn sections_are_maximal_cliques() {
        let items: Vec<Item> = [(0, 4), (1, 2), (2, 3), (5, 6)]
            .iter()
            .map(|&(lower, upper)| Item {
                lower,
                upper,
                size: 1,
                align: 1,
            })
            .collect();
        let s = Sections::new(&items);
        assert_eq!(s.count, 3);
        assert_eq!((s.lo[0], s.hi[0]), (0, 2));
        assert_eq!((s.lo[1], s.hi[1]), (0, 1));
        assert_eq!((s.lo[2], s.hi[2]), (1, 2));
        assert_eq!((s.lo[3], s.hi[3]), (2, 3));
    }

    #[test]
    fn views_fold_into_their_root() {
        let mut p = Problem::new(vec![
            Buffer::new(0, 0, 2, 64),
            Buffer::new(1, 1, 5, 16),
            Buffer::new(2, 4, 9, 8),
        ]);
        p.aliases = vec![
            Alias {
                view: 2,
                source: 1,
                offset: 8,
            },
            Alias {
                view: 1,
                source: 0,
                offset: 32,
            },
        ];
        let inst = Instance::new(&p).unwrap();
        assert_eq!(inst.items.len(), 1);
        assert_eq!(inst.items[0].lower, 0);
        assert_eq!(inst.items[0].upper, 9);
        assert_eq!(inst.map, vec![(0, 0), (0, 32), (0, 40)]);
    }

    #[test]
    fn equal_in_place_pairs_merge() {
        let mut p = Problem::new(vec![Buffer::new(0, 0, 3, 8), Buffer::new(1, 2, 5, 8)]);
        p.in_place = vec![InPlace {
            input: 0,
            output: 1,
        }];
        let inst = Instance::new(&p).unwrap();
        assert_eq!(inst.items.len(), 1);
        assert_eq!(peak(&inst.items), 8);
    }
}
