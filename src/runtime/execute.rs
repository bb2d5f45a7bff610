//! Running a cached [`ExecutionPlan`] on one segment's slots.
//!
//! The plan says where every value lives ([`Home`]); this module makes it so. Segment
//! inputs are read from their slots. Values planned in the arena are slices of one
//! `Vec<f32>` taken from a pool for the segment and given back after it: for each
//! level the arena is split into the output regions of its kernels (written) and the
//! gaps between them (read), so the borrow checker itself proves that a kernel never
//! reads what any kernel of its level writes; an input region that straddles an
//! output region is a planning bug and fails the kernel with an error rather than
//! reading torn data. Kernels of a level run one after the other, or halved across
//! `rayon::join` when the stream may use several threads. Values that escape get
//! pooled buffers, and their slots are filled at the end. A failed input fails every
//! kernel downstream of it, with the same error. Memory that cannot be allocated (the
//! arena, or a kernel's pooled output) fails the kernels that would write it with
//! [`Error::OutOfMemory`], like any other kernel failure; the others run.
//!
//! All bookkeeping lives in a [`PlanScratch`] that the stream keeps between segments,
//! so replaying a cached plan allocates nothing.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::containment;
use super::dispatch::{caught, run_kernel};
use super::memory::{give_back_arena, segment_done, take_arena};
use super::observer;
use super::storage::AllocError;
use super::{Data, Slot, SlotState, Task, TensorBuffer};
use crate::error::Error;
use crate::fusion::{ExecutionPlan, Home, Kernel};
use crate::ir::Layout;
use crate::kernels::{KernelError, PackedRhs, Par};
use crate::reuse::retype::retype;
use crate::trace::{self, SegmentTrace};

/// Scratch vectors of [`execute_plan`], kept by a stream between its segments so that
/// replaying a cached plan allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct PlanScratch {
    /// Per value: the task and input position (`u32::MAX`: the output) of its slot.
    slot_at: Vec<Option<(u32, u32)>>,
    /// Buffers of inputs and pooled values, by relative id.
    bufs: Vec<Option<Arc<TensorBuffer>>>,
    /// The error of each failed value.
    failed: Vec<Option<Error>>,
    /// Kernels of the current level that run.
    runnable: Vec<usize>,
    /// Arena regions `(start, len)` written by the current level, kernel by kernel.
    writes: Vec<(usize, usize)>,
    /// Per runnable kernel: its index, arena outputs and pooled outputs.
    jobs: Vec<Job>,
    /// Pooled outputs of the current level, kernel by kernel.
    pooled: Vec<(u32, Arc<TensorBuffer>)>,
    /// One result per runnable kernel.
    results: Vec<Result<(), KernelError>>,
    /// Sort order of `writes` while carving.
    order: Vec<usize>,
    /// The allocation of the carved output slices, kept between levels as plain
    /// numbers of their size and alignment (`Option<&mut [f32]>`; see `retype`).
    outs: Vec<(usize, usize)>,
    /// The same for the carved read-only gaps (`(usize, &[f32])`).
    gaps: Vec<(usize, usize, usize)>,
    /// Zeros read in place of failed inputs by kernels that still make some outputs
    /// which do not depend on them (empty unless something failed).
    zeros: Vec<f32>,
    /// Per runnable kernel of the level: its outputs that depend on a failed input,
    /// as `(output, error)`; filled only when a kernel has failed inputs.
    tainted: Vec<(u32, Error)>,
    /// Why the segment has no arena, when it needs one the system refused.
    no_arena: Option<AllocError>,
    /// The first allocation failure of the current level (its kernels did not run).
    alloc_failed: Option<Error>,
}

/// One kernel of a level: its index in the plan and how many arena and pooled outputs
/// it writes.
#[derive(Clone, Copy, Debug)]
struct Job {
    kernel: usize,
    arena: usize,
    pooled: usize,
}

