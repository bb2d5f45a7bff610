//! One stream: its lazy queue of ops, its cursor, and how it flushes.
//!
//! A [`StreamCell`] is a queue behind its own lock. Ops are pushed at the back by the
//! stream's thread; a flush pops a prefix (all of it, or up to the op that makes a
//! tensor somebody needs) and runs it on the executor while still holding the lock, so
//! that whoever flushes next sees every earlier op finished. The cursor counts ops
//! executed so far: an op's absolute position is `cursor + index in the queue`.
//!
//! A stream recycles what its ops need: the vectors of executed tasks go to `Spares`
//! and back into the next ops, the segment is swapped out of the queue rather than
//! copied, and the plan executor's scratch stays with the stream, so a repeated forward
//! pass queues and runs without allocating.
//!
//! Lock discipline (why no deadlock is possible): a thread holds at most one stream
//! lock at a time. Running a segment never needs another stream, because an op that
//! reads another stream's pending tensor drains that stream *before* it is queued
//! (see `stream::record`); and nothing that runs under the lock drops a user handle,
//! which would queue a Drop on some stream.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{config, StreamId};
use crate::error::Error;
use crate::fusion::cache;
use crate::ir::relative::{RelativeBuilder, RelativeOp};
use crate::ir::{Op, OpKind, TensorDesc, TensorId};
use crate::kernels::Par;
use crate::runtime::{execute, execute_plan, PlanScratch, Slot, Task};

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

/// Emptied vectors of executed tasks, kept so that queuing the next ops allocates
/// nothing.
#[derive(Debug, Default)]
struct Spares {
    descs: Vec<Vec<TensorDesc>>,
    slots: Vec<Vec<Arc<Slot>>>,
    ids: Vec<Vec<u32>>,
}

impl Spares {
    /// The most vectors of each kind kept.
    const MAX: usize = 1 << 14;

    fn descs(&mut self) -> Vec<TensorDesc> {
        self.descs.pop().unwrap_or_default()
    }

    fn slots(&mut self) -> Vec<Arc<Slot>> {
        self.slots.pop().unwrap_or_default()
    }

    fn ids(&mut self) -> Vec<u32> {
        self.ids.pop().unwrap_or_default()
    }

    /// Lets go of a finished task's slots and keeps its vectors.
    fn keep(&mut self, task: &mut Task) {
        task.release_slots();
        let mut descs = std::mem::take(&mut task.op.inputs);
        let slots = std::mem::take(&mut task.inputs);
        let mut ids = std::mem::take(&mut task.rel.inputs);
        if self.descs.len() < Self::MAX && descs.capacity() > 0 {
            descs.clear();
            self.descs.push(descs);
        }
        if self.slots.len() < Self::MAX && slots.capacity() > 0 {
            self.slots.push(slots); // emptied by release_slots
        }
        if self.ids.len() < Self::MAX && ids.capacity() > 0 {
            ids.clear();
            self.ids.push(ids);
        }
    }
}

#[derive(Debug, Default)]
struct Queue {
    ops: VecDeque<Task>,
    /// The segment being run (empty between flushes; kept for its capacity).
    running: VecDeque<Task>,
    rel: RelativeBuilder,
    /// Renumbers a prefix of the queue for a partial flush's key.
    prefix: RelativeBuilder,
    spares: Spares,
    scratch: PlanScratch,
    /// Ops executed so far.
    cursor: u64,
    /// First kernel error since the last sync.
    error: Option<Error>,
    /// Kernel threads (0: all of rayon's).
    threads: usize,
    /// Whether segments run through fused, cached plans.
    unfused: bool,
    /// Ops queued before the stream flushes by itself (0: the default).
    limit: usize,
    last_flush: Option<FlushInfo>,
    closed: bool,
}

