//! Property tests of the memory planner: random problems checked by a validator
//! written independently of the crate's, bounds, and optimality on instances
//! small enough for brute force.

use std::time::Duration;

mod emulated;

use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use streamfuse::memory_planner::{
    self as plan, lower_bound, profile, Alias, Buffer, InPlace, Options, PlanError, Problem,
    Strategy,
};

/// An O(n²) validator that knows nothing of the planner: roots of views, their
/// extended lifetimes, in-place exemptions, alignment, arena bounds.
fn check(p: &Problem, plan: &plan::Placement) -> Result<(), String> {
    let n = p.buffers.len();
    if plan.offsets.len() != n {
        return Err("offset count".into());
    }
    let mut src = vec![None; n];
    for a in &p.aliases {
        src[a.view] = Some((a.source, a.offset));
    }
    for (i, b) in p.buffers.iter().enumerate() {
        let o = plan.offsets[i];
        if !o.is_multiple_of(b.alignment) {
            return Err(format!("buffer {i} misaligned"));
        }
        if o + b.size > plan.arena {
            return Err(format!("buffer {i} beyond arena"));
        }
        if let Some((s, off)) = src[i] {
            if plan.offsets[s] + off != o {
                return Err(format!("view {i} not at its source"));
            }
        }
    }
    let root = |mut i: usize| {
        while let Some((s, _)) = src[i] {
            i = s;
        }
        i
    };
    // Extended lifetime of each root.
    let mut life: Vec<(u64, u64)> = p.buffers.iter().map(|b| (b.lower, b.upper)).collect();
    for i in 0..n {
        let r = root(i);
        life[r].0 = life[r].0.min(p.buffers[i].lower);
        life[r].1 = life[r].1.max(p.buffers[i].upper);
    }
    let exempt = |i: usize, j: usize| {
        p.in_place.iter().any(|q| {
            ((q.input == i && q.output == j) || (q.input == j && q.output == i))
                && plan.offsets[i] == plan.offsets[j]
        })
    };
    for i in 0..n {
        if src[i].is_some() {
            continue;
        }
        for j in 0..i {
            if src[j].is_some() || exempt(i, j) {
                continue;
            }
            let time = life[i].0 < life[j].1 && life[j].0 < life[i].1;
            let (oi, oj) = (plan.offsets[i], plan.offsets[j]);
            let space = oi < oj + p.buffers[j].size && oj < oi + p.buffers[i].size;
            if time && space {
                return Err(format!("buffers {i} and {j} overlap"));
            }
        }
    }
    Ok(())
}

fn buffers(max: usize) -> impl proptest::strategy::Strategy<Value = Vec<Buffer>> {
    prop::collection::vec((0u64..20, 1u64..8, 1u64..200, 0usize..4), 0..max).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(id, (lower, len, size, a))| Buffer {
                id,
                lower,
                upper: lower + len,
                size,
                alignment: [1, 1, 8, 64][a],
            })
            .collect()
    })
}

