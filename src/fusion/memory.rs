//! The plan builder's memory step: where every stored value lives.
//!
//! Takes the kernels sorted by level and gives every f32 root that is made and dies in
//! the segment an offset in one arena, from the static memory planner
//! ([`crate::plan`]); escaping roots and other dtypes stay [`Home::Pooled`]. A buffer
//! lives from its producer's level to one past its last reader's. Invariants: two
//! buffers whose lifetimes overlap never overlap in the arena, unless they are an
//! in-place pair that the planner merged; an in-place pair is offered only for a fused
//! kernel's input that dies at the kernel's level, has no other reader there, and is
//! read at the index the kernel writes.

use std::time::Duration;

use super::build::broken;
use super::values::Facts;
use super::{Home, Kernel, Value};
use crate::error::Error;
use crate::ir::{DType, Layout};
use crate::plan;

/// Arena buffers are padded and aligned to this many f32 elements (64 bytes).
const ALIGN: usize = 16;

/// Step 4: arena offsets for f32 roots born and dead in the segment; pooled buffers for
/// the rest. Returns the arena length and the lower bound, in f32 elements.
///
/// A fused kernel's arena output may take the bytes of an arena input that dies at the
/// kernel's level (an in-place pair of the planner) when the kernel reads it at the
/// index it writes (the same length, a contiguous layout from offset 0) and nothing
/// else reads it at that level (kernels of one level may run at once). Where the
/// planner gives both the same offset, the kernel records the pair and reads that
/// input from its output region. Fails when the planner's answer does not give every
/// buffer an offset.
pub(super) fn place(
    kernels: &mut [Kernel],
    levels: &[u32],
    facts: &[Facts],
    values: &mut [Value],
) -> Result<(usize, usize), Error> {
    let life = lifetimes(kernels, levels, facts, values.len());
    let arena = arena_buffers(values, &life);
    if arena.buffers.is_empty() {
        return Ok((0, 0));
    }
    let pairs = in_place_pairs(kernels, levels, facts, values, &life, &arena);
    let mut problem = plan::Problem::new(arena.buffers);
    problem.in_place = pairs
        .iter()
        .map(|p| plan::InPlace {
            input: p.input_buffer,
            output: p.output_buffer,
        })
        .collect();
    let solution = solve(&problem);
    if solution.offsets.len() != arena.owners.len() {
        return Err(broken(
            "memory",
            format!(
                "{} offsets for {} buffers",
                solution.offsets.len(),
                arena.owners.len()
            ),
        ));
    }
    record_in_place(kernels, &pairs, &solution.offsets);
    for (&v, &off) in arena.owners.iter().zip(&solution.offsets) {
        values[v].home = Home::Arena {
            offset: off as usize / 4,
        };
    }
    Ok((
        solution.arena as usize / 4,
        solution.lower_bound as usize / 4,
    ))
}

/// The levels at which each value is made and last read.
struct Lifetimes {
    /// `born[v]`: the level of the kernel that writes `v` (`u32::MAX` when none does).
    born: Vec<u32>,
    /// `last[r]`: the highest level at which root `r` is written or read (through
    /// itself or a view).
    last: Vec<u32>,
}

/// The lifetime of every value, from the kernels and their levels.
fn lifetimes(kernels: &[Kernel], levels: &[u32], facts: &[Facts], n: usize) -> Lifetimes {
    let mut born = vec![u32::MAX; n];
    let mut last = vec![0u32; n];
    for (k, &lvl) in kernels.iter().zip(levels) {
        let (ins, outs) = k.io();
        for &v in outs {
            born[v as usize] = lvl;
            last[v as usize] = last[v as usize].max(lvl);
        }
        for &v in ins {
            let r = facts[v as usize].root as usize;
            last[r] = last[r].max(lvl);
        }
    }
    Lifetimes { born, last }
}

/// The planner's buffers: one per value that lives in the arena.
struct ArenaBuffers {
    /// In value order.
    buffers: Vec<plan::Buffer>,
    /// `owners[b]`: the value of `buffers[b]`.
    owners: Vec<usize>,
    /// `buffer_of[v]`: the buffer of value `v`, if it has one.
    buffer_of: Vec<Option<usize>>,
}