/// One stream: a lazy queue of ops behind its own lock.
#[derive(Debug)]
pub struct StreamCell {
    id: StreamId,
    queue: Mutex<Queue>,
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
            recorded: AtomicUsize::new(0),
        }
    }

    /// The stream's id.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Queues an op of `kind` that reads `inputs` (descriptions and slots) and makes
    /// `output`; returns the output's slot. Flushes when the queue reaches its limit.
    /// On a closed stream the op runs at once.
    pub(crate) fn push<'a>(
        &self,
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
        let mut descs = q.spares.descs();
        let mut slots = q.spares.slots();
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
        self.enqueue(&mut q, op, slots, Some(out.clone()));
        out
    }

    /// Queues the Drop of a tensor whose last handle went away, if the tensor is still
    /// pending here (a tensor already made needs no Drop: its slot frees the data when
    /// the last reader lets go).
    pub(crate) fn push_drop(&self, desc: TensorDesc, slot: &Arc<Slot>) {
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
        let mut descs = q.spares.descs();
        descs.push(desc);
        // The Drop holds no slot: the op that makes the tensor is queued here too (the
        // tensor is pending), and its task holds the slot until the segment has run.
        let slots = Vec::new(); // no allocation
        let op = Op {
            kind: OpKind::Drop,
            inputs: descs,
            output: None,
        };
        self.enqueue(&mut q, op, slots, None);
    }

    /// Queues `op` (or runs it at once on a closed stream), then flushes when the queue
    /// has reached the stream's limit.
    fn enqueue(&self, q: &mut Queue, op: Op, inputs: Vec<Arc<Slot>>, output: Option<Arc<Slot>>) {
        if q.closed {
            let mut task = Task {
                op,
                inputs,
                output,
                rel: RelativeOp::default(),
            };
            if let Some(e) = execute([&mut task], par(q.threads)) {
                q.error.get_or_insert(e);
            }
            q.spares.keep(&mut task);
            return;
        }
        if let Some(out) = &output {
            out.set_producer(q.cursor + q.ops.len() as u64);
        }
        if log::log_enabled!(log::Level::Trace) {
            log::trace!("{}: register {op}", self.id);
        }
        let ids = q.spares.ids();
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
        if q.ops.len() >= limit {
            self.flush_locked(q, u64::MAX, FlushReason::QueueLimit);
        }
    }

    /// Runs every queued op up to and including absolute position `upto` (all of them
    /// for `u64::MAX`).
    pub(crate) fn flush(&self, upto: u64, reason: FlushReason) {
        let mut q = self.queue.lock();
        self.flush_locked(&mut q, upto, reason);
    }

    fn flush_locked(&self, q: &mut Queue, upto: u64, reason: FlushReason) {
        if upto < q.cursor || q.ops.is_empty() {
            return;
        }
        let n = ((upto - q.cursor).saturating_add(1)).min(q.ops.len() as u64) as usize;
        let partial = n < q.ops.len();
        let (unfused, par) = (q.unfused, par(q.threads));
        let Queue {
            ops,
            running,
            rel,
            prefix,
            spares,
            ..
        } = &mut *q;
        let key = if partial {
            prefix.clear();
            for o in ops.iter().take(n) {
                let ids = prefix.push_into(&o.op, spares.ids()).inputs;
                spares.ids.push(ids);
            }
            prefix.hash()
        } else {
            rel.hash()
        };
        let mut info = FlushInfo {
            ops: n,
            key,
            reason,
            planned: !unfused,
            cache_hit: false,
            kernels: n,
            arena_bytes: 0,
            arena_lower_bound: 0,
        };
        log::trace!(
            "{}: flush {n} of {} ops ({reason}), segment {key:016x}",
            self.id,
            ops.len()
        );
        if !running.is_empty() {
            // Left by a flush that panicked (a kernel bug): its ops are gone; let go of
            // their slots so that the queue's numbering starts afresh.
            log::warn!(
                "{}: dropping {} ops of a flush that panicked",
                self.id,
                running.len()
            );
            for task in running.iter_mut() {
                spares.keep(task);
            }
            running.clear();
        }
        rel.clear();
        if partial {
            running.extend(ops.drain(..n));
            for o in ops.iter_mut() {
                let ids = std::mem::take(&mut o.rel.inputs);
                o.rel = rel.push_into(&o.op, ids);
            }
        } else {
            std::mem::swap(ops, running);
        }
        q.cursor += n as u64;
        super::count_segment();
        let Queue {
            running,
            spares,
            scratch,
            ..
        } = &mut *q;
        let error = if unfused {
            execute(running.iter_mut(), par)
        } else {
            self.run_planned(running.make_contiguous(), scratch, &mut info, par)
        };
        for task in running.iter_mut() {
            spares.keep(task);
        }
        running.clear();
        if q.ops.is_empty() {
            // Keep queuing into the deque that has grown to a whole segment.
            std::mem::swap(&mut q.ops, &mut q.running);
        }
        q.last_flush = Some(info);
        if let Some(e) = error {
            q.error.get_or_insert(e);
        }
    }

    /// Runs a segment through its cached plan (fused kernels, planned arena).
    fn run_planned(
        &self,
        segment: &[Task],
        scratch: &mut PlanScratch,
        info: &mut FlushInfo,
        par: Par,
    ) -> Option<Error> {
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
        execute_plan(&plan, segment, scratch, par)
    }

    /// Flushes everything and returns (and clears) the first kernel error since the
    /// last sync.
    pub(crate) fn sync(&self) -> Result<(), Error> {
        let mut q = self.queue.lock();
        self.flush_locked(&mut q, u64::MAX, FlushReason::Sync);
        match q.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Flushes everything and marks the stream closed: later ops run at once.
    pub(crate) fn close(&self) {
        let mut q = self.queue.lock();
        self.flush_locked(&mut q, u64::MAX, FlushReason::Close);
        if !q.closed {
            super::count_closed_stream_ops(self.recorded.swap(0, Ordering::Relaxed));
        }
        q.closed = true;
        // A closed stream runs ops at once: free what it kept for queuing (recycled
        // handles on other threads may keep the cell itself alive for a while).
        q.spares = Spares::default();
        q.scratch = PlanScratch::default();
        q.ops = VecDeque::new();
        q.running = VecDeque::new();
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

    /// Ops executed so far.
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

    /// Sets the number of threads this stream's kernels may use (0: all).
    pub(crate) fn set_threads(&self, threads: usize) {
        self.queue.lock().threads = threads;
    }
}

/// The thread budget of a flush. On a rayon worker thread kernels run serially: a
/// worker that waited inside a parallel kernel could pick up another rayon job of the
/// same thread, which would record on this very stream while its lock is held.
fn par(threads: usize) -> Par {
    if rayon::current_thread_index().is_some() {
        return Par::serial();
    }
    if threads == 0 {
        Par::all()
    } else {
        Par { threads }
    }
}
