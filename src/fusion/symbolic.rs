//! Symbolic plans: one plan per segment *structure*, instantiated for each set of
//! symbol values.
//!
//! A segment's key ([`crate::ir::relative`]) keeps its ops and the equality pattern of
//! its layout numbers, whose values are the segment's *symbols*. The first segment of a
//! structure is built in full ([`build_template`]): fusion, levels, and the arena's
//! memory plan, which is also kept as a [`SymPlacement`] whose buffer sizes are expressions
//! of the symbols (4 bytes × the product of the value's dims). A later segment of the
//! same structure with other values is *instantiated* ([`instantiate`]): the builder's
//! steps run again on its own ops (they decide from dims only through the equalities
//! the key fixes, and take microseconds), but the memory step evaluates the stored
//! order at the new values instead of planning (one linear pass; the planner runs only
//! when the values leave the range of every stored order, see
//! [`crate::memory_planner::symbolic`]). Every layout, size and work estimate of the
//! instance is therefore the segment's own: an instance can never compute something
//! else than a full build would. If the builder's steps meet another arena structure
//! than the stored one (lifetimes, in-place offers, sizes that are not the stored
//! expressions at these values), the memory step plans in full, and the caller counts
//! a full build.

use parking_lot::Mutex;

use super::build::build_with;
use super::memory::{options, solve, Solution};
use super::{ExecutionPlan, Value};
use crate::error::Error;
use crate::ir::relative::{code, RelativeOp};
use crate::ir::Op;
use crate::memory_planner::{Problem, SymBuffer, SymPlacement, SymProblem, TDim};

/// What a plan cache entry keeps for a segment structure besides its signature.
#[derive(Debug)]
pub(crate) struct Template {
    /// The arena's symbolic memory plan; `None` when the first build had no arena or
    /// its sizes could not be written in the symbols.
    memory: Option<Mutex<SymPlacement>>,
}

impl Template {
    /// Estimated heap bytes of the template.
    pub(crate) fn bytes(&self) -> usize {
        self.memory.as_ref().map_or(0, |m| m.lock().heap_bytes())
    }
}

/// The symbol values as the planner takes them.
fn values(symbols: &[usize]) -> Vec<u64> {
    symbols.iter().map(|&s| s as u64).collect()
}

/// Plans a segment in full and keeps its arena's plan as a symbolic one.
pub(crate) fn build_template(
    ops: &[&Op],
    rels: &[&RelativeOp],
    symbols: &[usize],
) -> Result<(ExecutionPlan, Template), Error> {
    let mut planned: Option<(Problem, Vec<u64>)> = None;
    let plan = build_with(ops, rels, &mut |p: &Problem| {
        let s = solve(p);
        planned = Some((p.clone(), s.offsets.clone()));
        s
    })?;
    let memory = planned.and_then(|(problem, offsets)| {
        let sym = sym_problem(&problem, &plan.values, symbols)?;
        match SymPlacement::from_plan(sym, &values(symbols), &offsets, options()) {
            Ok(p) => Some(Mutex::new(p)),
            Err(e) => {
                log::debug!("no symbolic memory plan for this segment: {e}");
                None
            }
        }
    });
    Ok((plan, Template { memory }))
}

/// Plans a segment of `template`'s structure at its own symbol values. Returns the
/// plan and whether the stored memory plan served (`false`: the arena was planned in
/// full, a full build's cost).
pub(crate) fn instantiate(
    template: &Template,
    ops: &[&Op],
    rels: &[&RelativeOp],
    symbols: &[usize],
) -> Result<(ExecutionPlan, bool), Error> {
    let mut symbolic = true;
    let plan = build_with(ops, rels, &mut |p: &Problem| {
        if let Some(s) = template.memory.as_ref().and_then(|m| {
            let mut m = m.lock();
            let at = values(symbols);
            if !same_structure(m.problem(), p, &at) {
                return None;
            }
            m.instantiate(&at)
                .map_err(|e| log::warn!("symbolic memory plan failed ({e}); planning in full"))
                .ok()
        }) {
            return Solution {
                offsets: s.offsets,
                arena: s.arena,
                lower_bound: s.lower_bound,
            };
        }
        symbolic = false;
        solve(p)
    })?;
    // A segment without an arena needs no memory plan at all.
    Ok((plan, symbolic))
}

/// The arena problem `problem` (buffer ids are values) with each size written as
/// 4 bytes × the product of its value's dims in the segment's symbols; `None` when a
/// dim is not among them.
fn sym_problem(problem: &Problem, values: &[Value], symbols: &[usize]) -> Option<SymProblem> {
    let mut buffers = Vec::with_capacity(problem.buffers.len());
    for b in &problem.buffers {
        let dims = values.get(b.id)?.layout.dims();
        let mut syms = Vec::with_capacity(dims.len());
        let mut coef = 4;
        for &d in dims {
            match code(d, symbols)? {
                0 => coef = 0,
                1 => {}
                c => syms.push(c - 2),
            }
        }
        buffers.push(SymBuffer {
            id: b.id,
            lower: b.lower,
            upper: b.upper,
            size: TDim::product(coef, &syms),
            alignment: b.alignment,
        });
    }
    Some(SymProblem {
        buffers,
        in_place: problem.in_place.clone(),
        symbols: symbols.len(),
    })
}

