//! Streams: one lazy queue of ops per thread, and how ops reach it.
//!
//! Every thread that records an op gets its own stream ([`Stream`]), found through
//! a thread-local. Recording touches only that stream, unless an input is still
//! pending in another stream: then that stream is first drained up to the op that
//! makes the input, on the recording thread (`record`). When the thread ends, its
//! stream is closed: what it still has pending is handed to the closer thread
//! ([`closer`]) and run there, never inside the thread-local destructor, so nothing it
//! queued is lost or leaks.
//!
//! Tensor data lives in slots shared by handles and queued ops (see
//! [`crate::runtime::Slot`]), so the order of drops between threads can never free a
//! buffer that a pending op still reads: the buffer goes when its last reader has run.

mod closer;
mod flush;
mod queue;
mod read;

pub use flush::{FlushInfo, FlushReason};
pub(crate) use queue::Stream;
pub(crate) use read::{copy_out, materialize};

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::Result;
use crate::ir::{OpKind, TensorDesc};
use crate::runtime::Slot;

/// The id of a stream (one per thread that records ops).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream{}", self.0)
    }
}

/// Engine-wide settings.
pub(crate) mod config {
    /// Ops a stream queues before it flushes by itself, unless set per stream.
    pub(crate) const DEFAULT_QUEUE_LIMIT: usize = 4096;
}

