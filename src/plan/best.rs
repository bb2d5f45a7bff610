//! The default strategy: the best plan the planner can find in the time limit.
//!
//! It works in stages and stops at the first one that ends the question:
//!
//! 1. **Greedy by size** alone. On most real segments it reaches the lower bound,
//!    which proves it optimal; this keeps the common small case in microseconds.
//! 2. **A portfolio of greedy placements**: several orders (size, breadth, area,
//!    lifetime, section total) with best-fit and first-fit gaps, raced on all
//!    cores. The smallest arena wins.
//! 3. **Exact search** ([`search`](super::search)) for problems small enough for
//!    it: with a capacity, a plan within it; without, first the lower bound, then
//!    a bisection between the lower bound and the best arena known, each attempt
//!    time-boxed.
//! 4. **Local search** for large problems (see [`improve`](super::improve)).
//!
//! The result is never worse than greedy by size.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use rayon::prelude::*;

use super::greedy::{breadth_order, size_order};
use super::instance::{Item, Sections};
use super::place::{place_in_order, Fit};
use super::search::{search, Graph, Outcome};

/// Problems with at most this many items get the exact search.
const EXACT_MAX: usize = 4000;

fn height(items: &[Item], offsets: &[u64]) -> u64 {
    items
        .iter()
        .zip(offsets)
        .map(|(it, &o)| o + it.size)
        .max()
        .unwrap_or(0)
}

/// Orders for the portfolio, by name.
fn orders(items: &[Item], sections: &Sections, g: Option<&Graph<'_>>) -> Vec<Vec<usize>> {
    let mut out = vec![size_order(items), breadth_order(items, sections)];
    let n = items.len();
    let mut by = |key: &dyn Fn(&Item) -> (u128, u128)| {
        let mut o: Vec<usize> = (0..n).collect();
        o.sort_by_key(|&i| (std::cmp::Reverse(key(&items[i])), i));
        out.push(o);
    };
    by(&|it| {
        (
            (it.upper - it.lower) as u128 * it.size as u128,
            it.size as u128,
        )
    });
    by(&|it| ((it.upper - it.lower) as u128, it.size as u128));
    if let Some(g) = g {
        for p in ["TWA", "WAT"] {
            out.push(g.preorder(p).into_iter().map(|i| i as usize).collect());
        }
    }
    out
}

/// Offsets per item for the `best` strategy.
pub(crate) fn solve(
    items: &[Item],
    lb: u64,
    capacity: Option<u64>,
    deadline: Instant,
    threads: usize,
) -> Vec<u64> {
    let n = items.len();
    let sections = Sections::new(items);
    let target = capacity.unwrap_or(lb).max(lb);
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |p| p.get())
    } else {
        threads
    };
    // 1. Greedy by size.
    let first = size_order(items);
    let (mut best, mut best_h) =
        place_in_order(items, &sections, &first, Fit::Best, u64::MAX).unwrap_or((vec![0; n], 0));
    if best_h <= target {
        return best;
    }
    // 2. Portfolio.
    let fine = Sections::elementary(items);
    let graph = (n <= EXACT_MAX).then(|| Graph::new(items, &fine));
    let orders = orders(items, &sections, graph.as_ref());
    let runs: Vec<(Vec<usize>, Fit)> = orders
        .into_iter()
        .flat_map(|o| [(o.clone(), Fit::Best), (o, Fit::First)])
        .skip(1) // size order with best fit was stage 1
        .collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
    let run = |(o, f): &(Vec<usize>, Fit)| place_in_order(items, &sections, o, *f, best_h);
    let results: Vec<Option<(Vec<u64>, u64)>> = match &pool {
        Ok(pool) => pool.install(|| runs.par_iter().map(run).collect()),
        Err(_) => runs.iter().map(run).collect(),
    };
    for (offs, h) in results.into_iter().flatten() {
        if h < best_h {
            best = offs;
            best_h = h;
        }
    }
    log::trace!("plan best: portfolio height {best_h}, lower bound {lb}");
    if best_h <= target {
        return best;
    }
    // 3. Exact search.
    if let Some(g) = &graph {
        let cancel = AtomicBool::new(false);
        if capacity.is_some() {
            if let Outcome::Found(offs) = search(g, target, threads, deadline, &cancel) {
                return offs;
            }
            return best;
        }
        // Minimize: the lower bound first, then bisect.
        let mut lo = lb;
        let mut hi = best_h - 1;
        while lo <= hi {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let mid = if lo == lb { lb } else { lo + (hi - lo) / 2 };
            let slice = if lo == lb {
                (deadline - now) / 2
            } else {
                (deadline - now) / 3
            };
            match search(g, mid, threads, now + slice, &cancel) {
                Outcome::Found(offs) => {
                    let h = height(items, &offs);
                    best = offs;
                    best_h = h;
                    if h == lb {
                        break;
                    }
                    hi = h - 1;
                }
                Outcome::Infeasible | Outcome::Aborted => lo = mid + 1,
            }
        }
        return best;
    }
    best
}
