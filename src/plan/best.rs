//! The default strategy: the best plan the planner can find in the time limit.
//!
//! It works in stages and stops at the first one that ends the question:
//!
//! 1. **Greedy by size** alone (problems of up to 1,000 items). On most real
//!    segments it reaches the lower bound, which proves it optimal; this keeps
//!    the engine's common case in tens of microseconds.
//! 2. **A portfolio of greedy placements**: several orders (size, breadth, area,
//!    lifetime, section total) with best-fit and first-fit gaps, raced on all
//!    cores. The smallest arena wins.
//! 3. **Repair**: the winning order is re-run with the items at the top of the
//!    arena moved to its front (then the items in wider and wider bands below
//!    the top), keeping every order that lowers the arena, for at most a dozen
//!    runs or until the time limit. On pangu 2.6B this takes the portfolio's
//!    1.0076 to the lower bound; on S_1, 1.0026 to 1.0010. It is the last word on
//!    large problems.
//! 4. **Exact search** ([`search`](super::search)) for problems of up to 4,000
//!    items: with a capacity, a short try at the lower bound and then a plan
//!    within the capacity; without, first the lower bound, then a bisection
//!    between the lower bound and the best arena known, each attempt time-boxed.
//!
//! The three portfolio orders that matter most on real traces (breadth, section
//! total then lifetime, size) always run, even past the time limit; the rest run
//! while time remains. So the result is never worse than greedy by size.
//!
//! With more than one thread, which of two equally good plans is returned can
//! differ from run to run (threads race); the arena of the portfolio stage does
//! not (unless the time limit cut it short), and every plan is validated.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use super::greedy::{breadth_order, heaviest_section, section_loads, size_order};
use super::instance::{Item, Sections};
use super::place::{place_in_order, place_racing, Fit};
use super::search::{search, Graph, Outcome};

/// Problems with at most this many items get the exact search.
const EXACT_MAX: usize = 4000;
/// ... and at most this many (item, section) pairs.
const INCIDENCE_MAX: u64 = 20_000_000;
/// Problems with at most this many items count as small.
const SMALL: usize = 1000;

fn height(items: &[Item], offsets: &[u64]) -> u64 {
    items
        .iter()
        .zip(offsets)
        .map(|(it, &o)| o + it.size)
        .max()
        .unwrap_or(0)
}

/// Orders for the portfolio, each with a name for the logs.
fn orders(items: &[Item], sections: &Sections) -> Vec<(&'static str, Vec<usize>)> {
    let n = items.len();
    let loads = section_loads(items, sections);
    let heavy = heaviest_section(items, sections, &loads);
    let mut out = vec![("breadth", breadth_order(items, sections))];
    type Key<'k> = &'k dyn Fn(usize) -> (u128, u128, u128);
    let mut by = |name: &'static str, key: Key<'_>| {
        let mut o: Vec<usize> = (0..n).collect();
        o.sort_by_key(|&i| (std::cmp::Reverse(key(i)), i));
        out.push((name, o));
    };
    let w = |i: usize| (items[i].upper - items[i].lower) as u128;
    let z = |i: usize| items[i].size as u128;
    let t = |i: usize| heavy[i].0 as u128;
    by("total-width", &|i| (t(i), w(i), z(i)));
    by("size", &|i| (z(i), w(i), 0));
    by("total-size", &|i| (t(i), z(i), w(i)));
    by("area", &|i| (w(i) * z(i), z(i), 0));
    by("width", &|i| (w(i), z(i), 0));
    by("width-area-total", &|i| (w(i), w(i) * z(i), t(i)));
    by("total-width-area", &|i| (t(i), w(i), w(i) * z(i)));
    out
}

