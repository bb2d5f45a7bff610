//! Exact search: branch and bound over canonical solutions (after MiniMalloc).
//!
//! # Canonical solutions
//!
//! Take any plan and let the buffers fall: lower each, in order of offset, as far
//! as it goes without meeting a buffer below it. The arena does not grow, and
//! every buffer now rests on the floor or on top of a buffer it meets in time.
//! So it is enough to search plans built like this: repeatedly pick an unplaced
//! item and put it at its *minimum offset*, the highest top of the placed items
//! that meet it, with offsets never decreasing from one placement to the next.
//! Moffitt (MiniMalloc, ASPLOS 2023) calls these canonical solutions, and prunes
//! the search over them with a few rules, which this module implements:
//!
//! * **Canonical order.** Placements go in non-decreasing (offset, preorder rank),
//!   so each canonical solution is built in exactly one way.
//! * **Dominance.** An item is never placed at or above the lowest top any other
//!   unplaced item could have: that one would fit underneath, and the solution
//!   where it is placed first is searched anyway.
//! * **Monotonic floor and section inference.** Items live in the same
//!   [section](super::instance::Sections) all meet each other, so every unplaced
//!   item of a section must go above the section's *floor* (the highest placed
//!   top there, and the current offset). If floor + the unplaced sizes of the
//!   section exceed the capacity, no completion exists.
//! * **Release dates.** Sharper, for the sections where a minimum offset just
//!   rose: the unplaced items of a section form one stack, each item no lower
//!   than its minimum offset. That is one machine with release dates, whose
//!   shortest schedule is known: the largest of (release + sizes released at or
//!   after it). MiniMalloc uses the smallest release only; this bound is at least
//!   as strong, and is computed only when two O(n) bounds on it disagree.
//! * **Hatless pruning.** If the item just placed meets no unplaced item, placing
//!   another item first instead cannot help; when its subtree fails, the node fails.
//! * **Dynamic decomposition.** When no unplaced item crosses a section boundary
//!   any more, the two sides are independent problems, solved one after the
//!   other. Each part is re-ranked by the preorder with the section totals left
//!   in it (as MiniMalloc does when it solves a part on its own); on the
//!   challenging benchmarks this is what makes the hard cases fall.
//!
//! The order in which candidates are tried is a *preorder* (for example TWA:
//! largest section total, then longest lifetime, then largest area) with ties
//! broken by minimum offset. No single preorder is best everywhere, so
//! [`search`] runs several in round robin with a node limit that doubles each
//! round, split over threads, and the first that finishes wins. The cheap checks
//! run before the expensive ones, which matters more than anything else for
//! speed: most candidates fail, and a failed candidate costs only the range scan.
//!
//! This file is the driver (the race of preorders over threads); `graph` holds
//! the items' overlaps and sections and ranks them by a preorder, and `searcher`
//! is one depth-first search with its state and pruning.

mod graph;
mod searcher;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

pub(crate) use graph::Graph;
use searcher::{Searcher, Status};

/// What a search found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A plan within the capacity: offsets per item.
    Found(Vec<u64>),
    /// Proof that no plan fits the capacity.
    Infeasible,
    /// The time limit ended, or another thread won.
    Aborted,
}

/// Preorders tried by the search, split over threads: thread `t` of `k` takes
/// every `k`-th one.
pub(crate) const PREORDERS: [&str; 6] = ["TWA", "TAW", "WAT", "AWT", "WTA", "ATW"];