fn opts(strategy: Strategy) -> Options {
    Options {
        strategy,
        time_limit: Duration::from_millis(200),
        ..Options::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_strategy_is_valid_and_bounded(bufs in buffers(40)) {
        let p = Problem::new(bufs);
        let lb = lower_bound(&p);
        let naive: u64 = p.buffers.iter().map(|b| b.size + b.alignment).sum();
        let mut greedy = u64::MAX;
        for s in Strategy::ALL {
            let plan = plan::solve(&p, &opts(s)).unwrap();
            check(&p, &plan).map_err(TestCaseError::fail)?;
            prop_assert!(plan.arena >= lb, "{s} below the lower bound");
            prop_assert!(plan.arena <= naive);
            prop_assert_eq!(plan.lower_bound, lb);
            if s == Strategy::GreedySize {
                greedy = plan.arena;
            }
            if s == Strategy::Best {
                prop_assert!(plan.arena <= greedy, "best worse than greedy-size");
            }
        }
    }

    #[test]
    fn views_and_in_place_pairs(bufs in buffers(24), picks in prop::collection::vec((0usize..24, 0usize..24, 0u64..4), 0..8)) {
        let mut p = Problem::new(bufs);
        let n = p.buffers.len();
        if n >= 2 {
            let mut is_view = vec![false; n];
            // By view position, so a source is final before its views are sized.
            let mut sorted: Vec<(usize, usize, u64)> = picks.iter().map(|&(a, b, k)| (a % n, b % n, k)).collect();
            sorted.sort();
            for &(v, s, k) in &sorted {
                // Views only point at earlier buffers: no cycles by construction.
                if v > s && !is_view[v] {
                    is_view[v] = true;
                    let sb = p.buffers[s];
                    let vb = &mut p.buffers[v];
                    vb.alignment = 1;
                    vb.size = (sb.size / 2).max(1).min(sb.size);
                    let offset = k.min(sb.size - vb.size);
                    p.aliases.push(Alias { view: v, source: s, offset });
                }
            }
            // One in-place pair between non-views, made legal by construction.
            if let Some(&(a, b, _)) = picks.first() {
                let (i, o) = (a % n, b % n);
                if i != o && !is_view[i] && !is_view[o] && !p.aliases.iter().any(|x| x.source == i || x.source == o) {
                    let up = p.buffers[i].upper;
                    p.buffers[o].lower = up - 1;
                    p.buffers[o].upper = p.buffers[o].upper.max(up);
                    p.buffers[o].size = p.buffers[i].size;
                    p.buffers[o].alignment = p.buffers[i].alignment;
                    p.in_place.push(InPlace { input: i, output: o });
                }
            }
        }
        let lb = lower_bound(&p);
        for s in Strategy::ALL {
            let plan = plan::solve(&p, &opts(s)).unwrap();
            check(&p, &plan).map_err(TestCaseError::fail)?;
            prop_assert!(plan.arena >= lb);
        }
        let peak = profile(&p).iter().map(|x| x.1).max().unwrap_or(0);
        prop_assert_eq!(peak, lb);
    }
}

/// All orders, each item at its lowest fitting offset: the optimum (every
/// optimal plan, compacted downwards in offset order, is one of these).
fn brute_force(p: &Problem) -> u64 {
    fn go(p: &Problem, placed: &mut Vec<(usize, u64)>, best: &mut u64) {
        let n = p.buffers.len();
        let height = placed
            .iter()
            .map(|&(i, o)| o + p.buffers[i].size)
            .max()
            .unwrap_or(0);
        if height >= *best {
            return;
        }
        if placed.len() == n {
            *best = height;
            return;
        }
        for i in 0..n {
            if placed.iter().any(|&(j, _)| j == i) {
                continue;
            }
            let b = p.buffers[i];
            let mut occ: Vec<(u64, u64)> = placed
                .iter()
                .filter(|&&(j, _)| b.overlaps_in_time(&p.buffers[j]))
                .map(|&(j, o)| (o, o + p.buffers[j].size))
                .collect();
            occ.sort();
            let mut off: u64 = 0;
            for (s, e) in occ {
                let cand = off.div_ceil(b.alignment) * b.alignment;
                if cand + b.size <= s {
                    break;
                }
                off = off.max(e);
            }
            let off = off.div_ceil(b.alignment) * b.alignment;
            placed.push((i, off));
            go(p, placed, best);
            placed.pop();
        }
    }
    let mut best = u64::MAX;
    go(p, &mut Vec::new(), &mut best);
    best
}

#[test]
fn best_is_optimal_on_small_random_instances() {
    let mut state = 12345u64;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    for case in 0..60 {
        let n = 2 + case % 6;
        let bufs: Vec<Buffer> = (0..n)
            .map(|id| {
                let lower = next(6);
                Buffer {
                    id,
                    lower,
                    upper: lower + 1 + next(5),
                    size: 1 + next(12),
                    alignment: [1, 2, 4][next(3) as usize],
                }
            })
            .collect();
        let p = Problem::new(bufs);
        let opt = brute_force(&p);
        // The search's time limit, longer where the run is slower (emulation).
        let best = Options {
            time_limit: emulated::patience(Duration::from_millis(200)),
            ..opts(Strategy::Best)
        };
        let plan = plan::solve(&p, &best).unwrap();
        check(&p, &plan).unwrap();
        assert_eq!(plan.arena, opt, "case {case}: {p:?}");
        for s in Strategy::ALL {
            assert!(plan::solve(&p, &opts(s)).unwrap().arena >= opt);
        }
    }
}

/// A MobileNet-like chain: each tensor is read by the next op only, sizes
/// alternate large and small, and one small tensor skips a few ops (a residual).
/// Greedy by size puts the large ones where the small ones needed to go.
fn alternating_chain(blocks: usize) -> Problem {
    let pattern: [(u64, u64, u64); 8] = [
        (0, 2, 1),
        (1, 3, 1),
        (2, 4, 4),
        (3, 5, 3),
        (4, 6, 4),
        (5, 7, 6),
        (6, 8, 3),
        (1, 5, 3),
    ];
    let mut bufs = Vec::new();
    for b in 0..blocks as u64 {
        for &(l, u, s) in &pattern {
            let id = bufs.len();
            bufs.push(Buffer {
                id,
                lower: l + 8 * b,
                upper: u + 8 * b,
                size: s * 1024,
                alignment: 64,
            });
        }
    }
    Problem::new(bufs)
}

#[test]
fn alternating_chains_reach_the_lower_bound() {
    for blocks in [1, 4, 16] {
        let p = alternating_chain(blocks);
        let lb = lower_bound(&p);
        let greedy = plan::solve(&p, &opts(Strategy::GreedySize)).unwrap();
        assert!(
            greedy.arena * 2 >= lb * 3,
            "greedy by size should waste a third here"
        );
        let best = plan::solve(&p, &opts(Strategy::Best)).unwrap();
        check(&p, &best).unwrap();
        assert_eq!(best.arena, lb, "{blocks} blocks");
    }
}

#[test]
fn capacity_is_searched_for_and_missed_cleanly() {
    let p = alternating_chain(2);
    let lb = lower_bound(&p);
    let o = Options {
        capacity: Some(lb),
        ..opts(Strategy::Best)
    };
    assert_eq!(plan::solve(&p, &o).unwrap().arena, lb);
    let o = Options {
        capacity: Some(lb - 1),
        ..opts(Strategy::Best)
    };
    assert!(matches!(
        plan::solve(&p, &o),
        Err(PlanError::CapacityExceeded { .. })
    ));
}

#[test]
fn input_errors_name_the_culprit() {
    let mut p = alternating_chain(1);
    p.buffers[3].upper = p.buffers[3].lower;
    let e = plan::solve(&p, &Options::default()).unwrap_err();
    assert!(e.to_string().contains("buffer 3"), "{e}");
    let mut p = alternating_chain(1);
    p.buffers[5].size = u64::MAX - 3;
    let e = plan::solve(&p, &Options::default());
    assert!(matches!(e, Err(PlanError::Overflow { .. })), "{e:?}");
    let mut p = alternating_chain(1);
    p.buffers[2].size = p.buffers[1].size;
    p.aliases = vec![
        Alias {
            view: 1,
            source: 2,
            offset: 0,
        },
        Alias {
            view: 2,
            source: 1,
            offset: 0,
        },
    ];
    assert!(matches!(
        plan::solve(&p, &Options::default()),
        Err(PlanError::AliasCycle { .. })
    ));
}

/// Timing probe for the engine's small case (run with `--ignored --nocapture`).
#[test]
#[ignore]
fn small_problem_timing() {
    let mut s = 7u64;
    let mut next = move |m: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) % m
    };
    let n = 200;
    let buffers: Vec<Buffer> = (0..n)
        .map(|id| {
            let lower = id as u64 / 2;
            let width = match next(100) {
                0..=79 => 1 + next(4),
                80..=97 => 4 + next(40),
                _ => 40 + next(n as u64 / 4 + 1),
            };
            Buffer {
                id,
                lower,
                upper: lower + width,
                size: 64 << next(14),
                alignment: 64,
            }
        })
        .collect();
    let p = Problem::new(buffers);
    for s in [Strategy::GreedySize, Strategy::Best] {
        let t = std::time::Instant::now();
        let mut plan = None;
        for _ in 0..100 {
            plan = Some(plan::solve(&p, &opts(s)).unwrap());
        }
        let plan = plan.unwrap();
        println!(
            "{s}: arena {} lb {} {:?}/solve",
            plan.arena,
            plan.lower_bound,
            t.elapsed() / 100
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Buffers used by kernels of one parallel group never share bytes once
    /// their lifetimes are converted to group steps.
    #[test]
    fn concurrent_kernels_never_share_bytes(
        widths in prop::collection::vec(1usize..4, 1..12),
        uses in prop::collection::vec((0u64..30, 1u64..5, 1u64..100), 1..30),
    ) {
        // Kernels in groups of the given widths, in order.
        let group_of: Vec<usize> = widths.iter().enumerate().flat_map(|(g, &w)| std::iter::repeat_n(g, w)).collect();
        let k = group_of.len() as u64;
        let bufs: Vec<Buffer> = uses
            .iter()
            .enumerate()
            .map(|(id, &(l, w, size))| {
                let lower = l % k;
                Buffer { id, lower, upper: (lower + w).min(k), size, alignment: 1 }
            })
            .collect();
        let p = Problem::new(plan::groups::lifetimes(&bufs, &group_of).unwrap());
        let plan = plan::solve(&p, &opts(Strategy::Best)).unwrap();
        for (i, a) in bufs.iter().enumerate() {
            for (j, b) in bufs.iter().enumerate().take(i) {
                let together = (a.lower..a.upper).any(|ka| {
                    (b.lower..b.upper).any(|kb| group_of[ka as usize] == group_of[kb as usize])
                });
                let (oa, ob) = (plan.offsets[i], plan.offsets[j]);
                let share = oa < ob + b.size && ob < oa + a.size;
                prop_assert!(!(together && share), "buffers {i} and {j} share bytes in one group");
            }
        }
    }
}