/// Improves a plan of a large problem by re-running the placement with the
/// items at the top of the arena (and then wider and wider bands below it) moved
/// to the front of the order, keeping every order that lowers the arena.
#[allow(clippy::too_many_arguments)]
fn repair(
    items: &[Item],
    sections: &Sections,
    order: &[usize],
    fit: Fit,
    target: u64,
    deadline: Instant,
    best: &mut Vec<u64>,
    best_h: &mut u64,
) {
    let mut order = order.to_vec();
    let mut band = 0;
    const BANDS: [u64; 5] = [0, 8, 4, 2, 1];
    let mut tries = 0;
    while band < BANDS.len() && tries < 12 && Instant::now() < deadline && *best_h > target {
        tries += 1;
        let h = *best_h;
        // Band 0: only the items that touch the top; then the top 1/8, 1/4,
        // 1/2 and all of the gap between the lower bound and the arena.
        let floor = (h - target).checked_div(BANDS[band]).map_or(h, |d| h - d);
        let hot = |i: usize| best[i] + items[i].size >= floor;
        let mut next: Vec<usize> = order.iter().copied().filter(|&i| hot(i)).collect();
        next.extend(order.iter().copied().filter(|&i| !hot(i)));
        let t0 = Instant::now();
        let r = place_in_order(items, sections, &next, fit, h - 1);
        log::trace!(
            "plan repair: band {band}, height {:?} (was {h}) in {:?}",
            r.as_ref().map(|r| r.1),
            t0.elapsed()
        );
        match r {
            Some((offs, nh)) => {
                *best = offs;
                *best_h = nh;
                order = next;
                band = 0;
            }
            None => band += 1,
        }
    }
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
    let threads_asked = threads;
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |p| p.get())
    } else {
        threads
    };
    // 1. Greedy by size alone on small problems: the engine's common case.
    let mut best: Vec<u64> = vec![0; n];
    let mut best_h = u64::MAX;
    if n <= SMALL {
        let first = size_order(items);
        if let Some((offs, h)) = place_in_order(items, &sections, &first, Fit::Best, u64::MAX) {
            if h <= target {
                return offs;
            }
            (best, best_h) = (offs, h);
        }
    }
    // 2. Portfolio, raced: every run stops once it is above the best height
    // found, and all stop once one reaches the target.
    let orders = orders(items, &sections);
    // Best fit for every order first, then first fit on problems of moderate size.
    let runs: Vec<(&str, &Vec<usize>, Fit)> = [Fit::Best, Fit::First]
        .into_iter()
        .filter(|&f| f == Fit::Best || n <= SMALL * 4)
        .flat_map(|f| orders.iter().map(move |(name, o)| (*name, o, f)))
        .collect();
    let started = AtomicU64::new(0);
    let cutoff = AtomicU64::new(best_h.saturating_sub(1));
    let winner = parking_lot::Mutex::new(None::<(Vec<u64>, u64, usize)>);
    let run = |(k, &(name, o, f)): (usize, &(&str, &Vec<usize>, Fit))| {
        if cutoff.load(Ordering::Relaxed) < target {
            return; // someone reached the target
        }
        // Past the deadline, only the first three runs go ahead.
        if started.fetch_add(1, Ordering::Relaxed) >= 3 && Instant::now() >= deadline {
            return;
        }
        let t0 = Instant::now();
        let r = place_racing(items, &sections, o, f, &cutoff);
        log::trace!(
            "plan portfolio: order {name}, {f:?} fit: height {:?} in {:?}",
            r.as_ref().map(|r| r.1),
            t0.elapsed()
        );
        if let Some((offs, h)) = r {
            let mut w = winner.lock();
            if w.as_ref().is_none_or(|w| h < w.1) {
                cutoff.fetch_min(h.saturating_sub(1), Ordering::Relaxed);
                *w = Some((offs, h, k));
            }
        }
    };
    if n <= SMALL || threads == 1 {
        runs.iter().enumerate().for_each(run);
    } else {
        // The first order (breadth) alone: on real traces it often reaches the
        // lower bound, and then nothing else needs to run. Then the rest, raced.
        run((0, &runs[0]));
        let rest = || {
            runs.par_iter()
                .enumerate()
                .skip(1)
                .with_max_len(1)
                .for_each(run)
        };
        if threads_asked == 0 {
            rest();
        } else {
            match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
                Ok(pool) => pool.install(rest),
                Err(_) => runs.iter().enumerate().skip(1).for_each(run),
            }
        }
    }
    let mut won = None;
    if let Some((offs, h, k)) = winner.into_inner() {
        if h < best_h {
            (best, best_h) = (offs, h);
            won = Some(k);
        }
    }
    log::trace!("plan best: portfolio height {best_h}, lower bound {lb}");
    if best_h <= target {
        return best;
    }
    // 3. Exact search.
    let fine = (n <= EXACT_MAX)
        .then(|| Sections::elementary(items))
        .filter(|f| {
            // The search keeps every item's section list: skip it when that
            // would be huge (thousands of long-lived items over thousands of steps).
            let incidence: u64 = (0..n).map(|i| u64::from(f.hi[i] - f.lo[i])).sum();
            incidence <= INCIDENCE_MAX
        });
    let graph = fine.as_ref().map(|f| Graph::new(items, f));
    if graph.is_none() {
        if let Some(k) = won {
            let (_, order, fit) = runs[k];
            repair(
                items,
                &sections,
                order,
                fit,
                lb,
                deadline,
                &mut best,
                &mut best_h,
            );
        }
        return best;
    }
    if let Some(g) = &graph {
        let cancel = AtomicBool::new(false);
        if capacity.is_some() {
            // A short try at the lower bound first: when it works, the plan is
            // optimal, not merely within the capacity.
            if target > lb {
                let now = Instant::now();
                let slice = (deadline.saturating_duration_since(now) / 40)
                    .min(std::time::Duration::from_millis(100));
                if let Outcome::Found(offs) = search(g, lb, threads, now + slice, &cancel) {
                    return offs;
                }
            }
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
                    log::trace!(
                        "plan best: exact search found height {h} (cap {mid}, lower bound {lb})"
                    );
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
