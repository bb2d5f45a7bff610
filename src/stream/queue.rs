//! One stream: its lazy queue of ops, its cursor, and the recording side.
//!
//! A [`Stream`] is a queue behind its own lock. Ops are pushed at the back by the
//! stream's thread; a flush (`flush.rs`) takes a prefix out (all of it, or up to the op
//! that makes a tensor somebody needs) under the lock, lets go of the lock, and runs
//! it. The cursor counts ops taken out so far: an op's absolute position is `cursor +
//! index in the queue`, and a reader whose tensor's op is behind the cursor waits on
//! the tensor's slot ([`Slot::wait_ready`]), not on the stream.
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::flush::{par, RunScratch};
use super::{config, FlushInfo, FlushReason, StreamId};
use crate::error::Error;
use crate::ir::relative::RelativeBuilder;
use crate::ir::{Op, OpKind, TensorDesc};
use crate::kernels::Par;
use crate::reuse::vecs::Spares;
use crate::runtime::{Slot, Task};

/// What a stream keeps of its executed segments so that queuing and taking the next
/// ones allocates nothing (see `crate::reuse`): the emptied vectors of their tasks,
/// and their emptied deques.
#[derive(Debug)]
pub(super) struct TaskSpares {
    descs: Spares<Vec<TensorDesc>>,
    slots: Spares<Vec<Arc<Slot>>>,
    pub(super) ids: Spares<Vec<u32>>,
    pub(super) segments: Spares<VecDeque<Task>>,
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
    pub(super) fn keep(&mut self, task: &mut Task) {
        debug_assert!(task.inputs.is_empty() && task.output.is_none());
        self.descs.keep(std::mem::take(&mut task.op.inputs));
        self.slots.keep(std::mem::take(&mut task.inputs));
        self.ids.keep(std::mem::take(&mut task.rel.inputs));
    }
}

/// A stream's queue and everything its lock guards.
#[derive(Debug, Default)]
pub(super) struct Queue {
    pub(super) ops: VecDeque<Task>,
    pub(super) rel: RelativeBuilder,
    /// Renumbers a prefix of the queue for a partial flush's key.
    pub(super) prefix: RelativeBuilder,
    pub(super) spares: TaskSpares,
    /// The executor's scratch, lent to one running flush at a time.
    pub(super) scratch: Option<RunScratch>,
    /// Ops taken out of the queue so far.
    pub(super) cursor: u64,
    /// Segments taken out whose run has not finished.
    pub(super) in_flight: usize,
    /// First kernel error since the last sync.
    pub(super) error: Option<Error>,
    /// Kernel threads (0: all of the kernel pool's).
    pub(super) threads: usize,
    /// Whether segments run through fused, cached plans.
    pub(super) unfused: bool,
    /// Ops queued before the stream flushes by itself (0: the default).
    limit: usize,
    pub(super) last_flush: Option<FlushInfo>,
    pub(super) closed: bool,
}

/// One stream: a lazy queue of ops behind its own lock.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(super) id: StreamId,
    pub(super) queue: Mutex<Queue>,
    /// Signalled when the last segment in flight has finished its run.
    pub(super) idle: Condvar,
    /// Ops recorded on this stream while open (Drops not counted), readable without
    /// the queue's lock.
    recorded: AtomicUsize,
}

impl Stream {
    /// A new, empty stream.
    pub(crate) fn new(id: StreamId) -> Stream {
        Stream {
            id,
            queue: Mutex::new(Queue::default()),
            idle: Condvar::new(),
            recorded: AtomicUsize::new(0),
        }
    }

    /// The stream's id.
    pub(crate) fn id(&self) -> StreamId {
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

    /// What the last flush ran.
    pub(crate) fn last_flush(&self) -> Option<FlushInfo> {
        self.queue.lock().last_flush
    }

    /// The stable hash of the ops queued now (the key the pending segment would have).
    pub(crate) fn pending_key(&self) -> u64 {
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
