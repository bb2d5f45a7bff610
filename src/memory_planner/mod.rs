//! Static memory planning: give every buffer of a program an offset in one arena.
//!
//! # The problem
//!
//! A [`Problem`] is a list of [`Buffer`]s, each with a size, an alignment and a
//! half-open lifetime `[lower, upper)` in steps. A plan gives each buffer an
//! offset so that two buffers live at the same step never share a byte. The
//! arena is the highest byte any buffer reaches; the planner makes it as small as
//! it can. Seen as geometry, every buffer is a rectangle (time × bytes) that may
//! slide only up and down, and the planner packs them into the lowest strip. This
//! is the Dynamic Storage Allocation problem, NP-hard in general, but real traces
//! are usually solved to optimality or very close to it.
//!
//! Two numbers say how good a plan is. The **lower bound** ([`lower_bound`]) is the
//! largest sum of sizes live at one step: no arena can be smaller. The **ratio**
//! ([`Placement::ratio`]) is arena ÷ lower bound; a plan with ratio 1 is provably
//! optimal, and the `best` strategy stops the moment it finds one.
//!
//! Views ([`Alias`]) and in-place pairs ([`InPlace`]) let buffers share bytes on
//! purpose; see [`problem`](self::Problem) for their rules.
//!
//! # Strategies
//!
//! [`Strategy`] names them; [`solve`] runs one:
//!
//! | name | what it does |
//! | --- | --- |
//! | `naive` | no reuse: each buffer after the previous one |
//! | `linear-scan` | a free list walked in time order, best fit |
//! | `greedy-size` | largest first, best-fitting gap (TFLite, Pisarchyk & Lee 2020) |
//! | `greedy-breadth` | busiest step first, then largest first (same paper) |
//! | `best` | the default: a race of orders and fits, then an exact search |
//!
//! `best` first makes a cheap plan (greedy by size on small problems, the linear
//! scan on large ones), then runs a portfolio of greedy placements in several
//! orders raced on all cores, and keeps the smallest arena. If that is above
//! the lower bound (or above the capacity asked for), it improves the winner
//! (large problems) or, on problems of at most a few thousand buffers, runs a
//! branch and bound over *canonical* solutions in the style of MiniMalloc
//! (Moffitt, ASPLOS 2023) until the plan is provably optimal, fits the
//! capacity, or the time limit ends. The time limit bounds every phase after
//! the cheap plan, which is `O(n log n)` (a million buffers in well under a
//! second), so a plan always comes back.
//!
//! # Symbolic sizes
//!
//! A `SymProblem` has sizes that are expressions of symbols (`TDim`: sums of
//! products, `4·s0·s1 + 64`). A `SymPlacement` decides a placement order once and gives
//! offsets for any values of the symbols in one linear pass, planning again (and
//! keeping both orders) only where a value makes the kept orders worse than
//! `symbolic::SLACK` × that value's lower bound; see the module `symbolic`.
//!
//! # Checking
//!
//! Every plan [`solve`] returns has passed [`validate`], an independent sweep that
//! checks alignment, views and that no two live buffers share a byte. A plan that
//! fails it is reported as [`PlanError::InvalidPlan`]: a bug, never a silent
//! overlap.
//!
//! # Pictures
//!
//! [`svg`](fn@svg) draws a plan as an SVG of offsets against time (one rectangle per buffer,
//! the lower bound, the arena and the peak marked); `streamfuse-plan INPUT.csv --svg
//! plan.svg` writes one for a trace.
//!
//! # Example
//!
//! ```
//! use streamfuse::memory_planner::{self as plan, Buffer, Options, Problem};
//! // x and z never live together, y meets both.
//! let p = Problem::new(vec![
//!     Buffer::new(0, 0, 2, 64), // x
//!     Buffer::new(1, 1, 4, 32), // y
//!     Buffer::new(2, 2, 4, 64), // z
//! ]);
//! let plan = plan::solve(&p, &Options::default()).unwrap();
//! assert_eq!(plan.arena, 96);
//! assert_eq!(plan.offsets[0], plan.offsets[2]); // z reuses x's bytes
//! assert_eq!(plan.ratio(), 1.0);
//! ```

mod best;
mod check;
pub mod csv;
mod error;
mod greedy;
pub mod groups;
mod instance;
mod place;
mod problem;
mod search;
mod svg;
pub(crate) mod symbolic;

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

