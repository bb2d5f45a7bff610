//! What the plan cache counts for a stored plan: an estimate of the heap it takes,
//! field by field (every field of a plan is named, so that a new one must be counted
//! here too). The limit of [`super::set_plan_cache_limit`] is held against these.

use std::sync::atomic::AtomicUsize;

use crate::fusion::{Chain, ExecutionPlan, Kernel};
use crate::kernels::FusedProgram;

/// Bytes of one heap block holding `n` values of `T`, with the allocator's header.
pub(super) fn heap<T>(n: usize) -> usize {
    /// What a heap block costs beyond its contents (header and rounding, on glibc).
    const BLOCK_OVERHEAD: usize = 16;
    match n * size_of::<T>() {
        0 => 0,
        b => b + BLOCK_OVERHEAD,
    }
}

/// Bytes of the heap block of `v` (its capacity).
pub(super) fn vec_bytes<T>(v: &Vec<T>) -> usize {
    heap::<T>(v.capacity())
}

/// Bytes of a fused program's lists.
fn program_bytes(p: &FusedProgram) -> usize {
    vec_bytes(&p.instrs) + vec_bytes(&p.outputs)
}

/// Estimated heap bytes of a plan: its `Arc`, values, kernels and their lists,
/// programs and layouts, levels.
pub(super) fn plan_bytes(plan: &ExecutionPlan) -> usize {
    // Every field is named, so that a new one must be counted here too.
    let ExecutionPlan {
        values,
        kernels,
        levels,
        arena_len: _,
        arena_lower_bound: _,
        ops: _,
        dead_ops: _,
        work: _,
    } = plan;
    let mut bytes = heap::<(AtomicUsize, AtomicUsize, ExecutionPlan)>(1)
        + vec_bytes(values)
        + vec_bytes(kernels)
        + vec_bytes(levels);
    for kernel in kernels {
        bytes += match kernel {
            Kernel::Op {
                op: _,
                inputs,
                output: _,
                product: _,
            } => vec_bytes(inputs),
            Kernel::Fused {
                program,
                inputs,
                input_ids,
                outputs,
                dims: _,
                in_place,
            } => {
                program_bytes(program)
                    + vec_bytes(inputs)
                    + vec_bytes(input_ids)
                    + vec_bytes(outputs)
                    + vec_bytes(in_place)
            }
            Kernel::Chain(chain) => {
                let Chain {
                    matmul: _,
                    program,
                    inputs,
                    norm,
                    input_ids,
                    outputs,
                    dims: _,
                } = &**chain;
                heap::<Chain>(1)
                    + program_bytes(program)
                    + vec_bytes(inputs)
                    + norm.as_ref().map_or(0, |n| vec_bytes(&n.params))
                    + vec_bytes(input_ids)
                    + vec_bytes(outputs)
            }
        };
    }
    bytes
}
