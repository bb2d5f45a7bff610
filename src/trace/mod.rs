//! The timeline: a Chrome trace of what every stream ran, and pictures of the memory
//! plans it ran.
//!
//! This module owns recording engine events for a timeline and writing them out. When a
//! trace is recording (`STREAMFUSE_TRACE=path.json` in the environment, or [`start`])
//! the engine notes, in a buffer of the thread that sees it, each flush (its reason,
//! segment key, cache hit or miss, op and kernel counts, arena bytes), each kernel of a
//! planned segment (its kind, the ops it fused, bytes read and written), each plan
//! build and memory planning, and each drain of another stream. [`stop`], or the end of
//! the process, writes them as a Chrome trace event file (the JSON that Perfetto and
//! `chrome://tracing` open): one lane per stream, named after its thread, with the
//! flushes as slices, the kernels inside them, and an arrow from a drained stream's
//! flush to the stream that needed its tensor. Kernels that run at once on the kernel
//! pool get a lane per pool thread. Beside the trace, a folder `<name>.plans/` holds an
//! SVG picture of each memory plan the flushes ran (see
//! [`crate::memory_planner::svg`]); a flush's `plan_svg` argument
//! names its picture.
//!
//! Off, recording costs one relaxed atomic load per flush and allocates nothing. On,
//! an event is a few numbers pushed onto the thread's own buffer (its lock is never
//! contended while recording), and a kernel event holds its plan by reference count, so
//! a trace keeps the plans it ran alive until it is written. `log` narration
//! (`RUST_LOG=streamfuse=trace`) is separate and unchanged.
//!
//! [`crate::plan_svg`] (or [`FlushInfo::plan_svg`](crate::FlushInfo::plan_svg)) draws
//! the memory plan of a segment whenever its plan is in the plan cache, tracing or not.
//!
//! This module is a leaf: it knows no plan or stream type. A plan is recorded as a
//! `TracedPlan` (which `fusion` implements) and a flush as plain `FlushFacts`, so
//! the modules that record into it never meet it again on their way down.

mod chrome;
mod plan;
mod record;

pub(crate) use plan::{FlushFacts, KernelSummary, PlanSummary, TracedPlan};
pub(crate) use record::{
    drain_begin, drain_end, flush, kernel, memory_planned, now, op, own_stream, plan_built,
    segment_start, SegmentTrace,
};

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Once;

use parking_lot::Mutex;

/// The environment variable that starts a trace at the first flush: its value is the
/// path of the trace file, written at [`stop`] or when the process exits.
pub const ENV: &str = "STREAMFUSE_TRACE";

/// `STATE` before the environment was read.
const UNKNOWN: u8 = 0;
/// `STATE` when not recording.
const OFF: u8 = 1;
/// `STATE` while recording.
const ON: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// The file the recording trace goes to.
static SESSION: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Whether a trace is recording: one relaxed atomic load (the environment is read once,
/// the first time).
#[inline]
pub(crate) fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => from_env(),
    }
}

/// Reads [`ENV`] once and starts a trace if it names a file.
#[cold]
fn from_env() -> bool {
    static READ: Once = Once::new();
    READ.call_once(|| match std::env::var_os(ENV) {
        Some(path) if !path.is_empty() => {
            if let Err(e) = start(&path) {
                log::error!("{ENV}: no trace recorded: {e}");
                eprintln!("streamfuse: {ENV}: no trace recorded: {e}");
                let _ = STATE.compare_exchange(UNKNOWN, OFF, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        _ => {
            let _ = STATE.compare_exchange(UNKNOWN, OFF, Ordering::Relaxed, Ordering::Relaxed);
        }
    });
    STATE.load(Ordering::Relaxed) == ON
}

/// Why a trace could not be started or written.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceError {
    /// [`start`] was called while a trace was recording.
    AlreadyRecording {
        /// The file of the trace that is recording.
        path: PathBuf,
    },
    /// [`stop`] was called while no trace was recording.
    NotRecording,
    /// The trace file (or a plan picture beside it) could not be written.
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::AlreadyRecording { path } => {
                write!(f, "a trace is already recording to {}", path.display())
            }
            TraceError::NotRecording => f.write_str("no trace is recording"),
            TraceError::Io { path, message } => {
                write!(f, "cannot write {}: {message}", path.display())
            }
        }
    }
}

impl std::error::Error for TraceError {}

/// What [`stop`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The trace file.
    pub path: PathBuf,
    /// Events recorded (slices and flow ends; lane names not counted).
    pub events: usize,
    /// The folder of plan pictures, when at least one was written.
    pub plans: Option<PathBuf>,
    /// How many plan pictures it holds.
    pub plan_pictures: usize,
}

/// Starts recording a timeline to `path` (a Chrome trace event file, written at
/// [`stop`] or when the process exits). The file is created now, so a path that cannot
/// be written fails here; so does a second `start` while a trace is recording.
/// Events recorded before a `stop` never leak into the next trace.
pub fn start(path: impl AsRef<Path>) -> Result<(), TraceError> {
    let path = path.as_ref().to_path_buf();
    let mut session = SESSION.lock();
    if let Some(p) = &*session {
        return Err(TraceError::AlreadyRecording { path: p.clone() });
    }
    std::fs::File::create(&path).map_err(|e| io_error(&path, e))?;
    record::clear();
    record::epoch();
    write_at_exit();
    *session = Some(path);
    STATE.store(ON, Ordering::Relaxed);
    Ok(())
}

/// Stops recording and writes the trace file, and the pictures of the plans its
/// flushes ran in a folder beside it (`trace.json` → `trace.plans/`, at most
/// [`MAX_PLAN_PICTURES`] of them). Events that threads are still recording when it
/// stops are left out.
pub fn stop() -> Result<Written, TraceError> {
    let (path, collected) = {
        // Taken under the session's lock, so that a `start` meanwhile cannot clear them.
        let mut session = SESSION.lock();
        let path = session.take().ok_or(TraceError::NotRecording)?;
        STATE.store(OFF, Ordering::Relaxed);
        (path, record::take())
    };
    chrome::write(&path, collected)
}

/// Whether a trace is recording now.
pub fn is_recording() -> bool {
    STATE.load(Ordering::Relaxed) == ON
}

/// The most plan pictures [`stop`] writes beside a trace (the first plans met, by
/// segment key); flushes of other plans name their key but no picture.
pub const MAX_PLAN_PICTURES: usize = 256;

fn io_error(path: &Path, e: std::io::Error) -> TraceError {
    TraceError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Writes the trace when the process exits, if it is still recording then (registered
/// once, by the first [`start`]).
fn write_at_exit() {
    extern "C" {
        /// The C library's: runs `f` when the process exits (`exit`, or `main`
        /// returning), after the main thread's thread-local destructors.
        fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    }
    extern "C" fn at_exit() {
        // Never unwind into the C library.
        let _ = std::panic::catch_unwind(|| {
            if is_recording() {
                match stop() {
                    Ok(w) => log::debug!("trace written to {}", w.path.display()),
                    Err(e) => eprintln!("streamfuse: trace not written: {e}"),
                }
            }
        });
    }
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: `atexit` is the C standard library's (std links the C library on
        // every platform it supports) with this signature. `at_exit` uses the C ABI,
        // takes nothing, never unwinds (it catches panics) and touches only statics,
        // which live until the process ends, never a thread-local. Tested by
        // `tests/trace.rs`, `the_trace_is_written_when_the_process_exits`.
        if unsafe { atexit(at_exit) } != 0 {
            log::warn!("cannot write the trace at exit: call streamfuse::trace::stop()");
        }
    });
}
