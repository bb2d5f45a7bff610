//! One stream: its lazy queue of ops, its cursor, and how it flushes.
//!
//! A [`StreamCell`] is a queue behind its own lock. Ops are pushed at the back by the
//! stream's thread; a flush takes a prefix out (all of it, or up to the op that makes
//! a tensor somebody needs) under the lock, lets go of the lock, and runs it. The
//! cursor counts ops taken out so far: an op's absolute position is `cursor + index in
//! the queue`, and a reader whose tensor's op is behind the cursor waits on the
//! tensor's slot ([`Slot::wait_ready`]), not on the stream.
//!
//! Running a segment has two phases. The *run* computes the values, fills the slots of
//! the escaping ones (errors included, a panic included) and reports the flush to the
//! stream (its error, `in_flight` down by one): everything any other thread may wait
//! for. It runs on the kernel pool when the stream may use several threads. The
//! *recycling* then lets go of the tasks' slots and keeps their vectors, on the
//! flushing thread, whose free lists feed its next ops.
//!
//! A stream recycles what its ops need: the vectors of executed tasks go to `TaskSpares`
//! and back into the next ops, the segment's deque is swapped with the queue's rather
//! than copied, and the executor's scratch stays with the stream (a second flush that
//! runs while the first still has it makes its own), so a repeated forward pass
//! queues and runs without allocating.
//!
//! Lock discipline: the queue lock is a leaf. It is held only to push, to take a
//! segment out, and to report or recycle one, never while a kernel runs or while
//! waiting for anything, so no wait can form a cycle through it (ARCHITECTURE.md,
//! "Concurrency model").

use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::{closer, config, StreamId};
use crate::error::Error;
use crate::fusion::{cache, ExecutionPlan};
use crate::ir::relative::RelativeBuilder;
use crate::ir::{Op, OpKind, TensorDesc, TensorId};
use crate::kernels::{teardown, worth_splitting, Par};
use crate::reuse::vecs::Spares;
use crate::runtime::{
    execute, execute_plan, kernel_threads, observer, panic_message, run_in_pool, PlanScratch, Slot,
    SlotState, Task,
};

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
    /// Stable hash of the segment's relative form.
    pub key: u64,
    /// Why it was flushed.
    pub reason: FlushReason,
    /// Whether the segment ran through a plan (fusion on).
    pub planned: bool,
    /// Whether that plan came from the cache.
    pub cache_hit: bool,
    /// Kernels launched.
    pub kernels: usize,
    /// Bytes of the planned arena.
    pub arena_bytes: usize,
    /// The memory planner's lower bound for that arena, in bytes.
    pub arena_lower_bound: usize,
}

/// What a stream keeps of its executed segments so that queuing and taking the next
/// ones allocates nothing (see `crate::reuse`): the emptied vectors of their tasks,
/// and their emptied deques.
#[derive(Debug)]
struct TaskSpares {
    descs: Spares<Vec<TensorDesc>>,
    slots: Spares<Vec<Arc<Slot>>>,
    ids: Spares<Vec<u32>>,
    segments: Spares<VecDeque<Task>>,
}

impl Default for TaskSpares {
    fn default() -> TaskSpares {
        /// The most vectors of each kind kept.
        const VECS: usize = 1 << 14;
        TaskSpares {
            descs: Spares::new(VECS),
            slots: Spares::new(VECS),
            ids: Spares::new(VECS),
            segments: Spares::new(2),
        }
    }
}

impl TaskSpares {
    /// Keeps a finished task's vectors (its slots already released).
    fn keep(&mut self, task: &mut Task) {
        debug_assert!(task.inputs.is_empty() && task.output.is_none());
        self.descs.keep(std::mem::take(&mut task.op.inputs));
        self.slots.keep(std::mem::take(&mut task.inputs));
        self.ids.keep(std::mem::take(&mut task.rel.inputs));
    }
}