/// Splits `arena` into the regions `writes` (`(start, len)`, pairwise disjoint; put in
/// `out` in the order of `writes`) and the read-only gaps between them (with their
/// start offsets, into `gaps`).
fn carve<'a>(
    arena: &'a mut [f32],
    writes: &[(usize, usize)],
    order: &mut Vec<usize>,
    out: &mut Vec<Option<&'a mut [f32]>>,
    gaps: &mut Vec<(usize, &'a [f32])>,
) -> Result<(), KernelError> {
    order.clear();
    order.extend(0..writes.len());
    if writes.len() > 1 {
        order.sort_unstable_by_key(|&i| writes[i].0);
    }
    out.clear();
    out.resize_with(writes.len(), || None);
    gaps.clear();
    let mut rest = arena;
    let mut at = 0;
    for &i in order.iter() {
        let (start, len) = writes[i];
        if start < at || start + len > at + rest.len() {
            return Err(KernelError(format!(
                "arena region {start}+{len} overlaps another output or leaves the arena (planning bug)"
            )));
        }
        let (gap, tail) = rest.split_at_mut(start - at);
        let (w, tail) = tail.split_at_mut(len);
        gaps.push((at, &*gap));
        out[i] = Some(w);
        rest = tail;
        at = start + len;
    }
    gaps.push((at, &*rest));
    Ok(())
}

/// The read-only region `start..start + len` of a carved arena.
fn read<'a>(
    gaps: &[(usize, &'a [f32])],
    start: usize,
    len: usize,
) -> Result<&'a [f32], KernelError> {
    gaps.iter()
        .find(|(at, g)| start >= *at && start + len <= at + g.len())
        .map(|(at, g)| &g[start - at..start - at + len])
        .ok_or_else(|| {
            KernelError(format!(
                "arena region {start}+{len} is read while a kernel writes it (planning bug)"
            ))
        })
}

/// What the kernels of one level read: the plan, the segment's ops, the buffers of
/// inputs and pooled values, and the arena's read-only gaps.
pub(super) struct Reads<'a, 'g> {
    pub(super) plan: &'a ExecutionPlan,
    pub(super) tasks: &'a [Task],
    bufs: &'a [Option<Arc<TensorBuffer>>],
    gaps: &'a [(usize, &'g [f32])],
    /// Read in place of a failed value that has no buffer (see `PlanScratch::zeros`).
    zeros: &'a [f32],
    failed: &'a [Option<Error>],
    /// Where to record each kernel, while a trace records.
    trace: Option<&'a SegmentTrace>,
}

/// The value whose buffer value `v` reads.
pub(super) fn root(plan: &ExecutionPlan, v: u32) -> usize {
    match plan.values[v as usize].home {
        Home::View { root } => root as usize,
        _ => v as usize,
    }
}

/// The arena region `(offset, len)` of root `r`, if it is planned in the arena.
pub(super) fn region(plan: &ExecutionPlan, r: usize) -> Option<(usize, usize)> {
    match plan.values[r].home {
        Home::Arena { offset } => Some((offset, plan.values[r].layout.numel())),
        _ => None,
    }
}

impl<'a> Reads<'a, '_> {
    /// The packed form of value `v` read through `layout` as the right operand of a
    /// product, when `v` is (a view of) a segment input, a weight, whose buffer has one
    /// or makes one now (`TensorBuffer::packed_rhs`).
    pub(super) fn packed_rhs(&self, v: u32, layout: &Layout) -> Option<&'a PackedRhs>
    where
        Self: 'a,
    {
        let r = root(self.plan, v);
        if !matches!(self.plan.values[r].home, Home::Input) {
            return None;
        }
        self.bufs[r].as_ref()?.packed_rhs(layout, false)
    }

    /// The elements of value `v`'s root, from a buffer or the carved arena.
    pub(super) fn data(&self, v: u32) -> Result<Data<'a>, KernelError>
    where
        Self: 'a,
    {
        let r = root(self.plan, v);
        if let Some((start, len)) = region(self.plan, r) {
            return Ok(Data::F32(read(self.gaps, start, len)?));
        }
        match (&self.bufs[r], &self.failed[r]) {
            (Some(b), _) => Ok(b.data()),
            // Only read by kernels whose outputs that depend on it are failed anyway.
            (None, Some(_)) => Ok(Data::F32(self.zeros)),
            (None, None) => Err(KernelError(format!(
                "value r{r} has no buffer (engine bug)"
            ))),
        }
    }
}