/// Searches for a plan of height at most `cap`, racing the preorders over
/// `threads` threads until one finds a plan or a proof, the deadline passes or
/// `cancel` is set.
pub(crate) fn search(
    g: &Graph<'_>,
    cap: u64,
    threads: usize,
    deadline: Instant,
    cancel: &AtomicBool,
) -> Outcome {
    let n = g.items.len();
    if n == 0 {
        return Outcome::Found(Vec::new());
    }
    let threads = threads.clamp(1, PREORDERS.len());
    let orders: Vec<(String, Vec<u32>)> = PREORDERS
        .iter()
        .map(|p| (p.to_string(), g.preorder(p)))
        .collect();
    let stop = AtomicBool::new(false);
    let result = parking_lot::Mutex::new(None::<Outcome>);
    let worker = |t: usize| {
        let mine: Vec<&(String, Vec<u32>)> = orders.iter().skip(t).step_by(threads).collect();
        let mut limit = (n as u64).max(64);
        loop {
            for (keys, order) in mine.iter().map(|x| (&x.0, &x.1)) {
                if stop.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed) {
                    return;
                }
                // A searcher under a small node limit may end before it looks
                // at the clock: look here too.
                if Instant::now() >= deadline {
                    stop.store(true, Ordering::Relaxed);
                    return;
                }
                let mut s = Searcher::new(g, keys, cap, order, deadline, &stop, cancel);
                let t0 = Instant::now();
                let status = s.run(limit);
                log::trace!(
                    "plan search: capacity {cap}, preorder {keys}, thread {t}, node limit {limit}: {} nodes in {:?}",
                    s.nodes,
                    t0.elapsed()
                );
                let outcome = match status {
                    Status::Found => {
                        let offs: Vec<u64> = s.solution.clone();
                        Outcome::Found(offs)
                    }
                    Status::NotFound => Outcome::Infeasible,
                    Status::Limit => continue,
                    Status::Stop => {
                        if Instant::now() >= deadline {
                            stop.store(true, Ordering::Relaxed);
                        }
                        return;
                    }
                };
                let mut r = result.lock();
                if r.is_none() {
                    *r = Some(outcome);
                }
                stop.store(true, Ordering::Relaxed);
                return;
            }
            limit = limit.saturating_mul(2);
        }
    };
    // Deep recursion (one frame per item): run every worker on a big stack.
    std::thread::scope(|scope| {
        let w = &worker;
        let spawned: Vec<bool> = (0..threads)
            .map(|t| {
                std::thread::Builder::new()
                    .stack_size((4 << 20) + 1024 * n)
                    .spawn_scoped(scope, move || w(t))
                    .is_ok()
            })
            .collect();
        for (t, ok) in spawned.into_iter().enumerate() {
            if !ok {
                w(t);
            }
        }
    });
    result.into_inner().unwrap_or(Outcome::Aborted)
}

#[cfg(test)]
mod tests {
    use super::super::instance::{Item, Sections};
    use super::super::place::{place_in_order, Fit};
    use super::*;
    use std::time::Duration;

    use super::super::testutil::Lcg;

    fn random_items(rng: &mut Lcg, n: usize) -> Vec<Item> {
        (0..n)
            .map(|_| {
                let lower = rng.below(8);
                let upper = lower + 1 + rng.below(6);
                let size = 1 + rng.below(9);
                let align = [1, 1, 1, 2, 4][rng.below(5) as usize];
                Item {
                    lower,
                    upper,
                    size,
                    align,
                }
            })
            .collect()
    }

    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut out = Vec::new();
        for p in permutations(n - 1) {
            for k in 0..=p.len() {
                let mut q = p.clone();
                q.insert(k, n - 1);
                out.push(q);
            }
        }
        out
    }

    /// The optimum by brute force: the lowest first-fit height over all orders.
    fn brute(items: &[Item]) -> u64 {
        let s = Sections::new(items);
        permutations(items.len())
            .iter()
            .filter_map(|o| place_in_order(items, &s, o, Fit::First, u64::MAX))
            .map(|r| r.1)
            .min()
            .unwrap_or(0)
    }

    #[test]
    fn exact_search_matches_brute_force() {
        let mut rng = Lcg(7);
        for case in 0..150 {
            let n = 1 + (case % 7);
            let items = random_items(&mut rng, n);
            let opt = brute(&items);
            let s = Sections::elementary(&items);
            let g = Graph::new(&items, &s);
            let deadline = Instant::now() + Duration::from_secs(10);
            let cancel = AtomicBool::new(false);
            match search(&g, opt, 2, deadline, &cancel) {
                Outcome::Found(offs) => {
                    for i in 0..n {
                        assert_eq!(offs[i] % items[i].align, 0);
                        assert!(offs[i] + items[i].size <= opt);
                        for j in 0..i {
                            if items[i].meets(&items[j]) {
                                assert!(
                                    offs[i] + items[i].size <= offs[j]
                                        || offs[j] + items[j].size <= offs[i],
                                    "case {case}: {items:?} {offs:?}"
                                );
                            }
                        }
                    }
                }
                other => panic!("case {case}: optimum {opt} not found: {other:?} {items:?}"),
            }
            assert_eq!(
                search(&g, opt - 1, 1, deadline, &cancel),
                Outcome::Infeasible,
                "case {case}: {items:?}"
            );
        }
    }
}
