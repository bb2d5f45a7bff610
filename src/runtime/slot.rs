//! Slots: where a tensor's data will be, once the op that makes it has run.
//!
//! Every tensor has one [`Slot`], shared (through `Arc`) by its user handles and by every
//! queued op that reads or makes it. The slot starts `Pending`; the executor sets it to
//! `Ready` with the buffer (or `Failed` with the kernel's error). Because queued reads
//! hold the slot, a buffer can never be freed while a pending op still needs it, in this
//! stream or another: the last `Arc` to go frees it. The slot also remembers its home
//! stream and the queue position of the op that makes it, so that a reader elsewhere
//! can drain exactly that far.
//!
//! A slot whose segment is being run by another thread is waited for on the slot
//! itself ([`Slot::wait_ready`]), never on the stream: a flush runs without its
//! stream's lock, so the lock is never what a reader waits for.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::TensorBuffer;
use crate::ir::TensorId;
use crate::reuse::cells::{last_ref, LocalCells};
use crate::Error;

/// Threads blocked in [`Slot::wait_ready`] (so that `set` signals only when needed).
static WAITERS: AtomicUsize = AtomicUsize::new(0);
/// The lock and condition `wait_ready` sleeps on; `set` notifies under the lock, so a
/// waiter that has checked its slot under the lock cannot miss the wake-up.
static SIGNAL_LOCK: Mutex<()> = Mutex::new(());
static SIGNAL: Condvar = Condvar::new();

thread_local! {
    /// Free slots of this thread (state `Pending`), for [`Slot::pending`].
    static FREE_SLOTS: LocalCells<Slot> = const { LocalCells::new() };
}

/// What is known of a tensor's data now.
#[derive(Clone, Debug)]
pub(crate) enum SlotState {
    /// The op that makes it has not run yet.
    Pending,
    /// The data, in a buffer possibly shared with views.
    Ready(Arc<TensorBuffer>),
    /// The op that makes it (or one it depends on) failed with this error.
    Failed(Error),
}

/// The data cell of one tensor.
#[derive(Debug)]
pub(crate) struct Slot {
    /// The tensor's id (atomic only so that a recycled slot can be renamed through a
    /// shared reference).
    id: AtomicU64,
    state: Mutex<SlotState>,
    /// Mirrors `state` being `Pending`, so the hot path can ask without the lock. Set
    /// (with `Release`) only after the state is stored.
    pending: AtomicBool,
    /// Absolute queue position (in the home stream) of the op that makes the tensor;
    /// `u64::MAX` when it was made outside any queue.
    producer: AtomicU64,
}

impl Slot {
    /// A slot whose data is still to be computed.
    pub(crate) fn pending(id: TensorId) -> Arc<Slot> {
        if let Some(cell) = LocalCells::take(&FREE_SLOTS) {
            // Free slots are unique and were reset to a pending state by `release`.
            cell.id.store(id.0, Ordering::Relaxed);
            return cell;
        }
        Arc::new(Slot {
            id: AtomicU64::new(id.0),
            state: Mutex::new(SlotState::Pending),
            pending: AtomicBool::new(true),
            producer: AtomicU64::new(u64::MAX),
        })
    }

    /// A slot that already holds data.
    pub(crate) fn ready(id: TensorId, buffer: TensorBuffer) -> Arc<Slot> {
        Arc::new(Slot {
            id: AtomicU64::new(id.0),
            state: Mutex::new(SlotState::Ready(Arc::new(buffer))),
            pending: AtomicBool::new(false),
            producer: AtomicU64::new(u64::MAX),
        })
    }

    /// The id of the tensor whose data this is.
    pub(crate) fn id(&self) -> TensorId {
        TensorId(self.id.load(Ordering::Relaxed))
    }

    /// A copy of the current state.
    pub(crate) fn state(&self) -> SlotState {
        self.state.lock().clone()
    }

    /// Whether the data is still to be computed.
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Sets the state (the executor's job), and wakes the threads waiting for a slot
    /// when there are any.
    pub(crate) fn set(&self, state: SlotState) {
        let pending = matches!(state, SlotState::Pending);
        *self.state.lock() = state;
        // SeqCst pairs with the waiter's increment of WAITERS and its load of
        // `pending`: either the waiter sees this store, or this load sees the waiter.
        self.pending.store(pending, Ordering::SeqCst);
        if !pending && WAITERS.load(Ordering::SeqCst) > 0 {
            let _guard = SIGNAL_LOCK.lock();
            SIGNAL.notify_all();
        }
    }

    /// Blocks until the slot is no longer pending: the segment that makes it is being
    /// run by some thread, which sets it (to `Ready` or `Failed`, a panic included)
    /// before it lets anyone else wait on it. Returns at once for a slot that is not
    /// pending.
    pub(crate) fn wait_ready(&self) {
        if !self.is_pending() {
            return;
        }
        WAITERS.fetch_add(1, Ordering::SeqCst);
        let mut guard = SIGNAL_LOCK.lock();
        while self.pending.load(Ordering::SeqCst) {
            // Woken by `set`; the timeout only bounds the cost of a missed wake-up.
            SIGNAL.wait_for(&mut guard, Duration::from_millis(50));
        }
        drop(guard);
        WAITERS.fetch_sub(1, Ordering::SeqCst);
    }

    /// Queue position of the producing op in the home stream.
    pub(crate) fn producer(&self) -> u64 {
        self.producer.load(Ordering::Acquire)
    }

    /// Records the queue position of the producing op.
    pub(crate) fn set_producer(&self, pos: u64) {
        self.producer.store(pos, Ordering::Release);
    }
}

impl Slot {
    /// Lets go of one reference to a slot. The last one empties the slot (its buffer is
    /// released as by a drop) and keeps it on this thread's free list for the next
    /// [`Slot::pending`], so a repeated pass makes no new slots.
    pub(crate) fn release(mut slot: Arc<Slot>) {
        let Some(s) = last_ref(&mut slot) else {
            return; // other references remain; this one goes
        };
        s.log_free();
        if let SlotState::Ready(b) = std::mem::replace(s.state.get_mut(), SlotState::Pending) {
            TensorBuffer::release(b);
        }
        *s.pending.get_mut() = true;
        *s.producer.get_mut() = u64::MAX;
        LocalCells::give(&FREE_SLOTS, slot);
    }

    fn log_free(&mut self) {
        if log::log_enabled!(log::Level::Trace) {
            let id = self.id();
            if let SlotState::Ready(b) = self.state.get_mut() {
                if Arc::strong_count(b) == 1 {
                    log::trace!("free {id} ({} elements)", b.len());
                }
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.log_free();
    }
}
