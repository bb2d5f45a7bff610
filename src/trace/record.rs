//! Recording trace events: per-thread buffers and what an event holds.
//!
//! Each thread that records gets a buffer of its own (registered once in a global
//! list, so [`take`] finds the buffers of threads that have ended too); recording an
//! event locks only that buffer, which nobody else locks while a trace records. An
//! event stores numbers, `&'static str`s and at most one reference-counted plan (as a
//! [`TracedPlan`]); the strings of the trace are made when it is written (`chrome.rs`),
//! but for a flush's reason, which is put in words when the flush is recorded. Called only when
//! [`super::enabled`] said yes, except [`own_stream`] (once per thread, no allocation).

use std::cell::Cell;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;

use super::plan::{FlushFacts, TracedPlan};

/// The first lane of the kernel pool's threads (stream lanes are the stream ids).
pub(super) const WORKER_LANES: u64 = 1 << 20;

/// One recorded event: a slice of lane `lane` from `start` to `end` (nanoseconds
/// since the process's trace epoch).
pub(super) struct Event {
    pub(super) lane: u64,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) what: What,
}

/// What an [`Event`] was.
pub(super) enum What {
    /// A flush of stream `lane`: its description, its plan (if it had one), the flow
    /// it starts (when another stream drained it) and when its inputs were ready.
    Flush {
        info: FlushFacts,
        plan: Option<Arc<dyn TracedPlan>>,
        flow: Option<u64>,
        ready: u64,
    },
    /// Kernel `index` of `plan`, run for stream `stream`; `op` names a single-op
    /// kernel's op.
    Kernel {
        plan: Arc<dyn TracedPlan>,
        index: u32,
        op: &'static str,
        stream: u64,
    },
    /// An op run on its own by the op-by-op executor (fusion off): its name, bytes
    /// read (through each input's layout) and written.
    Op {
        name: &'static str,
        read: usize,
        written: usize,
    },
    /// A plan built on a cache miss.
    Build { key: u64, plan: Arc<dyn TracedPlan> },
    /// The memory planner's run for a plan being built.
    Memory {
        buffers: usize,
        arena: u64,
        lower_bound: u64,
    },
    /// This lane's stream drained stream `from` for `tensor`; `flow` ends the arrow
    /// from the drained flush.
    Drain { from: u64, tensor: u64, flow: u64 },
}

/// The events of one thread.
#[derive(Default)]
pub(super) struct ThreadBuf {
    pub(super) events: Vec<Event>,
    /// The thread's name (`thread N` for an unnamed one).
    pub(super) thread: String,
    /// The lane of the thread's own stream, once it has one (0 before).
    pub(super) own_lane: u64,
    /// The kernel-pool lane of the thread, if it ran kernels there.
    pub(super) worker_lane: Option<u64>,
}

/// Every thread's buffer (threads that ended included), and the events recorded
/// where a thread's buffer was gone (in thread-local destructors).
static BUFFERS: Mutex<Vec<Arc<Mutex<ThreadBuf>>>> = Mutex::new(Vec::new());
static ORPHANS: Mutex<Vec<Event>> = Mutex::new(Vec::new());
static EPOCH: OnceLock<Instant> = OnceLock::new();
static NEXT_FLOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The calling thread's buffer, registered in [`BUFFERS`] on first use.
struct Local(Arc<Mutex<ThreadBuf>>);

impl Local {
    fn new() -> Local {
        let t = std::thread::current();
        let thread = match t.name() {
            Some(n) => n.to_string(),
            None => {
                let id = format!("{:?}", t.id());
                let n = id.trim_start_matches("ThreadId(").trim_end_matches(')');
                format!("thread {n}")
            }
        };
        let buf = Arc::new(Mutex::new(ThreadBuf {
            thread,
            own_lane: OWN_LANE.with(Cell::get),
            ..ThreadBuf::default()
        }));
        BUFFERS.lock().push(buf.clone());
        Local(buf)
    }
}