/// Runs `plan` for the segment `tasks` (whose relative forms the plan was made from);
/// fills the slots of escaping values. Returns the first kernel error. `scratch` holds
/// the bookkeeping between calls (no allocation once it has grown to the plan). With
/// `trace` (a trace records), each kernel is recorded.
pub(crate) fn execute_plan(
    plan: &ExecutionPlan,
    tasks: &[Task],
    scratch: &mut PlanScratch,
    par: Par,
    trace: Option<&SegmentTrace>,
) -> Option<Error> {
    let n = plan.values.len();
    let s = &mut *scratch;
    s.slot_at.clear();
    s.slot_at.resize(n, None);
    s.bufs.clear();
    s.bufs.resize(n, None);
    s.failed.clear();
    s.failed.resize(n, None);
    for (t, task) in tasks.iter().enumerate() {
        // (Drops hold no slots.)
        for (pos, &v) in task.rel.inputs.iter().enumerate().take(task.inputs.len()) {
            s.slot_at[v as usize].get_or_insert((t as u32, pos as u32));
        }
        if let (Some(_), Some(v)) = (&task.output, task.rel.output) {
            s.slot_at[v as usize] = Some((t as u32, u32::MAX));
        }
    }
    let slot = |at: Option<(u32, u32)>| -> Option<&Arc<Slot>> {
        let (t, pos) = at?;
        let task = &tasks[t as usize];
        if pos == u32::MAX {
            task.output.as_ref()
        } else {
            task.inputs.get(pos as usize)
        }
    };
    for v in 0..n {
        if plan.values[v].home == Home::Input {
            match slot(s.slot_at[v]).map(|s| s.state()) {
                Some(SlotState::Ready(b)) => s.bufs[v] = Some(b),
                Some(SlotState::Failed(e)) => s.failed[v] = Some(e),
                _ => {
                    s.failed[v] = Some(Error::Kernel {
                        op: "segment",
                        msg: format!("input r{v} was never computed (engine bug)"),
                    })
                }
            }
        }
    }
    let arena = take_arena(plan.arena_len);
    s.no_arena = arena.as_ref().err().copied();
    s.alloc_failed = None;
    let mut arena = arena.unwrap_or_default();
    let mut first_error = None;
    let observe = observer::enabled();
    let mut k = 0;
    while k < plan.kernels.len() {
        // One level: kernels that depend only on earlier levels.
        let mut end = k + 1;
        while end < plan.kernels.len() && plan.levels[end] == plan.levels[k] {
            end += 1;
        }
        s.runnable.clear();
        s.tainted.clear();
        for (i, kernel) in plan.kernels[k..end].iter().enumerate() {
            let (ins, outs) = kernel.io();
            if ins.iter().any(|&v| s.failed[root(plan, v)].is_some()) {
                // Only the outputs computed from a failed input fail; a fused kernel
                // still makes the others (reading zeros for what failed).
                let before = s.tainted.len();
                let all = containment::taint(plan, kernel, &s.failed, &mut s.tainted);
                if all {
                    for (o, e) in s.tainted.drain(before..) {
                        s.failed[o as usize] = Some(e);
                    }
                    continue;
                }
                containment::make_zeros(plan, kernel, &s.failed, &mut s.zeros);
            }
            if observe {
                observer::record(plan, k + i, ins, outs, |v| root(plan, v) as u32);
            }
            s.runnable.push(k + i);
        }
        run_level(plan, tasks, s, arena.elements(), par, trace);
        if let Some(e) = s.alloc_failed.take() {
            first_error.get_or_insert(e);
        }
        for (&ki, result) in s.runnable.iter().zip(s.results.drain(..)) {
            let Err(e) = result else { continue };
            let kernel = &plan.kernels[ki];
            let name = kernel_name(plan, tasks, ki);
            let e = Error::Kernel { op: name, msg: e.0 };
            log::debug!("kernel error: {e}");
            first_error.get_or_insert_with(|| e.clone());
            for &o in kernel.io().1 {
                s.failed[o as usize] = Some(e.clone());
            }
        }
        // Outputs made from a failed input: failed with its error (a kernel error
        // above came first and wins).
        for (o, e) in s.tainted.drain(..) {
            s.failed[o as usize].get_or_insert(e);
        }
        k = end;
    }
    s.no_arena = None;
    give_back_arena(arena);
    segment_done();
    for v in 0..n {
        let (Some(slot), true) = (slot(s.slot_at[v]), plan.values[v].escapes) else {
            continue;
        };
        let r = root(plan, v as u32);
        let state = match (&s.failed[v], &s.failed[r], &s.bufs[r]) {
            (Some(e), _, _) | (_, Some(e), _) => SlotState::Failed(e.clone()),
            (_, _, Some(b)) => SlotState::Ready(b.clone()),
            _ => SlotState::Failed(Error::Kernel {
                op: "segment",
                msg: format!("escaping value r{v} was not made (engine bug)"),
            }),
        };
        slot.set(state);
    }
    // Let go of the segment's buffers now (the slots hold what escapes).
    for b in s.bufs.iter_mut() {
        if let Some(b) = b.take() {
            TensorBuffer::release(b);
        }
    }
    s.failed.iter_mut().for_each(|e| *e = None);
    first_error
}

