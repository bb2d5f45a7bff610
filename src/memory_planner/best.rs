//! The default strategy: the best plan the planner can find in the time limit.
//!
//! It works in stages and stops at the first one that ends the question:
//!
//! 1. **A first plan**, made whatever the time limit, so that there always is
//!    one: greedy by size on problems of up to 1,000 items (on most real
//!    segments it reaches the lower bound, which proves it optimal; this keeps
//!    the engine's common case in tens of microseconds), the `O(n log n)` linear
//!    scan on larger ones (a million buffers in well under a second).
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
//! Every stage after the first stops at the deadline: a run of the portfolio or
//! of the repair looks at the clock every few hundred items and gives up, and
//! the smallest plan found by then is returned ([`Report`] says whether that
//! happened). The orders that matter most on real traces (breadth, section
//! total then lifetime, size) run first.
//!
//! With more than one thread, which of two equally good plans is returned can
//! differ from run to run (threads race); the arena of the portfolio stage does
//! not (unless the time limit cut it short), and every plan is validated.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use rayon::prelude::*;

use super::greedy::{breadth_order_with, heaviest_section, linear_scan, section_loads, size_order};
use super::instance::{Item, Sections};
use super::place::{place_in_order, place_racing, Fit, Stopped};
use super::search::{search, Graph, Outcome};

/// Problems with at most this many items get the exact search.
const EXACT_MAX: usize = 4000;
/// ... and at most this many (item, section) pairs.
const INCIDENCE_MAX: u64 = 20_000_000;
/// Problems with at most this many items count as small.
const SMALL: usize = 1000;

/// What a run of `best` did: for the logs, and for tests that must not time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// The time limit cut a phase short (or kept it from starting): the plan is
    /// the best one found by then.
    pub stopped_at_limit: bool,
    /// Greedy placements (portfolio and repair) started.
    pub runs_started: usize,
    /// ... and run to the end.
    pub runs_completed: usize,
}

fn height(items: &[Item], offsets: &[u64]) -> u64 {
    items
        .iter()
        .zip(offsets)
        .map(|(it, &o)| o + it.size)
        .max()
        .unwrap_or(0)
}

/// The names of the portfolio's orders, the most useful first.
const ORDERS: [&str; 8] = [
    "breadth",
    "total-width",
    "size",
    "total-size",
    "area",
    "width",
    "width-area-total",
    "total-width-area",
];

/// The portfolio order `name` (one of [`ORDERS`]). `heavy` is every item's
/// heaviest section, computed by the first order that needs it.
fn order(
    name: &str,
    items: &[Item],
    sections: &Sections,
    heavy: &OnceLock<Vec<(u64, u32)>>,
) -> Vec<usize> {
    let heavy = || {
        heavy.get_or_init(|| {
            let loads = section_loads(items, sections);
            heaviest_section(items, sections, &loads)
        })
    };
    if name == "breadth" {
        return breadth_order_with(items, heavy());
    }
    let w = |i: usize| (items[i].upper - items[i].lower) as u128;
    let z = |i: usize| items[i].size as u128;
    let by = |key: &dyn Fn(usize) -> (u128, u128, u128)| {
        let mut o: Vec<usize> = (0..items.len()).collect();
        o.sort_unstable_by_key(|&i| (std::cmp::Reverse(key(i)), i));
        o
    };
    match name {
        "size" => by(&|i| (z(i), w(i), 0)),
        "area" => by(&|i| (w(i) * z(i), z(i), 0)),
        "width" => by(&|i| (w(i), z(i), 0)),
        _ => {
            let h = heavy();
            let t = |i: usize| h[i].0 as u128;
            match name {
                "total-width" => by(&|i| (t(i), w(i), z(i))),
                "total-size" => by(&|i| (t(i), z(i), w(i))),
                "width-area-total" => by(&|i| (w(i), w(i) * z(i), t(i))),
                _ => by(&|i| (t(i), w(i), w(i) * z(i))),
            }
        }
    }
}

