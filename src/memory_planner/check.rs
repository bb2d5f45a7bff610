//! Checking plans, and the two numbers every plan is measured against.
//!
//! [`validate`] is the gate every plan passes before [`solve`](super::solve)
//! returns it. It is written independently of the strategies: it sweeps the
//! timeline in step order, keeps the byte ranges of the live buffers in an ordered
//! map, and checks each newly born buffer against its two neighbours in that map.
//! That is `O(n log n)` and sound because the ranges already in the map never
//! overlap (each was checked when it was inserted).
//!
//! [`lower_bound`] is the largest sum of live bytes at any step: no arena can be
//! smaller. [`profile`] gives the live bytes at every step where they change,
//! which is what one plots, and what estimates peak memory before anything runs.

use std::collections::BTreeMap;

use super::error::PlanError;
use super::instance::{load_profile, peak, Instance, Item};
use super::problem::Problem;
use super::Placement;

/// Checks that `plan` is a correct plan for `problem`: one offset per buffer,
/// every offset a multiple of its buffer's alignment, every buffer inside the
/// arena, every view at its source's offset plus the view's offset, and no two
/// buffers that are live at the same step sharing a byte (except an in-place pair
/// that was given the same offset).
///
/// Returns [`PlanError::InvalidPlan`] naming the first problem found, or the
/// input error if `problem` itself is not valid.
pub fn validate(problem: &Problem, plan: &Placement) -> Result<(), PlanError> {
    problem.validate()?;
    validate_valid(problem, plan)
}

/// [`validate`] for a problem known to be valid (`solve` has just normalized it,
/// and need not do that twice on a million buffers).
pub(crate) fn validate_valid(problem: &Problem, plan: &Placement) -> Result<(), PlanError> {
    let bufs = &problem.buffers;
    let n = bufs.len();
    let bad = |message: String| Err(PlanError::InvalidPlan { message });
    if plan.offsets.len() != n {
        return bad(format!("{} offsets for {} buffers", plan.offsets.len(), n));
    }
    for (i, (b, &off)) in bufs.iter().zip(&plan.offsets).enumerate() {
        if off % b.alignment != 0 {
            return bad(format!(
                "buffer {i} (id {}) at offset {off} is not aligned to {}",
                b.id, b.alignment
            ));
        }
        match off.checked_add(b.size) {
            Some(end) if end <= plan.arena => {}
            _ => {
                return bad(format!(
                "buffer {i} (id {}) at offset {off} with size {} ends beyond the arena of {} bytes",
                b.id, b.size, plan.arena
            ))
            }
        }
    }
    let mut source = vec![None; n];
    for a in &problem.aliases {
        source[a.view] = Some(a.source);
        let want = plan.offsets[a.source].checked_add(a.offset);
        if want != Some(plan.offsets[a.view]) {
            return bad(format!(
                "view buffer {} (id {}) is at offset {}, but its source buffer {} is at {} and the view starts {} bytes into it",
                a.view, bufs[a.view].id, plan.offsets[a.view], a.source, plan.offsets[a.source], a.offset
            ));
        }
    }
    // Root of every buffer; a root's lifetime covers its views'.
    let root: Vec<usize> = (0..n)
        .map(|v| {
            let mut r = v;
            while let Some(s) = source[r] {
                r = s;
            }
            r
        })
        .collect();
    let mut span: Vec<(u64, u64)> = bufs.iter().map(|b| (b.lower, b.upper)).collect();
    for v in 0..n {
        let r = root[v];
        span[r].0 = span[r].0.min(bufs[v].lower);
        span[r].1 = span[r].1.max(bufs[v].upper);
    }
    // In-place pairs at equal offsets form one atom.
    let mut atom: Vec<usize> = (0..n).collect();
    fn find(a: &mut [usize], mut x: usize) -> usize {
        while a[x] != x {
            a[x] = a[a[x]];
            x = a[x];
        }
        x
    }
    for p in &problem.in_place {
        if plan.offsets[p.input] == plan.offsets[p.output] {
            let (x, y) = (find(&mut atom, p.input), find(&mut atom, p.output));
            atom[y] = x;
        }
    }
    // Every atom as (first step, end step, offset, end byte, a buffer of it),
    // indexed by its representative.
    const NO_ATOM: (u64, u64, u64, u64, usize) = (u64::MAX, 0, 0, 0, usize::MAX);
    let mut atoms = vec![NO_ATOM; n];
    for i in 0..n {
        if root[i] != i {
            continue;
        }
        let a = find(&mut atom, i);
        let e = &mut atoms[a];
        if e.4 == usize::MAX {
            *e = (span[i].0, span[i].1, plan.offsets[i], 0, i);
        }
        e.0 = e.0.min(span[i].0);
        e.1 = e.1.max(span[i].1);
        e.3 = e.3.max(plan.offsets[i] + bufs[i].size);
    }
    // Events (step, atom), the top bit set for a birth: at one step, deaths
    // come before births.
    const BIRTH: u64 = 1 << 63;
    let mut ev: Vec<(u64, u64)> = Vec::with_capacity(2 * n);
    for (k, a) in atoms.iter().enumerate() {
        if a.4 != usize::MAX {
            ev.push((a.0, BIRTH | k as u64));
            ev.push((a.1, k as u64));
        }
    }
    ev.sort_unstable();
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    let clash = |a: usize, b: usize, t: u64| {
        bad(format!(
            "buffers {a} (id {}) and {b} (id {}) are both live at step {t} and share bytes",
            bufs[a].id, bufs[b].id
        ))
    };
    for (t, code) in ev {
        let (_, _, off, end, who) = atoms[(code & !BIRTH) as usize];
        if code & BIRTH == 0 {
            live.remove(&off);
            continue;
        }
        if let Some((_, &(pend, pwho))) = live.range(..=off).next_back() {
            if pend > off {
                return clash(pwho, who, t);
            }
        }
        if let Some((&noff, &(_, nwho))) = live.range(off..).next() {
            if noff < end {
                return clash(nwho, who, t);
            }
        }
        live.insert(off, (end, who));
    }
    Ok(())
}