/// The op name that errors of kernel `k` carry.
fn kernel_name(plan: &ExecutionPlan, tasks: &[Task], k: usize) -> &'static str {
    match &plan.kernels[k] {
        Kernel::Op { op, .. } => tasks[*op].op.kind.name(),
        Kernel::Fused { .. } | Kernel::Chain(_) => "fused",
    }
}

/// Runs the kernels `scratch.runnable` of one level: carves the arena once for all
/// their outputs, then runs them one after the other, or at once on rayon when the
/// stream may use several threads. Leaves one result per kernel in `scratch.results`
/// and the level's pooled outputs in `scratch.bufs`. A kernel whose outputs cannot be
/// allocated is taken out of `runnable` without running; its outputs fail with
/// [`Error::OutOfMemory`] (in `scratch.failed`, the first such error in
/// `scratch.alloc_failed`).
fn run_level(
    plan: &ExecutionPlan,
    tasks: &[Task],
    scratch: &mut PlanScratch,
    arena: &mut [f32],
    par: Par,
    trace: Option<&SegmentTrace>,
) {
    let PlanScratch {
        bufs,
        failed,
        runnable,
        writes,
        jobs,
        pooled,
        results,
        order,
        outs,
        gaps,
        zeros,
        no_arena,
        alloc_failed,
        ..
    } = scratch;
    // Arena outputs are carved out; the others get pooled buffers.
    writes.clear();
    jobs.clear();
    pooled.clear();
    let mut i = 0;
    while i < runnable.len() {
        let k = runnable[i];
        let (w, p) = (writes.len(), pooled.len());
        match place_outputs(plan, k, *no_arena, writes, pooled) {
            Ok(()) => {
                jobs.push(Job {
                    kernel: k,
                    arena: writes.len() - w,
                    pooled: pooled.len() - p,
                });
                i += 1;
            }
            Err(e) => {
                writes.truncate(w);
                pooled
                    .drain(p..)
                    .for_each(|(_, b)| TensorBuffer::release(b));
                let e = e.error(kernel_name(plan, tasks, k));
                log::debug!("kernel not run: {e}");
                for &o in plan.kernels[k].io().1 {
                    failed[o as usize] = Some(e.clone());
                }
                alloc_failed.get_or_insert(e);
                runnable.remove(i);
            }
        }
    }
    results.clear();
    results.resize_with(jobs.len(), || Ok(()));
    let mut carved_outs: Vec<Option<&mut [f32]>> = retype(std::mem::take(outs));
    let mut carved_gaps: Vec<(usize, &[f32])> = retype(std::mem::take(gaps));
    match carve(arena, writes, order, &mut carved_outs, &mut carved_gaps) {
        Err(e) => results.iter_mut().for_each(|r| *r = Err(e.clone())),
        Ok(()) => {
            let reads = Reads {
                plan,
                tasks,
                bufs,
                gaps: &carved_gaps,
                zeros,
                failed,
                trace,
            };
            let parallel = jobs.len() > 1 && par.threads > 1;
            run_jobs(
                &reads,
                jobs,
                &mut carved_outs,
                pooled,
                results,
                parallel,
                par,
            );
        }
    }
    *outs = retype(carved_outs);
    *gaps = retype(carved_gaps);
    for (o, b) in pooled.drain(..) {
        bufs[o as usize] = Some(b);
    }
}

/// Places the outputs of kernel `k`: arena regions go to `writes`, the others get
/// pooled buffers in `pooled` (in the kernel's output order). Fails when a buffer
/// cannot be allocated, or an output belongs in the arena and the segment has none
/// (`no_arena`, the arena's allocation failure).
fn place_outputs(
    plan: &ExecutionPlan,
    k: usize,
    no_arena: Option<AllocError>,
    writes: &mut Vec<(usize, usize)>,
    pooled: &mut Vec<(u32, Arc<TensorBuffer>)>,
) -> Result<(), AllocError> {
    for &o in plan.kernels[k].io().1 {
        match region(plan, o as usize) {
            Some(r) => match no_arena {
                Some(e) => return Err(e),
                None => writes.push(r),
            },
            None => {
                let val = &plan.values[o as usize];
                pooled.push((o, TensorBuffer::shared(val.dtype, val.layout.numel())?));
            }
        }
    }
    Ok(())
}

