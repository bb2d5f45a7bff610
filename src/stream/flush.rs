//! Flushing a stream: taking a segment out of its queue, running it, reporting it.
//!
//! Running a segment has two phases. The *run* computes the values, fills the slots of
//! the escaping ones (errors included, a panic included) and reports the flush to the
//! stream (its error, `in_flight` down by one): everything any other thread may wait
//! for. It runs on the kernel pool when the stream may use several threads. The
//! *recycling* then lets go of the tasks' slots and keeps their vectors, on the
//! flushing thread, whose free lists feed its next ops.

use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::queue::Queue;
use super::{closer, Stream, StreamId};
use crate::error::Error;
use crate::fusion::{cache, ExecutionPlan};
use crate::ir::TensorId;
use crate::kernels::{teardown, worth_splitting, Par};
use crate::runtime::{
    execute, execute_plan, kernel_threads, observer, panic_message, room, run_in_pool, PlanScratch,
    SlotState, Task,
};
use crate::trace::SegmentTrace;

/// Why a stream's queue was flushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushReason {
    /// A tensor of this stream was read (`to_vec`).
    Read(TensorId),
    /// `streamfuse::sync()` was called.
    Sync,
    /// The queue reached its length limit.
    QueueLimit,
    /// Another stream needed a tensor this stream had not made yet.
    Drain {
        /// The stream that needed it.
        by: StreamId,
        /// The tensor it needed.
        tensor: TensorId,
    },
    /// The stream's thread ended.
    Close,
}

impl FlushReason {
    /// The reason's short name (`read`, `sync`, `queue limit`, `drained`, `close`).
    pub fn name(&self) -> &'static str {
        match self {
            FlushReason::Read(_) => "read",
            FlushReason::Sync => "sync",
            FlushReason::QueueLimit => "queue limit",
            FlushReason::Drain { .. } => "drained",
            FlushReason::Close => "close",
        }
    }
}

impl fmt::Display for FlushReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlushReason::Read(t) => write!(f, "read of {t}"),
            FlushReason::Sync => f.write_str("sync"),
            FlushReason::QueueLimit => f.write_str("queue limit"),
            FlushReason::Drain { by, tensor } => write!(f, "drained by {by} for {tensor}"),
            FlushReason::Close => f.write_str("stream closed"),
        }
    }
}

/// What the last flush of a stream ran: for logs, tests and the plan cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushInfo {
    /// Ops in the segment (Drop ops included).
    pub ops: usize,
    /// Stable hash of the segment's relative form: its structure (ops and the equality
    /// pattern of its layout numbers), the same for every sequence length that keeps
    /// that pattern (see `ir::relative` in ARCHITECTURE.md).
    pub key: u64,
    /// Why it was flushed.
    pub reason: FlushReason,
    /// Whether the segment ran through a plan (fusion on).
    pub planned: bool,
    /// Whether that plan was stored for this structure and these symbol values (a
    /// hit of [`crate::CacheStats`]).
    pub cache_hit: bool,
    /// Whether it was instantiated from the stored structure for new symbol values
    /// (an instantiation of [`crate::CacheStats`]). Neither this nor `cache_hit`: a
    /// full build.
    pub instantiated: bool,
    /// Kernels launched.
    pub kernels: usize,
    /// Bytes of the planned arena.
    pub arena_bytes: usize,
    /// The memory planner's lower bound for that arena, in bytes.
    pub arena_lower_bound: usize,
    /// The threads its kernels could use: the stream's budget (`set_kernel_threads`),
    /// capped by the cores other processes left free (`set_load_aware`); 1 for a
    /// segment too small to split, which runs on the flushing thread.
    pub kernel_threads: usize,
}

impl FlushInfo {
    /// An SVG picture of the memory plan of this segment's structure as first built
    /// (its arena buffers over the plan's levels; see [`crate::plan_svg`]; the
    /// symbol values of that first build, not necessarily this segment's), while the
    /// plan cache holds the structure.
    pub fn plan_svg(&self) -> Option<String> {
        crate::fusion::plan_svg(self.key)
    }

    /// What the timeline records of this flush.
    fn facts(&self) -> crate::trace::FlushFacts {
        crate::trace::FlushFacts {
            reason: self.reason.to_string(),
            reason_name: self.reason.name(),
            key: self.key,
            cache_hit: self.cache_hit,
            planned: self.planned,
            ops: self.ops,
            kernels: self.kernels,
            arena_bytes: self.arena_bytes,
            arena_lower_bound: self.arena_lower_bound,
            kernel_threads: self.kernel_threads,
        }
    }
}