thread_local! {
    static LOCAL: Local = Local::new();
    /// The lane of this thread's own stream (0: none yet).
    static OWN_LANE: Cell<u64> = const { Cell::new(0) };
    /// The lane of the segment this thread is flushing (for plan builds).
    static LANE: Cell<u64> = const { Cell::new(0) };
    /// A drain's flow that the next flush on this thread starts.
    static FLOW: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Starts the clock of the traces (once per process).
pub(super) fn epoch() {
    EPOCH.get_or_init(Instant::now);
}

/// Nanoseconds since the trace epoch.
pub(crate) fn now() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Notes that the calling thread's own stream is `lane` (called when a thread opens
/// its stream, tracing or not: one thread-local store).
pub(crate) fn own_stream(lane: u64) {
    let _ = OWN_LANE.try_with(|l| l.set(lane));
}

/// Notes that the calling thread starts running a segment of stream `lane` (plan
/// builds land on that lane); returns the time.
#[cold]
#[inline(never)]
pub(crate) fn segment_start(lane: u64) -> u64 {
    let _ = LANE.try_with(|l| l.set(lane));
    now()
}

fn push(event: Event) {
    let mut event = Some(event);
    let _ = LOCAL.try_with(|l| {
        if let Some(e) = event.take() {
            let mut b = l.0.lock();
            if b.own_lane == 0 {
                b.own_lane = OWN_LANE.try_with(Cell::get).unwrap_or(0);
            }
            b.events.push(e);
        }
    });
    if let Some(e) = event {
        ORPHANS.lock().push(e);
    }
}

/// What a flush needs to record its kernels: its stream's lane and its plan.
#[derive(Clone, Debug)]
pub(crate) struct SegmentTrace {
    /// The stream's lane.
    pub(crate) lane: u64,
    /// The plan the segment runs.
    pub(crate) plan: Arc<dyn TracedPlan>,
}

/// Records a flush of stream `lane` that started at `start` and had its inputs at
/// `ready`; starts the flow of a drain that asked for it on this thread.
pub(crate) fn flush(
    lane: u64,
    start: u64,
    ready: u64,
    info: FlushFacts,
    plan: Option<Arc<dyn TracedPlan>>,
) {
    let flow = FLOW.try_with(Cell::take).ok().flatten();
    push(Event {
        lane,
        start,
        end: now(),
        what: What::Flush {
            info,
            plan,
            flow,
            ready,
        },
    });
}

/// Records kernel `index` of the segment `seg`, run from `start` to now; `op` names
/// the op of a single-op kernel. A kernel run at once with others of its level
/// (`parallel`) goes on the lane of its kernel-pool thread.
pub(crate) fn kernel(
    seg: &SegmentTrace,
    start: u64,
    index: usize,
    op: &'static str,
    parallel: bool,
) {
    let end = now();
    let worker = if parallel {
        rayon::current_thread_index().map(|i| WORKER_LANES + i as u64)
    } else {
        None
    };
    if let Some(w) = worker {
        let _ = LOCAL.try_with(|l| l.0.lock().worker_lane = Some(w));
    }
    push(Event {
        lane: worker.unwrap_or(seg.lane),
        start,
        end,
        what: What::Kernel {
            plan: seg.plan.clone(),
            index: index as u32,
            op,
            stream: seg.lane,
        },
    });
}

/// Records `op`, run on its own for stream `lane` (fusion off) from `start` to now.
pub(crate) fn op(lane: u64, start: u64, op: &crate::ir::Op) {
    let bytes = |d: &crate::ir::TensorDesc| d.layout.numel() * d.dtype.size_in_bytes();
    push(Event {
        lane,
        start,
        end: now(),
        what: What::Op {
            name: op.kind.name(),
            read: op.inputs.iter().map(bytes).sum(),
            written: op.output.as_ref().map_or(0, bytes),
        },
    });
}

/// Records a plan built for segment `key` from `start` to now.
pub(crate) fn plan_built(start: u64, key: u64, plan: Arc<dyn TracedPlan>) {
    push(Event {
        lane: LANE.try_with(Cell::get).unwrap_or(0),
        start,
        end: now(),
        what: What::Build { key, plan },
    });
}

/// Records a run of the memory planner from `start` to now.
pub(crate) fn memory_planned(start: u64, buffers: usize, arena: u64, lower_bound: u64) {
    push(Event {
        lane: LANE.try_with(Cell::get).unwrap_or(0),
        start,
        end: now(),
        what: What::Memory {
            buffers,
            arena,
            lower_bound,
        },
    });
}

/// A drain of another stream under way on this thread.
pub(crate) struct DrainMark {
    start: u64,
    flow: u64,
}

/// Starts a drain: the flush it causes on this thread starts its flow.
pub(crate) fn drain_begin() -> DrainMark {
    let flow = NEXT_FLOW.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let _ = FLOW.try_with(|f| f.set(Some(flow)));
    DrainMark { start: now(), flow }
}

/// Ends a drain of stream `from` for `tensor` by stream `by`: records it, with the end
/// of its flow, if a flush of `from` ran for it (none ran when another thread had taken
/// the tensor's op already).
pub(crate) fn drain_end(mark: DrainMark, by: u64, from: u64, tensor: u64) {
    let unused = FLOW.try_with(Cell::take).ok().flatten();
    if unused == Some(mark.flow) {
        return;
    }
    push(Event {
        lane: by,
        start: mark.start,
        end: now(),
        what: What::Drain {
            from,
            tensor,
            flow: mark.flow,
        },
    });
}

/// Forgets every event recorded so far (a new trace starts).
pub(super) fn clear() {
    for b in BUFFERS.lock().iter() {
        b.lock().events.clear();
    }
    ORPHANS.lock().clear();
}

/// Every thread's events and names, taken out of their buffers; the buffers of threads
/// that have ended are let go.
pub(super) fn take() -> Vec<ThreadBuf> {
    let mut all = BUFFERS.lock();
    let mut out: Vec<ThreadBuf> = all
        .iter()
        .map(|b| {
            let mut b = b.lock();
            ThreadBuf {
                events: std::mem::take(&mut b.events),
                thread: b.thread.clone(),
                own_lane: b.own_lane,
                worker_lane: b.worker_lane,
            }
        })
        .collect();
    all.retain(|b| Arc::strong_count(b) > 1);
    out.push(ThreadBuf {
        events: std::mem::take(&mut *ORPHANS.lock()),
        thread: "thread exit".to_string(),
        ..ThreadBuf::default()
    });
    out
}