/// What a flush runs besides the plan: the executor's scratch and the marks of the
/// values a segment makes (to tell its inputs from its own values).
#[derive(Debug, Default)]
struct RunScratch {
    plan: PlanScratch,
    made: Vec<bool>,
}

#[derive(Debug, Default)]
struct Queue {
    ops: VecDeque<Task>,
    rel: RelativeBuilder,
    /// Renumbers a prefix of the queue for a partial flush's key.
    prefix: RelativeBuilder,
    spares: TaskSpares,
    /// The executor's scratch, lent to one running flush at a time.
    scratch: Option<RunScratch>,
    /// Ops taken out of the queue so far.
    cursor: u64,
    /// Segments taken out whose run has not finished.
    in_flight: usize,
    /// First kernel error since the last sync.
    error: Option<Error>,
    /// Kernel threads (0: all of the kernel pool's).
    threads: usize,
    /// Whether segments run through fused, cached plans.
    unfused: bool,
    /// Ops queued before the stream flushes by itself (0: the default).
    limit: usize,
    last_flush: Option<FlushInfo>,
    closed: bool,
}

/// A segment taken out of its queue, with what running it needs.
struct Segment {
    tasks: VecDeque<Task>,
    scratch: RunScratch,
    info: FlushInfo,
    unfused: bool,
    par: Par,
}

/// One stream: a lazy queue of ops behind its own lock.
#[derive(Debug)]
pub struct StreamCell {
    id: StreamId,
    queue: Mutex<Queue>,
    /// Signalled when the last segment in flight has finished its run.
    idle: Condvar,
    /// Ops recorded on this stream while open (Drops not counted), readable without
    /// the queue's lock.
    recorded: AtomicUsize,
}

impl StreamCell {
    /// A new, empty stream.
    pub(crate) fn new(id: StreamId) -> StreamCell {
        StreamCell {
            id,
            queue: Mutex::new(Queue::default()),
            idle: Condvar::new(),
            recorded: AtomicUsize::new(0),
        }
    }