/// Improves a plan of a large problem by re-running the placement with the
/// items at the top of the arena (and then wider and wider bands below it) moved
/// to the front of the order, keeping every order that lowers the arena. Every
/// run stops at the deadline.
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
    report: &mut Report,
) {
    let mut order = order.to_vec();
    let mut band = 0;
    const BANDS: [u64; 5] = [0, 8, 4, 2, 1];
    let mut tries = 0;
    while band < BANDS.len() && tries < 12 && *best_h > target {
        if Instant::now() >= deadline {
            report.stopped_at_limit = true;
            return;
        }
        tries += 1;
        let h = *best_h;
        // Band 0: only the items that touch the top; then the top 1/8, 1/4,
        // 1/2 and all of the gap between the lower bound and the arena.
        let floor = (h - target).checked_div(BANDS[band]).map_or(h, |d| h - d);
        let hot = |i: usize| best[i] + items[i].size >= floor;
        let mut next: Vec<usize> = order.iter().copied().filter(|&i| hot(i)).collect();
        next.extend(order.iter().copied().filter(|&i| !hot(i)));
        let t0 = Instant::now();
        report.runs_started += 1;
        let cutoff = AtomicU64::new(h - 1);
        let r = place_racing(items, sections, &next, fit, &cutoff, Some(deadline));
        log::trace!(
            "plan repair: band {band}, height {:?} (was {h}) in {:?}",
            r.as_ref().map(|r| r.1),
            t0.elapsed()
        );
        match r {
            Ok((offs, nh)) => {
                report.runs_completed += 1;
                *best = offs;
                *best_h = nh;
                order = next;
                band = 0;
            }
            Err(Stopped::Cutoff) => band += 1,
            Err(Stopped::Deadline) => {
                report.stopped_at_limit = true;
                return;
            }
        }
    }
}

/// The plan `best` starts from, however early its deadline: greedy by size on
/// small problems (tens of microseconds), the `O(n log n)` linear scan on large
/// ones (greedy placement is superlinear, and minutes on a million buffers).
fn first_plan(items: &[Item], sections: &Sections) -> Vec<u64> {
    if items.len() <= SMALL {
        if let Some((offs, _)) =
            place_in_order(items, sections, &size_order(items), Fit::Best, u64::MAX)
        {
            return offs;
        }
    }
    linear_scan(items)
}

/// The portfolio's winner: offsets, height, and the run that made them.
type Winner = Option<(Vec<u64>, u64, usize, Vec<usize>)>;