static REGISTRY: Mutex<Option<HashMap<StreamId, Weak<Stream>>>> = Mutex::new(None);
static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);
static SEGMENTS: AtomicUsize = AtomicUsize::new(0);
/// Ops recorded by streams that have closed (open streams count their own).
static CLOSED_OPS: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn count_closed_stream_ops(n: usize) {
    CLOSED_OPS.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn count_segment() {
    SEGMENTS.fetch_add(1, Ordering::Relaxed);
}

fn new_stream() -> Arc<Stream> {
    closer::start();
    let id = StreamId(NEXT_STREAM.fetch_add(1, Ordering::Relaxed));
    let cell = Arc::new(Stream::new(id));
    REGISTRY
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(id, Arc::downgrade(&cell));
    log::trace!("{id}: opened");
    cell
}

/// The calling thread's stream; closes it when the thread ends.
struct LocalStream(Arc<Stream>);

impl Drop for LocalStream {
    fn drop(&mut self) {
        // From here on, whatever this thread flushes runs on the closer thread.
        crate::kernels::teardown::mark();
        self.0.close();
        if let Some(map) = REGISTRY.lock().as_mut() {
            map.remove(&self.0.id());
        }
    }
}

thread_local! {
    static LOCAL: LocalStream = {
        let cell = new_stream();
        crate::trace::own_stream(cell.id().0);
        LocalStream(cell)
    };
}

/// Calls `f` with the calling thread's stream. During thread teardown, when the
/// thread-local is gone, `f` gets a fresh stream that is closed right after (what it
/// queued runs on the closer thread).
pub(crate) fn with_current<R>(f: impl FnOnce(&Arc<Stream>) -> R) -> R {
    // Asking first costs a second thread-local lookup, and keeps `f` for the fallback.
    if LOCAL.try_with(|_| ()).is_ok() {
        return LOCAL.with(|s| f(&s.0));
    }
    crate::kernels::teardown::mark();
    let cell = new_stream();
    let r = f(&cell);
    cell.close();
    if let Some(map) = REGISTRY.lock().as_mut() {
        map.remove(&cell.id());
    }
    r
}

/// Whether `id` is the calling thread's own stream (false during teardown).
pub(crate) fn is_current(id: StreamId) -> bool {
    LOCAL.try_with(|s| s.0.id() == id).unwrap_or(false)
}

/// Queues an op of `kind` on the calling thread's stream and returns `made` called on
/// the output's slot and that stream. `inputs` gives each input's description, slot and
/// home stream; an input still pending in another stream first drains that stream up
/// to the op that makes it (so this stream never waits on another while holding its
/// own lock).
pub(crate) fn record<'a, I, R>(
    kind: OpKind,
    inputs: I,
    output: TensorDesc,
    made: impl FnOnce(Arc<Slot>, &Arc<Stream>) -> R,
) -> R
where
    I: Iterator<Item = (&'a TensorDesc, &'a Arc<Slot>, &'a Arc<Stream>)> + Clone,
{
    with_current(|cell| {
        for (desc, slot, home) in inputs.clone() {
            if home.id() != cell.id() && slot.is_pending() {
                log::trace!("{}: drains {} for {}", cell.id(), home.id(), desc.id);
                read::drain(
                    home,
                    slot,
                    FlushReason::Drain {
                        by: cell.id(),
                        tensor: desc.id,
                    },
                );
            }
        }
        let out = cell.push(kind, inputs.map(|(d, s, _)| (d, s)), output);
        made(out, cell)
    })
}

pub(crate) fn current() -> Arc<Stream> {
    with_current(|c| c.clone())
}

/// Runs every op queued on the calling thread's stream and returns the first error a
/// kernel reported since the last sync (errors found when ops are recorded are returned
/// by the ops themselves).
pub fn sync() -> Result<()> {
    with_current(|c| c.sync())
}

/// Sets how many ops the calling thread's stream queues before it flushes by itself
/// (default 4096; at least 1).
pub fn set_queue_limit(n: usize) {
    with_current(|c| c.set_queue_limit(n))
}

/// Turns fusion, the plan cache and planned arenas on (the default) or off for the
/// calling thread's stream. Off, each op runs as its own kernel with pooled buffers:
/// the reference the fused path is tested and measured against.
pub fn set_fusion(on: bool) {
    with_current(|c| c.set_fusion(on))
}

/// Sets how many threads the kernels of the calling thread's stream may use: 1 runs
/// every kernel on the thread that flushes (the right choice when several streams run
/// at once, one per core); 0 (the default) lets large segments use all of the
/// engine's kernel threads (its own rayon pool, one thread per core, shared by every
/// stream and never by the user's rayon jobs).
pub fn set_kernel_threads(threads: usize) {
    with_current(|c| c.set_threads(threads))
}

/// What the last flush of the calling thread's stream ran.
pub fn last_flush() -> Option<FlushInfo> {
    with_current(|c| c.last_flush())
}

/// The stable key of the ops now pending on the calling thread's stream (the relative
/// form's hash; the same program on other tensors has the same key).
pub fn pending_key() -> u64 {
    with_current(|c| c.pending_key())
}

/// Counters of the engine as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineStats {
    /// Buffers alive now (held by tensors or queued ops).
    pub live_buffers: usize,
    /// Bytes held by live buffers.
    pub live_bytes: usize,
    /// The most tensor memory in use at once since the last `reset_peak_bytes`.
    pub peak_bytes: usize,
    /// Bytes of free storage kept by the pool for reuse (buffers and arenas).
    pub pooled_bytes: usize,
    /// Plan-cache counters.
    pub plan_cache: crate::fusion::cache::CacheStats,
    /// Streams open now (threads that recorded ops and have not ended).
    pub live_streams: usize,
    /// Ops recorded since the process started.
    pub ops_recorded: usize,
    /// Segments flushed since the process started.
    pub segments: usize,
    /// The engine's kernel threads (its pool: one per core, started by the first flush
    /// worth several threads; 1 when it could not start).
    pub kernel_threads: usize,
    /// The most kernel threads a flush may use now: `kernel_threads`, or fewer while
    /// other processes keep some of this process's cores busy (`set_load_aware`).
    pub kernel_threads_allowed: usize,
}

/// Starts a new peak-memory measurement (see [`EngineStats::peak_bytes`]).
pub fn reset_peak_bytes() {
    crate::runtime::reset_peak_bytes()
}

/// A snapshot of the engine's counters.
pub fn stats() -> EngineStats {
    let streams: Vec<Arc<Stream>> = REGISTRY
        .lock()
        .as_ref()
        .map_or_else(Vec::new, |m| m.values().filter_map(Weak::upgrade).collect());
    let kernel_threads = crate::runtime::kernel_threads_unstarted();
    EngineStats {
        live_buffers: crate::runtime::live_buffers(),
        live_bytes: crate::runtime::live_bytes(),
        peak_bytes: crate::runtime::peak_bytes(),
        pooled_bytes: crate::runtime::pooled_bytes() + crate::runtime::pooled_arena_bytes(),
        plan_cache: crate::fusion::cache::stats(),
        live_streams: REGISTRY.lock().as_ref().map_or(0, |m| m.len()),
        ops_recorded: CLOSED_OPS.load(Ordering::Relaxed)
            + streams.iter().map(|s| s.recorded()).sum::<usize>(),
        segments: SEGMENTS.load(Ordering::Relaxed),
        kernel_threads,
        kernel_threads_allowed: crate::runtime::allowed(kernel_threads),
    }
}