    /// The stream's id.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Queues an op of `kind` that reads `inputs` (descriptions and slots) and makes
    /// `output`; returns the output's slot. Flushes when the queue reaches its limit.
    pub(crate) fn push<'a>(
        self: &Arc<Self>,
        kind: OpKind,
        inputs: impl Iterator<Item = (&'a TensorDesc, &'a Arc<Slot>)>,
        output: TensorDesc,
    ) -> Arc<Slot> {
        let mut q = self.queue.lock();
        if q.closed {
            super::count_closed_stream_ops(1);
        } else {
            // Written only under the queue lock, so a load and a store suffice; read
            // without the lock by `stats()`.
            let n = self.recorded.load(Ordering::Relaxed);
            self.recorded.store(n + 1, Ordering::Relaxed);
        }
        let mut descs = q.spares.descs.take();
        let mut slots = q.spares.slots.take();
        for (d, s) in inputs {
            descs.push(d.clone());
            slots.push(s.clone());
        }
        let out = Slot::pending(output.id);
        let op = Op {
            kind,
            inputs: descs,
            output: Some(output),
        };
        let full = self.enqueue(&mut q, op, slots, Some(out.clone()));
        // A closed stream (nothing pushes there but a stray thread-local destructor)
        // runs what it is given at once.
        let reason = if q.closed {
            Some(FlushReason::Close)
        } else {
            full.then_some(FlushReason::QueueLimit)
        };
        drop(q);
        if let Some(reason) = reason {
            self.flush(u64::MAX, reason);
        }
        out
    }

    /// Queues the Drop of a tensor whose last handle went away, if the tensor is still
    /// pending here (a tensor already made needs no Drop: its slot frees the data when
    /// the last reader lets go).
    pub(crate) fn push_drop(self: &Arc<Self>, desc: TensorDesc, slot: &Arc<Slot>) {
        if !slot.is_pending() {
            // Made already. Queued reads (here or in other streams) still hold the
            // slot; the buffer is freed when the last of them has run.
            let readers = Arc::strong_count(slot) - 1;
            if readers > 0 {
                log::trace!(
                    "{}: deferred drop of {}: {readers} queued reads still hold it",
                    self.id,
                    desc.id,
                );
            }
            return;
        }
        let mut q = self.queue.lock();
        if q.closed {
            return;
        }
        let mut descs = q.spares.descs.take();
        descs.push(desc);
        // The Drop holds no slot: the op that makes the tensor is queued here too (the
        // tensor is pending), and its task holds the slot until the segment has run.
        let slots = Vec::new(); // no allocation
        let op = Op {
            kind: OpKind::Drop,
            inputs: descs,
            output: None,
        };
        let full = self.enqueue(&mut q, op, slots, None);
        drop(q);
        if full {
            self.flush(u64::MAX, FlushReason::QueueLimit);
        }
    }

    /// Queues `op`; returns whether the queue has reached the stream's limit.
    fn enqueue(
        &self,
        q: &mut Queue,
        op: Op,
        inputs: Vec<Arc<Slot>>,
        output: Option<Arc<Slot>>,
    ) -> bool {
        if let Some(out) = &output {
            out.set_producer(q.cursor + q.ops.len() as u64);
        }
        if log::log_enabled!(log::Level::Trace) {
            log::trace!("{}: register {op}", self.id);
        }
        let ids = q.spares.ids.take();
        let rel = q.rel.push_into(&op, ids);
        q.ops.push_back(Task {
            op,
            inputs,
            output,
            rel,
        });
        let limit = if q.limit == 0 {
            config::DEFAULT_QUEUE_LIMIT
        } else {
            q.limit
        };
        q.ops.len() >= limit
    }

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
            ..
        } = &mut *q;
        let key = if partial {
            prefix.clear();
            for o in ops.iter().take(n) {
                let ids = prefix.push_into(&o.op, spares.ids.take()).inputs;
                spares.ids.keep(ids);
            }
            prefix.hash()
        } else {
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
            scratch: q.scratch.take().unwrap_or_default(),
            info: FlushInfo {
                ops: n,
                key,
                reason,
                planned: !unfused,
                cache_hit: false,
                kernels: n,
                arena_bytes: 0,
                arena_lower_bound: 0,
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
        wait_for_inputs(&tasks, &mut scratch.made);
        let plan = if unfused {
            Ok(None)
        } else {
            let segment = tasks.make_contiguous();
            catch_unwind(AssertUnwindSafe(|| Some(self.plan(segment, &mut info))))
        };
        let work = match &plan {
            Ok(Some(p)) => p.work,
            _ => tasks
                .iter()
                .map(|t| t.op.work())
                .fold(0, usize::saturating_add),
        };
        if par.threads > 1 && worth_splitting(work) {
            // The kernel observer follows the segment to the kernel thread.
            let observe = observer::enabled();
            let records = run_in_pool(|| {
                observer::follow(observe, || {
                    self.run_and_report(&mut tasks, plan, &mut scratch.plan, info, par)
                })
                .1
            });
            observer::keep(records);
        } else {
            let par = Par::serial();
            self.run_and_report(&mut tasks, plan, &mut scratch.plan, info, par);
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
    /// none), fills its escaping slots (a panic, here or while planning, fails the ones
    /// still pending), and reports the flush. Everything another thread may wait for
    /// is done when this returns.
    fn run_and_report(
        &self,
        tasks: &mut VecDeque<Task>,
        plan: std::thread::Result<Option<Arc<ExecutionPlan>>>,
        scratch: &mut PlanScratch,
        info: FlushInfo,
        par: Par,
    ) {
        let tasks = tasks.make_contiguous();
        let outcome = plan.and_then(|plan| {
            catch_unwind(AssertUnwindSafe(|| match plan {
                Some(plan) => execute_plan(&plan, tasks, scratch, par),
                None => execute(tasks.iter_mut(), par),
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
    fn plan(&self, segment: &[Task], info: &mut FlushInfo) -> Arc<ExecutionPlan> {
        let key = info.key;
        let (plan, hit) = cache::get_or_build(key, segment, |t| (&t.op, &t.rel));
        info.cache_hit = hit;
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
            } else {
                log::trace!("{}: plan cache miss for {key:016x}; built {plan}", self.id);
            }
        }
        plan
    }

    /// Blocks until no segment of this stream is running anywhere; returns the queue,
    /// locked.
    fn wait_idle(&self) -> parking_lot::MutexGuard<'_, Queue> {
        let mut q = self.queue.lock();
        while q.in_flight > 0 {
            self.idle.wait(&mut q);
        }
        q
    }

    /// Flushes everything, waits for segments that other threads are running for this
    /// stream, and returns (and clears) the first kernel error since the last sync.
    pub(crate) fn sync(self: &Arc<Self>) -> Result<(), Error> {
        self.flush(u64::MAX, FlushReason::Sync);
        match self.wait_idle().error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Closes the stream when its thread ends: marks it closed (later Drops are not
    /// queued), runs what is pending (on the closer thread during teardown), waits for
    /// segments other threads are running for it, and frees what it kept for queuing.
    pub(crate) fn close(self: &Arc<Self>) {
        {
            let mut q = self.queue.lock();
            if !q.closed {
                super::count_closed_stream_ops(self.recorded.swap(0, Ordering::Relaxed));
            }
            q.closed = true;
        }
        self.flush(u64::MAX, FlushReason::Close);
        // Recycled handles on other threads may keep the cell alive for a while: keep
        // nothing large in it.
        let mut q = self.wait_idle();
        q.spares = TaskSpares::default();
        q.scratch = None;
        q.ops = VecDeque::new();
        q.prefix = RelativeBuilder::default();
        q.rel = RelativeBuilder::default();
        log::trace!("{}: closed", self.id);
    }

    /// Ops recorded on this stream while it was open (Drops not counted).
    pub(crate) fn recorded(&self) -> usize {
        self.recorded.load(Ordering::Relaxed)
    }

    /// Number of ops waiting in the queue.
    pub fn pending(&self) -> usize {
        self.queue.lock().ops.len()
    }

    /// Ops taken out of the queue to run so far.
    pub fn cursor(&self) -> u64 {
        self.queue.lock().cursor
    }

    /// What the last flush ran.
    pub fn last_flush(&self) -> Option<FlushInfo> {
        self.queue.lock().last_flush
    }

    /// The stable hash of the ops queued now (the key the pending segment would have).
    pub fn pending_key(&self) -> u64 {
        self.queue.lock().rel.hash()
    }

    /// Sets how many ops this stream queues before it flushes by itself.
    pub(crate) fn set_queue_limit(&self, n: usize) {
        self.queue.lock().limit = n.max(1);
    }

    /// Turns fused, planned execution on or off for this stream.
    pub(crate) fn set_fusion(&self, on: bool) {
        self.queue.lock().unfused = !on;
    }

    /// The kernel budget of this stream's flushes.
    pub(crate) fn par(&self) -> Par {
        par(self.queue.lock().threads)
    }

    /// Sets the number of threads this stream's kernels may use (0: all).
    pub(crate) fn set_threads(&self, threads: usize) {
        self.queue.lock().threads = threads;
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

/// Fails every output of `tasks` that is still pending with `error` (after a panic,
/// so that no reader waits forever).
fn fail_pending(tasks: &[Task], error: &Error) {
    for slot in tasks.iter().filter_map(|t| t.output.as_ref()) {
        if slot.is_pending() {
            slot.set(SlotState::Failed(error.clone()));
        }
    }
}

/// The thread budget of a flush: 0 means every kernel thread.
fn par(threads: usize) -> Par {
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
    fn a_panicking_fused_kernel_fails_its_outputs_and_nothing_else() {
        panics_become_errors_on_what_the_kernel_made(true);
    }

    #[test]
    fn a_panicking_kernel_of_the_unfused_path_fails_its_output_and_nothing_else() {
        panics_become_errors_on_what_the_kernel_made(false);
    }
}