/// Offsets per item for the `best` strategy, and what it did. Every phase stops
/// at `deadline` and the best plan found by then is returned; the first plan
/// ([`first_plan`]) is made even when the deadline has already passed.
pub(crate) fn solve(
    items: &[Item],
    sections: &Sections,
    lb: u64,
    capacity: Option<u64>,
    deadline: Instant,
    threads: usize,
) -> (Vec<u64>, Report) {
    let n = items.len();
    let mut report = Report::default();
    let target = capacity.unwrap_or(lb).max(lb);
    let threads_asked = threads;
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |p| p.get())
    } else {
        threads
    };
    // 1. A first plan.
    let mut best = first_plan(items, sections);
    let mut best_h = height(items, &best);
    if best_h <= target {
        return (best, report);
    }
    // 2. Portfolio, raced: every run stops once it is above the best height
    // found, all stop once one reaches the target, and all stop at the
    // deadline. On small problems the first plan is greedy by size, a
    // placement like the runs, so they must beat it; on large ones it is a
    // linear scan, which the portfolio and repair work apart from.
    let start_cutoff = if n <= SMALL { best_h - 1 } else { u64::MAX };
    // Best fit for every order first, then first fit on problems of moderate size.
    let runs: Vec<(&str, Fit)> = [Fit::Best, Fit::First]
        .into_iter()
        .filter(|&f| f == Fit::Best || n <= SMALL * 4)
        .flat_map(|f| ORDERS.iter().map(move |&name| (name, f)))
        .collect();
    let heavy = OnceLock::new();
    let cutoff = AtomicU64::new(start_cutoff);
    let winner = parking_lot::Mutex::new(None as Winner);
    let started = AtomicUsize::new(0);
    let completed = AtomicUsize::new(0);
    let late = AtomicBool::new(false);
    let run = |(k, &(name, f)): (usize, &(&str, Fit))| {
        if cutoff.load(Ordering::Relaxed) < target {
            return; // someone reached the target
        }
        if Instant::now() >= deadline {
            late.store(true, Ordering::Relaxed);
            return;
        }
        started.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        let o = order(name, items, sections, &heavy);
        let r = place_racing(items, sections, &o, f, &cutoff, Some(deadline));
        log::trace!(
            "plan portfolio: order {name}, {f:?} fit: height {:?} in {:?}",
            r.as_ref().map(|r| r.1),
            t0.elapsed()
        );
        match r {
            Ok((offs, h)) => {
                completed.fetch_add(1, Ordering::Relaxed);
                let mut w = winner.lock();
                if w.as_ref().is_none_or(|w| h < w.1) {
                    cutoff.fetch_min(h.saturating_sub(1), Ordering::Relaxed);
                    *w = Some((offs, h, k, o));
                }
            }
            Err(Stopped::Cutoff) => {}
            Err(Stopped::Deadline) => late.store(true, Ordering::Relaxed),
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
    report.runs_started = started.into_inner();
    report.runs_completed = completed.into_inner();
    report.stopped_at_limit = late.into_inner();
    let mut winner = winner.into_inner();
    log::trace!(
        "plan best: first plan height {best_h}, portfolio height {:?}, lower bound {lb}",
        winner.as_ref().map(|w| w.1)
    );
    if let Some((offs, ..)) = winner.take_if(|w| w.1 <= target) {
        return (offs, report);
    }
    // 3. Repair (large problems) or exact search.
    let fine = (n <= EXACT_MAX && Instant::now() < deadline)
        .then(|| Sections::elementary(items))
        .filter(|f| {
            // The search keeps every item's section list: skip it when that
            // would be huge (thousands of long-lived items over thousands of steps).
            let incidence: u64 = (0..n).map(|i| u64::from(f.hi[i] - f.lo[i])).sum();
            incidence <= INCIDENCE_MAX
        });
    let Some(fine) = fine else {
        if let Some((mut offs, mut h, k, o)) = winner {
            if h > target {
                let (_, fit) = runs[k];
                repair(
                    items,
                    sections,
                    &o,
                    fit,
                    lb,
                    deadline,
                    &mut offs,
                    &mut h,
                    &mut report,
                );
            }
            if h < best_h {
                best = offs;
            }
        }
        if n <= EXACT_MAX && Instant::now() >= deadline {
            report.stopped_at_limit = true;
        }
        return (best, report);
    };
    if let Some((offs, h, _, _)) = winner {
        if h < best_h {
            (best, best_h) = (offs, h);
        }
    }
    if best_h <= target {
        return (best, report);
    }
    let g = Graph::new(items, &fine);
    let cancel = AtomicBool::new(false);
    let attempt = |cap: u64, until: Instant, report: &mut Report| {
        let outcome = search(&g, cap, threads, until, &cancel);
        if outcome == Outcome::Aborted && Instant::now() >= deadline {
            report.stopped_at_limit = true;
        }
        outcome
    };
    if capacity.is_some() {
        // A short try at the lower bound first: when it works, the plan is
        // optimal, not merely within the capacity.
        if target > lb {
            let now = Instant::now();
            let slice = (deadline.saturating_duration_since(now) / 40)
                .min(std::time::Duration::from_millis(100));
            if let Outcome::Found(offs) = attempt(lb, now + slice, &mut report) {
                return (offs, report);
            }
        }
        if let Outcome::Found(offs) = attempt(target, deadline, &mut report) {
            return (offs, report);
        }
        return (best, report);
    }
    // Minimize: the lower bound first, then bisect.
    let mut lo = lb;
    let mut hi = best_h - 1;
    while lo <= hi {
        let now = Instant::now();
        if now >= deadline {
            report.stopped_at_limit = true;
            break;
        }
        let mid = if lo == lb { lb } else { lo + (hi - lo) / 2 };
        let slice = if lo == lb {
            (deadline - now) / 2
        } else {
            (deadline - now) / 3
        };
        match attempt(mid, now + slice, &mut report) {
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
    (best, report)
}

#[cfg(test)]
mod tests {
    use super::super::check::validate_valid;
    use super::super::problem::{Buffer, Problem};
    use super::super::{Placement, Strategy};
    use super::*;

    /// Random items shaped like a model trace: program order, mostly short
    /// lives, a few long ones.
    fn trace(n: usize, seed: u64) -> Vec<Item> {
        let mut rng = super::super::testutil::Lcg(seed);
        let mut below = move |m: u64| rng.below(m);
        (0..n as u64)
            .map(|k| {
                let lower = k / 2;
                let width = match below(100) {
                    0..=79 => 1 + below(4),
                    80..=97 => 4 + below(40),
                    _ => 40 + below(n as u64 / 4 + 1),
                };
                Item {
                    lower,
                    upper: lower + width,
                    size: 64 << below(10),
                    align: 64,
                }
            })
            .collect()
    }

    /// Checks `offsets` with the validator, the items taken as buffers.
    fn check(items: &[Item], offsets: Vec<u64>) {
        let p = Problem::new(
            items
                .iter()
                .enumerate()
                .map(|(id, it)| Buffer {
                    id,
                    lower: it.lower,
                    upper: it.upper,
                    size: it.size,
                    alignment: it.align,
                })
                .collect(),
        );
        let plan = Placement {
            arena: height(items, &offsets),
            offsets,
            lower_bound: 0,
            strategy: Strategy::Best,
        };
        validate_valid(&p, &plan).unwrap();
    }

    /// A seed for which greedy by size does not reach the lower bound.
    const SEED_600: u64 = 3;

    #[test]
    fn an_expired_deadline_still_gives_a_valid_plan_and_says_so() {
        // Small (greedy by size first) and large (linear scan first). Before
        // the deadline bounded every phase, three portfolio runs went ahead
        // past it, and on a million buffers each took tens of seconds.
        for (n, seed) in [(600, SEED_600), (20_000, 1)] {
            let items = trace(n, seed);
            let s = Sections::new(&items);
            let lb = super::super::greedy::section_loads(&items, &s)
                .into_iter()
                .max()
                .unwrap_or(0);
            let (offsets, report) = solve(&items, &s, lb, None, Instant::now(), 2);
            let h = height(&items, &offsets);
            assert!(h > lb, "n {n}: the first plan must not be optimal here");
            assert!(report.stopped_at_limit, "n {n}: {report:?}");
            assert_eq!(report.runs_started, 0, "n {n}: {report:?}");
            check(&items, offsets);
        }
    }

    #[test]
    fn with_time_the_portfolio_runs() {
        let items = trace(3000, 5);
        let s = Sections::new(&items);
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        let (offsets, report) = solve(&items, &s, 0, Some(u64::MAX / 2), deadline, 1);
        // The capacity is met by the first plan: nothing else runs.
        assert_eq!(report, Report::default());
        check(&items, offsets);
        let lb = super::super::greedy::section_loads(&items, &s)
            .into_iter()
            .max()
            .unwrap_or(0);
        let cap = Some(lb + lb / 4);
        let (offsets, report) = solve(&items, &s, lb, cap, deadline, 1);
        assert!(!report.stopped_at_limit, "{report:?}");
        check(&items, offsets);
    }
}