pub use check::{lower_bound, profile, validate};
pub use error::PlanError;
pub use problem::{Alias, Buffer, InPlace, Problem};
pub use svg::{svg, write_svg, SvgOptions};
pub(crate) use symbolic::{SymBuffer, SymPlacement, SymProblem, TDim};

use instance::{Instance, Sections};

/// A way of computing a plan. `FromStr` and `Display` use the names below.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// `naive`: no reuse, buffers one after the other.
    Naive,
    /// `linear-scan`: a time-ordered free list with best fit.
    LinearScan,
    /// `greedy-size`: largest first into the best-fitting gap.
    GreedySize,
    /// `greedy-breadth`: busiest step first, then largest first.
    GreedyBreadth,
    /// `best`: the smallest arena the planner can find within the time limit.
    #[default]
    Best,
}

impl Strategy {
    /// All strategies.
    pub const ALL: [Strategy; 5] = [
        Strategy::Naive,
        Strategy::LinearScan,
        Strategy::GreedySize,
        Strategy::GreedyBreadth,
        Strategy::Best,
    ];
    /// Their names, in the order of [`Strategy::ALL`].
    pub const NAMES: [&'static str; 5] = [
        "naive",
        "linear-scan",
        "greedy-size",
        "greedy-breadth",
        "best",
    ];

    /// The name of the strategy.
    pub fn name(self) -> &'static str {
        Strategy::NAMES[Strategy::ALL.iter().position(|&s| s == self).unwrap_or(4)]
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Strategy, PlanError> {
        Strategy::NAMES
            .iter()
            .position(|&n| n == s)
            .map(|k| Strategy::ALL[k])
            .ok_or_else(|| PlanError::UnknownStrategy {
                name: s.to_string(),
            })
    }
}

/// How to plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Which strategy to run.
    pub strategy: Strategy,
    /// How long `best` may plan, counted from the call to [`solve`]: every phase
    /// stops at it and the best plan found so far is returned (its first, cheap
    /// plan is made however short the limit). It stops earlier when the plan is
    /// provably optimal or fits the capacity. The greedy strategies ignore it.
    pub time_limit: Duration,
    /// The largest acceptable arena; overrides [`Problem::capacity`]. A plan above
    /// it is returned as [`PlanError::CapacityExceeded`].
    pub capacity: Option<u64>,
    /// Threads `best` may use; 0 means one per core (rayon's global pool for the
    /// portfolio).
    pub threads: usize,
}

impl Default for Options {
    /// `best`, one second, no capacity, all cores.
    fn default() -> Options {
        Options {
            strategy: Strategy::Best,
            time_limit: Duration::from_secs(1),
            capacity: None,
            threads: 0,
        }
    }
}

/// The answer: an offset for every buffer and the arena they fit in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Offset of each buffer, in the order of [`Problem::buffers`].
    pub offsets: Vec<u64>,
    /// Bytes the arena must have: the highest end of any buffer.
    pub arena: u64,
    /// The largest sum of sizes live at one step ([`lower_bound`]).
    pub lower_bound: u64,
    /// The strategy that made the plan.
    pub strategy: Strategy,
}

impl Placement {
    /// Arena ÷ lower bound: 1.0 is optimal (1.0 also for an empty problem).
    pub fn ratio(&self) -> f64 {
        ratio(self.arena, self.lower_bound)
    }
}

impl fmt::Display for Placement {
    /// One summary line, then `buffer index: offset` lines (the first 64).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plan ({}): {} buffers, arena {} bytes, lower bound {}, ratio {:.4}",
            self.strategy,
            self.offsets.len(),
            self.arena,
            self.lower_bound,
            self.ratio()
        )?;
        for (i, off) in self.offsets.iter().enumerate().take(64) {
            write!(f, "\n  buffer {i}: offset {off}")?;
        }
        if self.offsets.len() > 64 {
            write!(f, "\n  ... {} more", self.offsets.len() - 64)?;
        }
        Ok(())
    }
}

/// `arena ÷ lower_bound`, 1.0 for an empty problem.
pub(crate) fn ratio(arena: u64, lower_bound: u64) -> f64 {
    if lower_bound == 0 {
        1.0
    } else {
        arena as f64 / lower_bound as f64
    }
}