/// What a flush runs besides the plan: the executor's scratch and the marks of the
/// values a segment makes (to tell its inputs from its own values).
#[derive(Debug, Default)]
pub(super) struct RunScratch {
    plan: PlanScratch,
    made: Vec<bool>,
    /// The segment's symbol values (see [`crate::ir::relative`]).
    symbols: Vec<usize>,
}

/// A segment taken out of its queue, with what running it needs.
struct Segment {
    tasks: VecDeque<Task>,
    scratch: RunScratch,
    info: FlushInfo,
    unfused: bool,
    par: Par,
}

impl Stream {
    /// Runs every queued op up to and including absolute position `upto` (all of them
    /// for `u64::MAX`). Ops already taken out by another flush are not waited for:
    /// a reader waits on the slot it needs. During the calling thread's teardown the
    /// segment runs on the closer thread (kernels must not run there).
    pub(crate) fn flush(self: &Arc<Self>, upto: u64, reason: FlushReason) {
        if teardown::in_teardown() {
            let cell = self.clone();
            closer::run_and_wait(move || cell.flush_here(upto, reason));
            return;
        }
        self.flush_here(upto, reason);
    }

    fn flush_here(&self, upto: u64, reason: FlushReason) {
        let segment = self.take(&mut self.queue.lock(), upto, reason);
        if let Some(segment) = segment {
            self.run(segment);
        }
    }

    /// Takes the ops up to `upto` out of the queue (none if that op has been taken
    /// already): the segment to run, counted in flight.
    fn take(&self, q: &mut Queue, upto: u64, reason: FlushReason) -> Option<Segment> {
        if upto < q.cursor || q.ops.is_empty() {
            return None;
        }
        let n = ((upto - q.cursor).saturating_add(1)).min(q.ops.len() as u64) as usize;
        let partial = n < q.ops.len();
        let (unfused, par) = (q.unfused, par(q.threads));
        let mut tasks = q.spares.segments.take();
        let Queue {
            ops,
            rel,
            prefix,
            spares,
            scratch,
            ..
        } = &mut *q;
        let mut scratch = scratch.take().unwrap_or_default();
        scratch.symbols.clear();
        let key = if partial {
            prefix.clear();
            for o in ops.iter().take(n) {
                let ids = prefix.push_into(&o.op, spares.ids.take()).inputs;
                spares.ids.keep(ids);
            }
            scratch.symbols.extend_from_slice(prefix.symbols());
            prefix.hash()
        } else {
            scratch.symbols.extend_from_slice(rel.symbols());
            rel.hash()
        };
        log::trace!(
            "{}: flush {n} of {} ops ({reason}), segment {key:016x}",
            self.id,
            ops.len()
        );
        rel.clear();
        if partial {
            tasks.extend(ops.drain(..n));
            for o in ops.iter_mut() {
                let ids = std::mem::take(&mut o.rel.inputs);
                o.rel = rel.push_into(&o.op, ids);
            }
        } else {
            // Keep queuing into a deque that has room; run the one that holds the ops.
            std::mem::swap(ops, &mut tasks);
        }
        q.cursor += n as u64;
        q.in_flight += 1;
        super::count_segment();
        Some(Segment {
            tasks,
            scratch,
            info: FlushInfo {
                ops: n,
                key,
                reason,
                planned: !unfused,
                cache_hit: false,
                instantiated: false,
                kernels: n,
                arena_bytes: 0,
                arena_lower_bound: 0,
                kernel_threads: 1,
            },
            unfused,
            par,
        })
    }

