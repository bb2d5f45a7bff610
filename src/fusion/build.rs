//! Building an [`ExecutionPlan`] from a segment: the builder's steps, in order.
//!
//! ```text
//! describe      (values.rs)  every value: dtype, layout, producer, readers, root, escapes
//! prune         (prune.rs)   ops whose output nobody reads are dead: no kernel, no memory
//! fuse          (groups.rs)  live element-wise ops into groups, one fused kernel each
//! chains        (chains.rs)  a group extended by a matmul before it and/or a norm after it
//! kernels       (here)       one kernel per chain, group or other live op, in queue order
//! sort_by_level (levels.rs)  each kernel's level; kernels sorted by it
//! place         (memory.rs)  arena offsets from the memory planner, in-place pairs
//! ```
//!
//! Each step reads what the earlier ones made and marks value homes as it decides
//! them (see the module docs of [`crate::fusion`]). A step that finds an earlier one's
//! promise broken returns [`Error::Internal`] naming what broke; the builder never
//! panics on its own inputs.

use super::chains::{chain_index, chain_kernel, chains, ChainSpec};
use super::groups::{fuse, fused_kernel, group_index};
use super::levels::sort_by_level;
use super::memory::{place, MemoryStep};
use super::prune::prune;
use super::values::{describe, Facts};
use super::{ExecutionPlan, Home, Kernel, Value};
use crate::error::Error;
use crate::ir::relative::RelativeOp;
use crate::ir::{Op, OpKind};

/// Plans a segment given its ops and their relative forms (same length, same order).
///
/// Fails with [`Error::Internal`] only when one of the builder's own invariants does
/// not hold (a segment the stream cannot have made, or a step that broke what the
/// next one relies on): a bug, reported rather than a panic.
#[cfg(test)]
pub(crate) fn build(ops: &[&Op], rels: &[&RelativeOp]) -> Result<ExecutionPlan, Error> {
    build_with(ops, rels, &mut super::memory::solve)
}

/// `build` (the tests' entry point), with the memory step's planner problem answered by `memory` (the
/// memory planner on a full build; a stored symbolic plan on an instantiation).
pub(crate) fn build_with(
    ops: &[&Op],
    rels: &[&RelativeOp],
    memory: MemoryStep<'_>,
) -> Result<ExecutionPlan, Error> {
    #[cfg(test)]
    if super::testutil::build_broken() {
        return Err(broken(
            "test",
            "failure injected by testutil::break_next_build",
        ));
    }
    let (mut values, mut facts) = describe(ops, rels)?;
    let live = prune(rels, &mut facts, &mut values);
    let groups = fuse(ops, rels, &facts, &values, &live);
    let specs = chains(ops, rels, &facts, &values, &groups, &live)?;
    let kernels = kernels(ops, rels, &live, &groups, &specs, &facts, &mut values)?;
    let (mut kernels, levels) = sort_by_level(kernels, &facts);
    let (arena_len, arena_lower_bound) = place(&mut kernels, &levels, &facts, &mut values, memory)?;
    Ok(ExecutionPlan {
        values,
        kernels,
        levels,
        arena_len,
        arena_lower_bound,
        ops: ops.len(),
        dead_ops: ops
            .iter()
            .zip(&live)
            .filter(|(op, &l)| !l && !matches!(op.kind, OpKind::Drop))
            .count(),
        work: ops
            .iter()
            .zip(&live)
            .filter(|(_, &l)| l)
            .map(|(op, _)| crate::ops::work(op))
            .fold(0, usize::saturating_add),
    })
}

/// The kernels in queue order: a chain's at its last op, a group's at its last op, and
/// one per other live op but Views (which read their root) and Drops.
pub(super) fn kernels(
    ops: &[&Op],
    rels: &[&RelativeOp],
    live: &[bool],
    groups: &[Vec<usize>],
    specs: &[ChainSpec],
    facts: &[Facts],
    values: &mut [Value],
) -> Result<Vec<Kernel>, Error> {
    let (chain_at, in_chain) = chain_index(ops.len(), specs, groups)?;
    let group_of = group_index(ops.len(), groups)?;
    let mut kernels = Vec::new();
    for (i, (op, rel)) in ops.iter().zip(rels).enumerate() {
        if let Some(c) = chain_at[i] {
            kernels.push(chain_kernel(ops, rels, &specs[c], groups, facts, values)?);
            continue;
        }
        if in_chain[i] || !live[i] {
            continue;
        }
        if let Some(g) = group_of[i] {
            if groups[g].last() == Some(&i) {
                kernels.push(fused_kernel(ops, rels, &groups[g], facts, values)?);
            }
            continue;
        }
        let product = match (&op.kind, rel.inputs.get(1)) {
            (OpKind::MatMul, Some(&rhs)) => crate::ops::matmul::plan(op, is_weight(values, rhs)),
            _ => None,
        };
        match op.kind {
            OpKind::Drop | OpKind::View => {}
            _ => kernels.push(Kernel::Op {
                op: i,
                inputs: rel.inputs.clone(),
                output: [rel
                    .output
                    .ok_or_else(|| broken("kernels", format!("live op {i} has no output")))?],
                product,
            }),
        }
    }
    Ok(kernels)
}

/// Whether value `v` (relative id) is, or is a view of, a segment input: a weight, for
/// a product that reads it as its right operand (made before the segment, so its
/// buffer can keep a packed form).
pub(super) fn is_weight(values: &[Value], v: u32) -> bool {
    let root = match values.get(v as usize).map(|x| x.home) {
        Some(Home::View { root }) => root,
        _ => v,
    };
    matches!(values.get(root as usize).map(|x| x.home), Some(Home::Input))
}

/// An [`Error::Internal`] for a broken invariant of the plan builder, found by `step`.
pub(super) fn broken(step: &str, what: impl std::fmt::Display) -> Error {
    Error::Internal {
        msg: format!("plan builder, {step} step: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::testutil::{drop_of, exp, relative};

    #[test]
    fn a_broken_segment_is_an_internal_error_not_a_panic() {
        let ops = [exp(0, 1), exp(1, 2), drop_of(1)];
        let rels = relative(&ops);
        let ops: Vec<&Op> = ops.iter().collect();
        let mut rels: Vec<&RelativeOp> = rels.iter().collect();
        assert!(build(&ops, &rels).is_ok());
        rels.pop();
        let e = build(&ops, &rels).unwrap_err();
        assert_eq!(
            e.to_string(),
            "internal error (a bug in streamfuse, please report it): \
             plan builder, values step: 3 ops but 2 relative forms"
        );
    }
}
