//! Building an [`ExecutionPlan`] from a segment: the builder's steps, in order.
//!
//! ```text
//! describe (values.rs)   every value: dtype, layout, producer, readers, root, escapes
//! prune    (prune.rs)    ops whose output nobody reads are dead: no kernel, no memory
//! fuse     (groups.rs)   live element-wise ops into groups, one fused kernel each
//! chains   (chains.rs)   a group extended by a matmul before it and/or a norm after it
//! kernels  (here)        one kernel per chain, group or other live op, in queue order
//! levels   (levels.rs)   each kernel's level; kernels sorted by level
//! place    (memory.rs)   arena offsets from the memory planner, in-place pairs
//! ```
//!
//! See the module docs of [`crate::fusion`] for what each step decides.

use super::chains::{chain_index, chain_kernel, chains};
use super::groups::{fuse, fused_kernel, group_index};
use super::levels::levels;
use super::memory::place;
use super::prune::prune;
use super::values::describe;
use super::{ExecutionPlan, Kernel};
use crate::ir::relative::RelativeOp;
use crate::ir::{Op, OpKind};

/// Plans a segment given its ops and their relative forms (same length, same order).
pub fn build(ops: &[&Op], rels: &[&RelativeOp]) -> ExecutionPlan {
    let n_values = rels
        .iter()
        .flat_map(|r| r.inputs.iter().chain(r.output.iter()))
        .map(|&v| v as usize + 1)
        .max()
        .unwrap_or(0);
    let (mut values, mut facts) = describe(ops, rels, n_values);
    let live = prune(rels, &mut facts, &mut values);
    let groups = fuse(ops, rels, &facts, &values, &live);
    let specs = chains(ops, rels, &facts, &values, &groups, &live);
    let (chain_at, in_chain) = chain_index(ops.len(), &specs, &groups);
    let mut kernels = Vec::new();
    let mut kernel_of_group = vec![usize::MAX; groups.len()];
    let group_of = group_index(ops.len(), &groups);
    for (i, op) in ops.iter().enumerate() {
        let rel = rels[i];
        if let Some(c) = chain_at[i] {
            kernels.push(chain_kernel(
                ops,
                rels,
                &specs[c],
                &groups,
                &facts,
                &mut values,
            ));
            continue;
        }
        if in_chain[i] || !live[i] {
            continue;
        }
        if let Some(g) = group_of[i] {
            if groups[g].last() == Some(&i) {
                kernel_of_group[g] = kernels.len();
                kernels.push(fused_kernel(ops, rels, &groups[g], &facts, &mut values));
            }
            continue;
        }
        match op.kind {
            OpKind::Drop | OpKind::View => {}
            _ => kernels.push(Kernel::Op {
                op: i,
                inputs: rel.inputs.clone(),
                output: [rel.output.expect("ops other than Drop have an output")],
            }),
        }
    }
    let levels = levels(&kernels, &facts, n_values);
    // Sort kernels by level, keeping queue order within a level.
    let mut order: Vec<usize> = (0..kernels.len()).collect();
    order.sort_by_key(|&k| (levels[k], k));
    let kernels: Vec<Kernel> = order.iter().map(|&k| kernels[k].clone()).collect();
    let levels: Vec<u32> = order.iter().map(|&k| levels[k]).collect();
    let mut kernels = kernels;
    let (arena_len, arena_lower_bound) = place(&mut kernels, &levels, &facts, &mut values);
    ExecutionPlan {
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
            .map(|(op, _)| op.work())
            .fold(0, usize::saturating_add),
    }
}