    /// Runs a segment taken out of the queue: waits for the inputs that other flushes
    /// are still making, finds its plan, runs it (on the kernel pool when the stream
    /// may use several threads and the segment has the work for them), then recycles
    /// its tasks.
    fn run(&self, segment: Segment) {
        let Segment {
            mut tasks,
            mut scratch,
            mut info,
            unfused,
            par,
        } = segment;
        // One relaxed load when no trace records.
        let traced = crate::trace::enabled().then(|| crate::trace::segment_start(self.id.0));
        wait_for_inputs(&tasks, &mut scratch.made);
        let ready = traced.map(|_| crate::trace::now());
        let plan = if unfused {
            Ok(Ok(None))
        } else {
            let segment = tasks.make_contiguous();
            let symbols = &scratch.symbols;
            catch_unwind(AssertUnwindSafe(|| {
                self.plan(segment, symbols, &mut info).map(Some)
            }))
        };
        let work = match &plan {
            Ok(Ok(Some(p))) => p.work,
            _ => tasks
                .iter()
                .map(|t| crate::ops::work(&t.op))
                .fold(0, usize::saturating_add),
        };
        let seg = match (traced, &plan) {
            (Some(_), Ok(Ok(Some(p)))) => Some(SegmentTrace {
                lane: self.id.0,
                plan: p.clone() as Arc<dyn crate::trace::TracedPlan>,
            }),
            _ => None,
        };
        // The stream's budget, capped by the cores other processes leave free.
        let par = if par.threads > 1 && worth_splitting(work) {
            Par {
                threads: room(par.threads),
            }
        } else {
            Par::serial()
        };
        info.kernel_threads = par.threads;
        if par.threads > 1 {
            // The kernel observer follows the segment to the kernel thread.
            let observe = observer::enabled();
            let records = run_in_pool(par.threads, || {
                observer::follow(observe, || {
                    let seg = seg.as_ref();
                    self.run_and_report(&mut tasks, plan, &mut scratch.plan, info, par, seg)
                })
                .1
            });
            observer::keep(records);
        } else {
            let seg = seg.as_ref();
            self.run_and_report(&mut tasks, plan, &mut scratch.plan, info, par, seg);
        }
        if let (Some(start), Some(ready)) = (traced, ready) {
            let plan = seg.map(|s| s.plan);
            crate::trace::flush(self.id.0, start, ready, info.facts(), plan);
        }
        for task in tasks.iter_mut() {
            task.release_slots();
        }
        let mut q = self.queue.lock();
        for task in tasks.iter_mut() {
            q.spares.keep(task);
        }
        tasks.clear();
        if q.ops.is_empty() && q.ops.capacity() < tasks.capacity() {
            std::mem::swap(&mut q.ops, &mut tasks);
        }
        if !q.closed {
            q.spares.segments.keep(tasks);
        }
        if q.scratch.is_none() && !q.closed {
            q.scratch = Some(scratch);
        }
    }

    /// The run of a segment: computes it (through `plan`, or op by op when there is
    /// none), fills its escaping slots (a panic, here or while planning, or a plan that
    /// could not be built, fails the ones still pending), and reports the flush.
    /// Everything another thread may wait for is done when this returns. With `trace`
    /// (a trace records and the segment has a plan) the executor records each kernel;
    /// the op-by-op executor records each op while a trace records.
    fn run_and_report(
        &self,
        tasks: &mut VecDeque<Task>,
        plan: std::thread::Result<Result<Option<Arc<ExecutionPlan>>, Error>>,
        scratch: &mut PlanScratch,
        info: FlushInfo,
        par: Par,
        trace: Option<&SegmentTrace>,
    ) {
        let tasks = tasks.make_contiguous();
        let outcome = plan.and_then(|plan| {
            catch_unwind(AssertUnwindSafe(|| match plan {
                Ok(Some(plan)) => execute_plan(&plan, tasks, scratch, par, trace),
                // (Fusion off: the reference path, checked again here.)
                Ok(None) => execute(
                    tasks.iter_mut(),
                    par,
                    crate::trace::enabled().then_some(self.id.0),
                ),
                Err(e) => {
                    log::error!("{}: no plan for a segment: {e}", self.id);
                    fail_pending(tasks, &e);
                    Some(e)
                }
            }))
        });
        let error = outcome.unwrap_or_else(|panic| {
            let e = Error::Kernel {
                op: "segment",
                msg: format!("panicked: {}", panic_message(&*panic)),
            };
            log::error!("{}: a segment panicked: {e}", self.id);
            fail_pending(tasks, &e);
            // The run may have stopped holding buffers in the scratch: keep none of it.
            *scratch = PlanScratch::default();
            Some(e)
        });
        self.report(info, error);
    }

    /// Records a finished run: its description and error, one less in flight.
    fn report(&self, info: FlushInfo, error: Option<Error>) {
        let mut q = self.queue.lock();
        q.last_flush = Some(info);
        if let Some(e) = error {
            q.error.get_or_insert(e);
        }
        q.in_flight -= 1;
        if q.in_flight == 0 {
            self.idle.notify_all();
        }
    }

    /// The segment's plan, from the cache (built on a miss); notes it in `info`.
    fn plan(
        &self,
        segment: &[Task],
        symbols: &[usize],
        info: &mut FlushInfo,
    ) -> Result<Arc<ExecutionPlan>, Error> {
        let key = info.key;
        let (plan, lookup) = cache::get_or_build(key, symbols, segment, |t| (&t.op, &t.rel))?;
        let hit = lookup == cache::Lookup::Hit;
        info.cache_hit = hit;
        info.instantiated = lookup == cache::Lookup::Instantiated;
        info.kernels = plan.kernel_count();
        info.arena_bytes = plan.arena_bytes();
        info.arena_lower_bound = plan.arena_lower_bound * 4;
        if log::log_enabled!(log::Level::Trace) {
            if hit {
                log::trace!(
                    "{}: plan cache hit for {key:016x}: {} ops -> {} kernels, arena {} B",
                    self.id,
                    plan.ops,
                    plan.kernel_count(),
                    plan.arena_bytes()
                );
            } else if info.instantiated {
                log::trace!(
                    "{}: plan for {key:016x} instantiated at {symbols:?}; {plan}",
                    self.id
                );
            } else {
                log::trace!("{}: plan cache miss for {key:016x}; built {plan}", self.id);
            }
        }
        Ok(plan)
    }
}

