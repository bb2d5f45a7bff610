//! The engine's process-wide controls and counters for Python: `sync`, `stats()` as a
//! dict, the CPU tier, and the timeline (`trace_start`/`trace_stop`, which
//! `streamfuse.trace.start`/`stop` call).

use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use streamfuse::trace::TraceError;

use crate::errors::engine_err;

/// Runs everything the calling thread's stream has queued (without the GIL); raises
/// the first failure of that work.
#[pyfunction]
pub fn sync(py: Python<'_>) -> PyResult<()> {
    py.detach(streamfuse::sync).map_err(engine_err)
}

/// The engine's counters: live and peak tensor bytes, pooled bytes, live streams, ops
/// recorded, segments flushed, and the plan cache's (`plan_cache`: hits,
/// instantiated, misses, plans, instances, evicted, bytes).
#[pyfunction]
pub fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = py.detach(streamfuse::stats);
    let c = s.plan_cache;
    let cache = PyDict::new(py);
    for (k, v) in [
        ("hits", c.hits),
        ("instantiated", c.instantiated),
        ("misses", c.misses),
        ("plans", c.plans),
        ("instances", c.instances),
        ("kernels", c.kernels),
        ("ops", c.ops),
        ("arena_bytes", c.arena_bytes),
        ("evicted", c.evicted),
        ("bytes", c.bytes),
    ] {
        cache.set_item(k, v)?;
    }
    let d = PyDict::new(py);
    for (k, v) in [
        ("live_buffers", s.live_buffers),
        ("live_bytes", s.live_bytes),
        ("peak_bytes", s.peak_bytes),
        ("pooled_bytes", s.pooled_bytes),
        ("live_streams", s.live_streams),
        ("ops_recorded", s.ops_recorded),
        ("segments", s.segments),
        ("kernel_threads", s.kernel_threads),
        ("kernel_threads_allowed", s.kernel_threads_allowed),
    ] {
        d.set_item(k, v)?;
    }
    d.set_item("plan_cache", cache)?;
    Ok(d)
}

/// The CPU tier the kernels run on (`avx512`, `avx2`, `portable`, ...).
#[pyfunction]
pub fn cpu_tier() -> String {
    streamfuse::cpu::tier().to_string()
}

/// Turns fusion on or off for the calling thread's stream (on by default).
#[pyfunction]
pub fn set_fusion(on: bool) {
    streamfuse::set_fusion(on)
}

/// How many kernel threads the calling thread's stream may use.
#[pyfunction]
pub fn set_kernel_threads(threads: usize) {
    streamfuse::set_kernel_threads(threads)
}

/// Turns on or off the cap on kernel threads by the cores other processes leave free
/// (on by default; Linux): with it on, a flush uses no more threads than the machine
/// has idle cores, so a busy neighbour or a second copy of the service does not stall
/// every parallel kernel.
#[pyfunction]
pub fn set_load_aware(on: bool) {
    streamfuse::set_load_aware(on)
}

/// Whether kernel threads are capped by the machine's load (`set_load_aware`).
#[pyfunction]
pub fn load_aware() -> bool {
    streamfuse::load_aware()
}

/// Starts recording a timeline to `path` (Chrome trace JSON, written at `trace_stop`
/// or at exit).
#[pyfunction]
pub fn trace_start(py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
    py.detach(|| streamfuse::trace::start(&path))
        .map_err(trace_err)
}

/// Stops the timeline and writes it; returns the file's path and the events written.
#[pyfunction]
pub fn trace_stop(py: Python<'_>) -> PyResult<(std::path::PathBuf, usize)> {
    let w = py.detach(streamfuse::trace::stop).map_err(trace_err)?;
    Ok((w.path, w.events))
}

/// `OSError` when the file could not be written, `RuntimeError` when the call came at
/// the wrong time (start while recording, stop while not).
fn trace_err(e: TraceError) -> PyErr {
    match e {
        TraceError::Io { .. } => PyOSError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// The most detailed engine log records passed to Python's `logging`: `"off"`,
/// `"error"`, `"warn"`, `"info"` (the default), `"debug"` or `"trace"` (every stream
/// event). A record also needs the Python logger's level to pass.
#[pyfunction]
pub fn set_log_level(level: &str) -> PyResult<()> {
    let filter = level.parse::<log::LevelFilter>().map_err(|_| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "unknown log level {level:?}: expected off, error, warn, info, debug or trace"
        ))
    })?;
    log::set_max_level(filter);
    Ok(())
}