/// Plans `problem` with `options`.
///
/// Validates the problem first (errors name the buffer, alias or pair), runs the
/// strategy, checks the result with [`validate`], and returns
/// [`PlanError::CapacityExceeded`] if the arena is above the capacity (from
/// `options`, else from the problem).
pub fn solve(problem: &Problem, options: &Options) -> Result<Placement, PlanError> {
    let start = Instant::now();
    let inst = Instance::new(problem)?;
    let capacity = options.capacity.or(problem.capacity);
    let items = &inst.items;
    // The peak load is reached in a section (a maximal set of items live together).
    let sections = Sections::new(items);
    let lb = greedy::section_loads(items, &sections)
        .into_iter()
        .max()
        .unwrap_or(0);
    let item_offsets = match options.strategy {
        Strategy::Naive => greedy::naive(items),
        Strategy::LinearScan => greedy::linear_scan(items),
        Strategy::GreedySize => greedy::greedy_size(items, &sections),
        Strategy::GreedyBreadth => greedy::greedy_breadth(items, &sections),
        Strategy::Best => {
            let deadline = start + options.time_limit;
            let (offsets, report) =
                best::solve(items, &sections, lb, capacity, deadline, options.threads);
            log::debug!("plan best: {report:?}");
            offsets
        }
    };
    let offsets: Vec<u64> = inst
        .map
        .iter()
        .map(|&(item, delta)| item_offsets[item] + delta)
        .collect();
    let arena = items
        .iter()
        .zip(&item_offsets)
        .map(|(it, &o)| o + it.size)
        .max()
        .unwrap_or(0);
    let plan = Placement {
        offsets,
        arena,
        lower_bound: lb,
        strategy: options.strategy,
    };
    check::validate_valid(problem, &plan).map_err(|e| match e {
        PlanError::InvalidPlan { message } => PlanError::InvalidPlan {
            message: format!(
                "strategy {} produced a bad plan (a bug): {message}",
                options.strategy
            ),
        },
        other => other,
    })?;
    log::trace!(
        "plan: {} buffers, strategy {}, arena {}, lower bound {}, {:?}",
        problem.buffers.len(),
        options.strategy,
        arena,
        lb,
        start.elapsed()
    );
    match capacity {
        Some(c) if arena > c => Err(PlanError::CapacityExceeded {
            capacity: c,
            best_arena: arena,
            lower_bound: lb,
        }),
        _ => Ok(plan),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.to_string().parse::<Strategy>().unwrap(), s);
        }
        let e = "fast".parse::<Strategy>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown strategy \"fast\"; valid strategies: naive, linear-scan, greedy-size, greedy-breadth, best"
        );
    }

    #[test]
    fn every_strategy_plans_the_minimalloc_example() {
        // benchmarks/examples/input.12.csv of google/minimalloc: optimum 12.
        let p = Problem::new(vec![
            Buffer::new(0, 0, 3, 4),
            Buffer::new(1, 3, 9, 4),
            Buffer::new(2, 0, 9, 4),
            Buffer::new(3, 9, 21, 4),
            Buffer::new(4, 0, 21, 4),
        ]);
        for s in Strategy::ALL {
            let plan = solve(
                &p,
                &Options {
                    strategy: s,
                    ..Options::default()
                },
            )
            .unwrap();
            assert!(plan.arena >= 12);
            if s != Strategy::Naive {
                assert_eq!(plan.arena, 12, "{s}");
            }
        }
    }

    #[test]
    fn capacity_miss_is_its_own_error() {
        let p = Problem::new(vec![Buffer::new(0, 0, 3, 4), Buffer::new(1, 0, 3, 4)]);
        let o = Options {
            capacity: Some(7),
            ..Options::default()
        };
        assert!(matches!(
            solve(&p, &o),
            Err(PlanError::CapacityExceeded { capacity: 7, .. })
        ));
        let o = Options {
            capacity: Some(8),
            ..Options::default()
        };
        assert_eq!(solve(&p, &o).unwrap().arena, 8);
    }

    #[test]
    fn empty_problem() {
        let plan = solve(&Problem::default(), &Options::default()).unwrap();
        assert_eq!((plan.arena, plan.lower_bound, plan.ratio()), (0, 0, 1.0));
    }
}

/// Helpers shared by the planner's unit tests.
#[cfg(test)]
pub(crate) mod testutil {
    /// A small deterministic generator (tests need no extra crates).
    pub(crate) struct Lcg(pub u64);

    impl Lcg {
        /// A number below `n`.
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }
}