/// The items the planner would place for `problem`, or, if `problem` is not
/// valid, its buffers taken as they are (skipping empty lifetimes).
fn items_or_raw(problem: &Problem) -> Vec<Item> {
    match Instance::new(problem) {
        Ok(inst) => inst.items,
        Err(_) => problem
            .buffers
            .iter()
            .filter(|b| b.upper > b.lower)
            .map(|b| Item {
                lower: b.lower,
                upper: b.upper,
                size: b.size.min(u64::MAX / (problem.buffers.len() as u64 + 1)),
                align: 1,
            })
            .collect(),
    }
}

/// The largest sum of sizes of buffers live at the same step: no arena can be
/// smaller. Views count nothing (they share their source's bytes, whose life they
/// extend) and an in-place pair the planner merges counts once.
///
/// For a problem that fails [`Problem::validate`] this is computed on the raw
/// buffers (sizes clamped so the sum cannot overflow); call `validate` first when
/// that matters.
pub fn lower_bound(problem: &Problem) -> u64 {
    peak(&items_or_raw(problem))
}

/// The memory profile: `(step, live bytes from this step on)` at every step where
/// the live bytes change, in step order; the last entry drops to zero. Same
/// counting rules as [`lower_bound`], whose value is the largest live bytes here.
pub fn profile(problem: &Problem) -> Vec<(u64, u64)> {
    load_profile(&items_or_raw(problem))
}

#[cfg(test)]
mod tests {
    use super::super::problem::{Alias, Buffer, InPlace};
    use super::super::Strategy;
    use super::*;

    fn plan(offsets: Vec<u64>, arena: u64) -> Placement {
        Placement {
            offsets,
            arena,
            lower_bound: 0,
            strategy: Strategy::Naive,
        }
    }

    #[test]
    fn catches_overlap_and_misalignment() {
        let mut p = Problem::new(vec![Buffer::new(0, 0, 4, 8), Buffer::new(1, 3, 6, 8)]);
        assert!(validate(&p, &plan(vec![0, 8], 16)).is_ok());
        let e = validate(&p, &plan(vec![0, 4], 16)).unwrap_err();
        assert!(e.to_string().contains("step 3"), "{e}");
        assert!(validate(&p, &plan(vec![0, 8], 15)).is_err());
        p.buffers[1].alignment = 16;
        assert!(validate(&p, &plan(vec![0, 8], 16)).is_err());
        p.buffers[1].lower = 4;
        assert!(validate(&p, &plan(vec![0, 0], 8)).is_ok());
    }

    #[test]
    fn views_and_in_place() {
        let mut p = Problem::new(vec![
            Buffer::new(0, 0, 3, 8),
            Buffer::new(1, 2, 5, 8),
            Buffer::new(2, 4, 7, 4),
        ]);
        p.in_place = vec![InPlace {
            input: 0,
            output: 1,
        }];
        p.aliases = vec![Alias {
            view: 2,
            source: 1,
            offset: 4,
        }];
        assert!(validate(&p, &plan(vec![0, 0, 4], 8)).is_ok());
        assert!(validate(&p, &plan(vec![0, 0, 0], 8)).is_err());
        // Without the pair the same offsets are a clash at step 2.
        p.in_place.clear();
        assert!(validate(&p, &plan(vec![0, 0, 4], 8)).is_err());
    }

    #[test]
    fn bound_and_profile() {
        let p = Problem::new(vec![
            Buffer::new(0, 0, 4, 8),
            Buffer::new(1, 3, 6, 4),
            Buffer::new(2, 6, 7, 2),
        ]);
        assert_eq!(lower_bound(&p), 12);
        assert_eq!(profile(&p), vec![(0, 8), (3, 12), (4, 4), (6, 2), (7, 0)]);
    }
}