/// Whether the concrete arena problem `p` is the stored `sym` at `values`: the same
/// buffers, lifetimes, alignments and in-place offers, and sizes that are the stored
/// expressions' values.
fn same_structure(sym: &SymProblem, p: &Problem, values: &[u64]) -> bool {
    sym.symbols == values.len()
        && sym.buffers.len() == p.buffers.len()
        && sym.in_place == p.in_place
        && sym
            .buffers
            .iter()
            .zip(&p.buffers)
            .enumerate()
            .all(|(i, (s, b))| {
                s.id == b.id
                    && s.lower == b.lower
                    && s.upper == b.upper
                    && s.alignment == b.alignment
                    && sym.size_at(i, values).ok() == Some(b.size)
            })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::testutil::{desc, op_dims};
    use crate::fusion::Home;
    use crate::ir::relative::RelativeBuilder;
    use crate::ir::{BinaryOp, Layout, OpKind, ReduceOp};

    /// `y = (x·w)·w + sum(x·w)` over `[s, 8]` rows, the intermediates dropped: the
    /// product read twice and the row sums live in the arena.
    fn segment(s: usize) -> (Vec<Op>, Vec<RelativeOp>, Vec<usize>) {
        let (x, w, r) = (&[s, 8][..], &[8, 8][..], &[s, 1][..]);
        let sum = OpKind::Reduce {
            op: ReduceOp::Sum,
            dim: 1,
            keepdim: true,
        };
        let drop = |id, d: &[usize]| Op {
            kind: OpKind::Drop,
            inputs: vec![desc(id, Layout::contiguous(d))],
            output: None,
        };
        let ops = vec![
            op_dims(OpKind::MatMul, &[(0, x), (1, w)], (2, x)),
            op_dims(sum, &[(2, x)], (3, r)),
            op_dims(OpKind::MatMul, &[(2, x), (1, w)], (4, x)),
            op_dims(OpKind::Binary(BinaryOp::Add), &[(4, x), (3, r)], (5, x)),
            drop(2, x),
            drop(3, r),
            drop(4, x),
        ];
        let mut b = RelativeBuilder::default();
        let rels = ops.iter().map(|o| b.push(o)).collect();
        (ops, rels, b.symbols().to_vec())
    }

    fn refs<T>(v: &[T]) -> Vec<&T> {
        v.iter().collect()
    }

    #[test]
    fn an_instance_places_the_arena_like_a_build_of_its_own() {
        let (ops, rels, syms) = segment(5);
        let (first, template) = build_template(&refs(&ops), &refs(&rels), &syms).unwrap();
        assert!(template.memory.is_some());
        assert!(first.arena_len > 0);
        for s in [5, 7, 100, 3000] {
            let (ops, rels, syms) = segment(s);
            let (plan, symbolic) =
                instantiate(&template, &refs(&ops), &refs(&rels), &syms).unwrap();
            assert!(symbolic, "rows {s}");
            let (own, _) = build_template(&refs(&ops), &refs(&rels), &syms).unwrap();
            assert!(
                plan.arena_len as f64 <= 1.05 * own.arena_lower_bound as f64,
                "rows {s}: arena {} vs lower bound {}",
                plan.arena_len,
                own.arena_lower_bound
            );
            assert_eq!(plan.kernel_count(), own.kernel_count());
            for (a, b) in plan.values.iter().zip(&own.values) {
                assert_eq!(a.layout, b.layout);
                assert_eq!(
                    matches!(a.home, Home::Arena { .. }),
                    matches!(b.home, Home::Arena { .. })
                );
            }
        }
    }

    /// A segment whose arena differs from the template's (here the row sums escape,
    /// so they leave the arena) is planned in full, and says so.
    #[test]
    fn another_arena_structure_is_planned_in_full() {
        let (ops, rels, syms) = segment(5);
        let (_, template) = build_template(&refs(&ops), &refs(&rels), &syms).unwrap();
        let (mut ops, _, _) = segment(9);
        ops.retain(|o| !(o.kind == OpKind::Drop && o.inputs[0].id.0 == 3));
        let mut b = RelativeBuilder::default();
        let rels: Vec<RelativeOp> = ops.iter().map(|o| b.push(o)).collect();
        let (plan, symbolic) =
            instantiate(&template, &refs(&ops), &refs(&rels), b.symbols()).unwrap();
        assert!(!symbolic);
        assert!(plan.values[3].escapes);
        assert!(!matches!(plan.values[3].home, Home::Arena { .. }));
    }
}