/// Runs `jobs`, whose arena outputs are `outs` and pooled outputs `pooled` (job after
/// job), writing one result each; halves them across rayon (`join`, which needs no
/// allocation) when `parallel`, with serial kernels.
fn run_jobs(
    reads: &Reads<'_, '_>,
    jobs: &[Job],
    outs: &mut [Option<&mut [f32]>],
    pooled: &mut [(u32, Arc<TensorBuffer>)],
    results: &mut [Result<(), KernelError>],
    parallel: bool,
    par: Par,
) {
    if parallel && jobs.len() > 1 {
        let mid = jobs.len() / 2;
        let na: usize = jobs[..mid].iter().map(|j| j.arena).sum();
        let np: usize = jobs[..mid].iter().map(|j| j.pooled).sum();
        let (j0, j1) = jobs.split_at(mid);
        let (o0, o1) = outs.split_at_mut(na);
        let (p0, p1) = pooled.split_at_mut(np);
        let (r0, r1) = results.split_at_mut(mid);
        rayon::join(
            || run_jobs(reads, j0, o0, p0, r0, true, Par::serial()),
            || run_jobs(reads, j1, o1, p1, r1, true, Par::serial()),
        );
        return;
    }
    let (mut outs, mut pooled) = (outs, pooled);
    for (job, result) in jobs.iter().zip(results) {
        let (o, rest) = std::mem::take(&mut outs).split_at_mut(job.arena);
        let (p, prest) = std::mem::take(&mut pooled).split_at_mut(job.pooled);
        (outs, pooled) = (rest, prest);
        let kernel = &reads.plan.kernels[job.kernel];
        let start = reads.trace.map(|_| trace::now());
        *result = catch_unwind(AssertUnwindSafe(|| run_kernel(reads, kernel, o, p, par)))
            .unwrap_or_else(|panic| Err(caught(&*panic)));
        if let (Some(seg), Some(start)) = (reads.trace, start) {
            let op = kernel_name(reads.plan, reads.tasks, job.kernel);
            trace::kernel(seg, start, job.kernel, op, parallel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_separates_writes_from_reads() {
        let mut arena: Vec<f32> = (0..10).map(|x| x as f32).collect();
        let (mut order, mut w, mut gaps) = (Vec::new(), Vec::new(), Vec::new());
        carve(&mut arena, &[(6, 2), (1, 2)], &mut order, &mut w, &mut gaps).unwrap();
        assert_eq!(w[0].as_deref(), Some(&[6.0, 7.0][..]));
        assert_eq!(w[1].as_deref(), Some(&[1.0, 2.0][..]));
        w[0].as_mut().unwrap()[0] = -1.0;
        assert_eq!(read(&gaps, 3, 3).unwrap(), &[3.0, 4.0, 5.0]);
        assert!(read(&gaps, 5, 2).is_err(), "straddles a write");
        drop((w, gaps));
        let (mut w, mut gaps) = (Vec::new(), Vec::new());
        assert!(
            carve(&mut arena, &[(0, 4), (3, 2)], &mut order, &mut w, &mut gaps).is_err(),
            "overlapping writes"
        );
        let (mut w, mut gaps) = (Vec::new(), Vec::new());
        assert!(
            carve(&mut arena, &[(8, 4)], &mut order, &mut w, &mut gaps).is_err(),
            "past the end"
        );
    }

    /// `run_level` keeps the carved vectors' allocations as `PlanScratch::outs` and
    /// `gaps`: `retype` must reuse them (a mismatch would allocate on every level).
    #[test]
    fn kept_carving_vectors_are_reused() {
        let s = PlanScratch {
            outs: Vec::with_capacity(4),
            gaps: Vec::with_capacity(4),
            ..PlanScratch::default()
        };
        let (outs, gaps) = (s.outs.as_ptr() as usize, s.gaps.as_ptr() as usize);
        let carved_outs: Vec<Option<&mut [f32]>> = retype(s.outs);
        let carved_gaps: Vec<(usize, &[f32])> = retype(s.gaps);
        assert_eq!(carved_outs.as_ptr() as usize, outs);
        assert_eq!(carved_gaps.as_ptr() as usize, gaps);
        assert_eq!((carved_outs.capacity(), carved_gaps.capacity()), (4, 4));
    }
}
