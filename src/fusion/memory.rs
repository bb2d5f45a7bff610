//! The plan builder's memory step: where every stored value lives.
//!
//! Takes the kernels sorted by level and gives every f32 root that is made and dies in
//! the segment an offset in one arena, from the static memory planner
//! ([`crate::memory_planner`]); escaping roots and other dtypes stay [`Home::Pooled`]. A buffer
//! lives from its producer's level to one past its last reader's. Invariants: two
//! buffers whose lifetimes overlap never overlap in the arena, unless they are an
//! in-place pair that the planner merged; an in-place pair is offered only for a fused
//! kernel's input that dies at the kernel's level, has no other reader there, and is
//! read at the index the kernel writes.

use std::time::Duration;

use super::build::broken;
use super::values::Facts;
use super::{ExecutionPlan, Home, Kernel, Value};
use crate::error::Error;
use crate::ir::{DType, Layout};
use crate::memory_planner;

/// Arena buffers are padded and aligned to this many f32 elements (64 bytes) from the
/// arena's start, which is itself 64-byte aligned (`runtime::memory::ARENA_ALIGN`).
const ALIGN: usize = 16;

/// Step 4: arena offsets for f32 roots born and dead in the segment; pooled buffers for
/// the rest. Returns the arena length and the lower bound, in f32 elements. `memory`
/// answers the arena's planner problem: [`solve`] on a full build, the stored symbolic
/// plan on an instantiation (`fusion::symbolic`).
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
    memory: MemoryStep<'_>,
) -> Result<(usize, usize), Error> {
    let life = lifetimes(
        kernels,
        levels,
        |v| facts[v as usize].root as usize,
        values.len(),
    );
    let arena = arena_buffers(values, &life);
    if arena.buffers.is_empty() {
        return Ok((0, 0));
    }
    let pairs = in_place_pairs(kernels, levels, facts, values, &life, &arena);
    let mut problem = memory_planner::Problem::new(arena.buffers);
    problem.in_place = pairs
        .iter()
        .map(|p| memory_planner::InPlace {
            input: p.input_buffer,
            output: p.output_buffer,
        })
        .collect();
    let solution = memory(&problem);
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

/// The lifetime of every value, from the kernels and their levels (`root` gives the
/// value whose buffer a value reads).
fn lifetimes(
    kernels: &[Kernel],
    levels: &[u32],
    root: impl Fn(u32) -> usize,
    n: usize,
) -> Lifetimes {
    let mut born = vec![u32::MAX; n];
    let mut last = vec![0u32; n];
    for (k, &lvl) in kernels.iter().zip(levels) {
        let (ins, outs) = k.io();
        for &v in outs {
            born[v as usize] = lvl;
            last[v as usize] = last[v as usize].max(lvl);
        }
        for &v in ins {
            let r = root(v);
            last[r] = last[r].max(lvl);
        }
    }
    Lifetimes { born, last }
}

/// The planner's buffer of value `v` with `numel` elements: padded to whole 64-byte
/// lines, living from its producer's level to one past its last reader's.
fn arena_buffer(v: usize, numel: usize, life: &Lifetimes) -> memory_planner::Buffer {
    let len = numel.div_ceil(ALIGN) * ALIGN;
    memory_planner::Buffer {
        id: v,
        lower: life.born[v] as u64,
        upper: life.last[v] as u64 + 1,
        size: (len.max(ALIGN) * 4) as u64,
        alignment: (ALIGN * 4) as u64,
    }
}

/// The memory planner's problem of a built plan and the offsets (bytes) the arena
/// values got: the buffers and in-place pairs the builder planned, found again from
/// the plan's kernels, levels and homes (for pictures of the plan, `crate::trace`).
pub(crate) fn arena_problem(plan: &ExecutionPlan) -> (memory_planner::Problem, Vec<u64>) {
    let n = plan.values.len();
    let root = |v: u32| match plan.values[v as usize].home {
        Home::View { root } => root as usize,
        _ => v as usize,
    };
    let life = lifetimes(&plan.kernels, &plan.levels, root, n);
    let (mut buffers, mut offsets, mut buffer_of) = (Vec::new(), Vec::new(), vec![None; n]);
    for (v, val) in plan.values.iter().enumerate() {
        if let (Home::Arena { offset }, true) = (val.home, life.born[v] != u32::MAX) {
            buffer_of[v] = Some(buffers.len());
            buffers.push(arena_buffer(v, val.layout.numel(), &life));
            offsets.push(offset as u64 * 4);
        }
    }
    let mut problem = memory_planner::Problem::new(buffers);
    for k in &plan.kernels {
        if let Kernel::Fused {
            inputs,
            outputs,
            in_place,
            ..
        } = k
        {
            for &(i, j) in in_place {
                let input = inputs.get(i).and_then(|(v, _)| buffer_of[root(*v)]);
                let output = outputs.get(j).and_then(|&o| buffer_of[o as usize]);
                if let (Some(input), Some(output)) = (input, output) {
                    problem
                        .in_place
                        .push(memory_planner::InPlace { input, output });
                }
            }
        }
    }
    (problem, offsets)
}

/// The planner's buffers: one per value that lives in the arena.
struct ArenaBuffers {
    /// In value order.
    buffers: Vec<memory_planner::Buffer>,
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
            arena.buffer_of[v] = Some(arena.buffers.len());
            arena
                .buffers
                .push(arena_buffer(v, val.layout.numel(), life));
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
#[derive(Clone, Debug)]
pub(crate) struct Solution {
    /// Offset of each buffer of the problem, in bytes.
    pub(crate) offsets: Vec<u64>,
    /// Bytes of the arena.
    pub(crate) arena: u64,
    /// The lower bound of the problem, in bytes.
    pub(crate) lower_bound: u64,
}

/// How the builder's memory step answers the arena's planner problem.
pub(crate) type MemoryStep<'a> = &'a mut dyn FnMut(&memory_planner::Problem) -> Solution;

/// The planner options of a segment's arena: `best` for 50 ms on one thread.
pub(crate) fn options() -> memory_planner::Options {
    memory_planner::Options {
        time_limit: Duration::from_millis(50),
        threads: 1,
        ..memory_planner::Options::default()
    }
}

/// Runs the memory planner ([`options`]). If it fails (never expected), the
/// buffers go one after the other, with no reuse, rather than fail the segment.
pub(crate) fn solve(problem: &memory_planner::Problem) -> Solution {
    let options = options();
    let traced = crate::trace::enabled().then(crate::trace::now);
    let answer = memory_planner::solve(problem, &options);
    if let (Some(start), Ok(p)) = (traced, &answer) {
        crate::trace::memory_planned(start, problem.buffers.len(), p.arena, p.lower_bound);
    }
    match answer {
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
                lower_bound: memory_planner::lower_bound(problem),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::testutil::{add, arena_regions, drop_of, exp, op, plan, staged};
    use crate::fusion::ExecutionPlan;
    use crate::ir::{Op, OpKind};

    fn contiguous(input: u64, output: u64) -> Op {
        op(OpKind::Contiguous, &[input], Some(output))
    }

    /// The in-place pairs of `p`'s fused kernels: (input root, output).
    fn in_place(p: &ExecutionPlan) -> Vec<(u32, u32)> {
        let mut pairs = Vec::new();
        for k in &p.kernels {
            if let Kernel::Fused {
                inputs,
                outputs,
                in_place,
                ..
            } = k
            {
                pairs.extend(in_place.iter().map(|&(i, j)| (inputs[i].0, outputs[j])));
            }
        }
        pairs
    }

    /// No two arena values that are alive at one level share a byte, but an in-place
    /// pair; the arena holds every region.
    fn assert_no_overlap(p: &ExecutionPlan) {
        let n = p.values.len();
        let root = |v: u32| match p.values[v as usize].home {
            Home::View { root } => root as usize,
            _ => v as usize,
        };
        let (mut born, mut last) = (vec![u32::MAX; n], vec![0; n]);
        for (k, &level) in p.kernels.iter().zip(&p.levels) {
            let (ins, outs) = k.io();
            for &o in outs {
                born[o as usize] = level;
                last[o as usize] = last[o as usize].max(level);
            }
            for &i in ins {
                last[root(i)] = last[root(i)].max(level);
            }
        }
        let pairs = in_place(p);
        let regions = arena_regions(p);
        for (x, &(a, a0, a1)) in regions.iter().enumerate() {
            assert!(a1 <= p.arena_len, "{p}");
            for &(b, b0, b1) in &regions[x + 1..] {
                let (a, b) = (a as usize, b as usize);
                let together = born[a] <= last[b] && born[b] <= last[a];
                let shared = a0 < b1 && b0 < a1;
                let paired = pairs.iter().any(|&(i, o)| {
                    (i as usize, o as usize) == (a, b) || (i as usize, o as usize) == (b, a)
                });
                assert!(
                    !(together && shared) || paired,
                    "r{a} and r{b} overlap: {p}"
                );
            }
        }
    }

    /// a, b, c: a line of copies of x, each 16 elements (64 bytes), d kept.
    fn line_of_copies() -> [Op; 7] {
        [
            contiguous(0, 1),
            contiguous(1, 2),
            contiguous(2, 3),
            contiguous(3, 4),
            drop_of(1),
            drop_of(2),
            drop_of(3),
        ]
    }

    /// a = contiguous(x) (arena); b = exp(a) (fused); c = contiguous(b), kept: a dies
    /// where b is made.
    fn dies_in_place() -> [Op; 5] {
        [
            contiguous(0, 1),
            exp(1, 2),
            contiguous(2, 3),
            drop_of(1),
            drop_of(2),
        ]
    }

    #[test]
    fn buffers_are_the_planners_problem_and_the_arena_its_answer() {
        let ops = line_of_copies();
        let st = staged(&ops);
        let life = lifetimes(
            &st.kernels,
            &st.levels,
            |v| st.facts[v as usize].root as usize,
            st.values.len(),
        );
        let arena = arena_buffers(&st.values, &life);
        let buffer = |id: usize, lower: u64| memory_planner::Buffer {
            id,
            lower,
            upper: lower + 2,
            size: 64,
            alignment: 64,
        };
        let expected = vec![buffer(1, 1), buffer(2, 2), buffer(3, 3)];
        assert_eq!(arena.buffers, expected);
        assert_eq!(arena.owners, [1, 2, 3]);
        let answer = memory_planner::solve(
            &memory_planner::Problem::new(expected),
            &memory_planner::Options::default(),
        )
        .unwrap();
        let p = plan(&ops);
        assert_eq!(p.arena_len * 4, answer.arena as usize, "{p}");
        assert_eq!(
            (p.arena_len, p.arena_lower_bound),
            (32, 32),
            "a and c share: {p}"
        );
        assert_eq!(
            p.values[4].home,
            Home::Pooled,
            "an escaping value is pooled"
        );
        assert_no_overlap(&p);
    }

    #[test]
    fn the_problem_found_again_from_a_plan_is_the_one_planned() {
        let ops = line_of_copies();
        let p = plan(&ops);
        let (problem, offsets) = arena_problem(&p);
        let ids: Vec<usize> = problem.buffers.iter().map(|b| b.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(problem.buffers[0].lower..problem.buffers[0].upper, 1..3);
        assert_eq!(
            memory_planner::lower_bound(&problem),
            p.arena_lower_bound as u64 * 4
        );
        let answer = memory_planner::Placement {
            offsets,
            arena: p.arena_len as u64 * 4,
            lower_bound: 0,
            strategy: memory_planner::Strategy::Naive,
        };
        memory_planner::validate(&problem, &answer).unwrap();
        // A pair the plan took is a pair of the problem found again.
        let dies = dies_in_place();
        let (problem, offsets) = arena_problem(&plan(&dies));
        assert_eq!(problem.in_place.len(), 1);
        let pair = problem.in_place[0];
        assert_eq!(offsets[pair.input], offsets[pair.output]);
    }

    #[test]
    fn a_fused_kernel_overwrites_an_input_only_when_it_dies_there() {
        let dies = dies_in_place();
        let p = plan(&dies);
        assert_eq!(in_place(&p), [(1, 2)], "{p}");
        assert_eq!(p.values[1].home, p.values[2].home, "{p}");
        assert_no_overlap(&p);
        // a is read again later (d = a + c): no pair.
        let read_later = [
            contiguous(0, 1),
            exp(1, 2),
            contiguous(2, 3),
            add(1, 3, 4),
            drop_of(1),
            drop_of(2),
        ];
        let p = plan(&read_later);
        assert!(in_place(&p).is_empty(), "{p}");
        assert_no_overlap(&p);
        // a is read by another kernel of the same level (e = contiguous(a)): no pair.
        let read_beside = [
            contiguous(0, 1),
            exp(1, 2),
            contiguous(1, 3),
            contiguous(2, 4),
            drop_of(1),
            drop_of(2),
        ];
        let p = plan(&read_beside);
        assert!(in_place(&p).is_empty(), "{p}");
        assert_no_overlap(&p);
        // a is an input of the segment: not in the arena, no pair.
        let p = plan(&[exp(0, 1), contiguous(1, 2), drop_of(1)]);
        assert!(in_place(&p).is_empty(), "{p}");
    }

    #[test]
    fn live_values_never_overlap_in_a_larger_segment() {
        // 40 ops over 4 inputs, from a fixed LCG: copies, exps, adds and views of
        // earlier values; the last 6 values are kept, the others dropped at the end.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % n
        };
        let mut ops = Vec::new();
        let mut made: Vec<u64> = (0..4).collect();
        for id in 4..44 {
            let a = made[next(made.len() as u64) as usize];
            let b = made[next(made.len() as u64) as usize];
            ops.push(match next(4) {
                0 => contiguous(a, id),
                1 => exp(a, id),
                2 => add(a, b, id),
                _ => op(OpKind::View, &[a], Some(id)),
            });
            made.push(id);
        }
        ops.extend((4..38).map(drop_of));
        let p = plan(&ops);
        assert!(p.arena_len > 0 && p.arena_len >= p.arena_lower_bound, "{p}");
        assert_no_overlap(&p);
    }

    #[test]
    #[should_panic(expected = "overlap")]
    fn the_overlap_check_sees_two_live_values_at_one_offset() {
        // a and b live together (c reads both): put them at one offset.
        let mut p = plan(&[
            contiguous(0, 1),
            contiguous(0, 2),
            add(1, 2, 3),
            drop_of(1),
            drop_of(2),
        ]);
        for v in &mut p.values {
            if let Home::Arena { offset } = &mut v.home {
                *offset = 0;
            }
        }
        assert_no_overlap(&p);
    }
}