/// A buffer for every f32 value that is made by a kernel of the segment, does not
/// escape and is not a view, fused or dead (those are the ones still
/// [`Home::Pooled`]), living from its producer's level to one past its last reader's.
fn arena_buffers(values: &[Value], life: &Lifetimes) -> ArenaBuffers {
    let mut arena = ArenaBuffers {
        buffers: Vec::new(),
        owners: Vec::new(),
        buffer_of: vec![None; values.len()],
    };
    for (v, val) in values.iter().enumerate() {
        if val.home == Home::Pooled
            && !val.escapes
            && val.dtype == DType::F32
            && life.born[v] != u32::MAX
        {
            let len = val.layout.numel().div_ceil(ALIGN) * ALIGN;
            arena.buffer_of[v] = Some(arena.buffers.len());
            arena.buffers.push(plan::Buffer {
                id: v,
                lower: life.born[v] as u64,
                upper: life.last[v] as u64 + 1,
                size: (len.max(ALIGN) * 4) as u64,
                alignment: (ALIGN * 4) as u64,
            });
            arena.owners.push(v);
        }
    }
    arena
}

/// An offer to the planner: a fused kernel's output may take its input's bytes.
struct Pair {
    /// Index of the fused kernel.
    kernel: usize,
    /// Which of its inputs.
    input: usize,
    /// Which of its outputs.
    output: usize,
    /// The input's arena buffer.
    input_buffer: usize,
    /// The output's arena buffer.
    output_buffer: usize,
}

/// The in-place offers: for each arena output of a fused kernel, the first arena
/// input (a root) that dies at the kernel's level, is made at an earlier level, has no
/// other reader at that level, is read whole and contiguous, has as many elements as
/// the output and is not offered to another output already.
fn in_place_pairs(
    kernels: &[Kernel],
    levels: &[u32],
    facts: &[Facts],
    values: &[Value],
    life: &Lifetimes,
    arena: &ArenaBuffers,
) -> Vec<Pair> {
    let (born, last) = (&life.born, &life.last);
    let mut reads_at_last = vec![0usize; values.len()];
    for (k, &lvl) in kernels.iter().zip(levels) {
        for &v in k.io().0 {
            let r = facts[v as usize].root as usize;
            if last[r] == lvl {
                reads_at_last[r] += 1;
            }
        }
    }
    let mut pairs: Vec<Pair> = Vec::new();
    for (ki, (k, &lvl)) in kernels.iter().zip(levels).enumerate() {
        let Kernel::Fused {
            inputs,
            outputs,
            dims,
            ..
        } = k
        else {
            continue;
        };
        let whole = Layout::contiguous(dims);
        for (j, &o) in outputs.iter().enumerate() {
            let Some(out) = arena.buffer_of[o as usize] else {
                continue;
            };
            let numel = values[o as usize].layout.numel();
            let found = inputs.iter().enumerate().find_map(|(i, (v, layout))| {
                let r = facts[*v as usize].root as usize;
                let inp = arena.buffer_of[r]?;
                let ok = last[r] == lvl
                    && born[r] < lvl
                    && reads_at_last[r] == 1
                    && *layout == whole
                    && values[r].layout.numel() == numel
                    && !pairs.iter().any(|p| p.input_buffer == inp);
                ok.then_some((i, inp))
            });
            if let Some((i, inp)) = found {
                pairs.push(Pair {
                    kernel: ki,
                    input: i,
                    output: j,
                    input_buffer: inp,
                    output_buffer: out,
                });
            }
        }
    }
    pairs
}

/// The planner's answer: an offset per buffer, the arena and its lower bound (bytes).
struct Solution {
    offsets: Vec<u64>,
    arena: u64,
    lower_bound: u64,
}

/// Runs the memory planner (50 ms, one thread). If it fails (never expected), the
/// buffers go one after the other, with no reuse, rather than fail the segment.
fn solve(problem: &plan::Problem) -> Solution {
    let options = plan::Options {
        time_limit: Duration::from_millis(50),
        threads: 1,
        ..plan::Options::default()
    };
    match plan::solve(problem, &options) {
        Ok(p) => Solution {
            offsets: p.offsets,
            arena: p.arena,
            lower_bound: p.lower_bound,
        },
        Err(e) => {
            log::warn!("memory planning failed ({e}); using one buffer after the other");
            let mut at = 0;
            let offsets = problem
                .buffers
                .iter()
                .map(|b| {
                    let o = at;
                    at += b.size;
                    o
                })
                .collect();
            Solution {
                offsets,
                arena: at,
                lower_bound: plan::lower_bound(problem),
            }
        }
    }
}

/// Records the pairs the planner took (both buffers at one offset) in their kernels:
/// only those read in place.
fn record_in_place(kernels: &mut [Kernel], pairs: &[Pair], offsets: &[u64]) {
    for p in pairs {
        if offsets.get(p.input_buffer) == offsets.get(p.output_buffer) {
            if let Some(Kernel::Fused { in_place, .. }) = kernels.get_mut(p.kernel) {
                in_place.push((p.input, p.output));
            }
        }
    }
}