/// Waits for every input of `tasks` that is still pending and not made by the
/// segment itself: such an input is being made by another flush that has taken its
/// op out of a queue already (a drain always takes the producer before its reader is
/// queued), so the wait ends. `made` marks the segment's own values by relative id.
/// Waiting here, before the segment enters the kernel pool, keeps the pool's workers
/// from ever blocking.
fn wait_for_inputs(tasks: &VecDeque<Task>, made: &mut Vec<bool>) {
    made.clear();
    for task in tasks {
        for (slot, &v) in task.inputs.iter().zip(&task.rel.inputs) {
            if slot.is_pending() && !made.get(v as usize).copied().unwrap_or(false) {
                slot.wait_ready();
            }
        }
        if let Some(v) = task.rel.output {
            let v = v as usize;
            if made.len() <= v {
                made.resize(v + 1, false);
            }
            made[v] = true;
        }
    }
}

/// Fails every output of `tasks` that is still pending with `error` (after a panic or
/// a plan that could not be built, so that no reader waits forever).
fn fail_pending(tasks: &[Task], error: &Error) {
    for slot in tasks.iter().filter_map(|t| t.output.as_ref()) {
        if slot.is_pending() {
            slot.set(SlotState::Failed(error.clone()));
        }
    }
}

/// The thread budget of a flush: 0 means every kernel thread.
pub(super) fn par(threads: usize) -> Par {
    if threads == 0 {
        Par {
            threads: kernel_threads(),
        }
    } else {
        Par { threads }
    }
}

#[cfg(test)]
mod tests {
    use crate::runtime::fault::panic_next_kernel;
    use crate::{Error, Tensor};

    fn panics_become_errors_on_what_the_kernel_made(fusion: bool) {
        crate::set_fusion(fusion);
        crate::set_kernel_threads(1); // the kernel runs on this thread
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
        let ok = x.affine(2.0, 0.0).unwrap();
        ok.to_vec::<f32>().unwrap();
        panic_next_kernel();
        let bad = x.exp().unwrap().affine(1.0, 1.0).unwrap();
        match bad.to_vec::<f32>() {
            Err(Error::Kernel { msg, .. }) => assert!(msg.contains("injected kernel panic")),
            other => panic!("expected the panic as an error, got {other:?}"),
        }
        assert!(crate::sync().is_err(), "sync reports it");
        // The stream is usable and earlier results are intact.
        assert_eq!(ok.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
        let y = x.affine(1.0, 1.0).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(y, vec![2.0, 3.0, 4.0, 5.0]);
        crate::sync().unwrap();
    }

    #[test]
    fn a_plan_that_cannot_be_built_fails_the_segment_like_a_kernel_error() {
        crate::set_fusion(true);
        crate::set_kernel_threads(1); // the plan is built on this thread
                                      // Dims no other test uses, so that the segment misses the plan cache.
        let x = Tensor::from_vec((0..21).map(|i| i as f32).collect(), &[3, 7]).unwrap();
        let ok = x.affine(2.0, 0.0).unwrap();
        crate::fusion::testutil::break_next_build();
        let bad = x.exp().unwrap().affine(1.0, 1.0).unwrap();
        match bad.to_vec::<f32>() {
            Err(Error::Internal { msg }) => assert!(msg.contains("injected"), "{msg}"),
            other => panic!("expected an internal error, got {other:?}"),
        }
        assert!(
            matches!(ok.to_vec::<f32>(), Err(Error::Internal { .. })),
            "ok was in the same segment"
        );
        assert!(crate::sync().is_err(), "sync reports it");
        // The stream is usable and the next build works.
        let y = x.affine(1.0, 1.0).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(y[..3], [1.0, 2.0, 3.0]);
        crate::sync().unwrap();
    }

    #[test]
    fn a_panicking_fused_kernel_fails_its_outputs_and_nothing_else() {
        panics_become_errors_on_what_the_kernel_made(true);
    }

    #[test]
    fn a_panicking_kernel_of_the_unfused_path_fails_its_output_and_nothing_else() {
        panics_become_errors_on_what_the_kernel_made(false);
    }
}
