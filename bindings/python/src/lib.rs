//! `streamfuse._streamfuse`, the native module of the `streamfuse` Python package:
//! the engine's lazy [`Tensor`](tensor::PyTensor), the sentence [`Embedder`] and
//! [`Reranker`](streamfuse::embedder::Reranker) (native halves; the
//! sentence-transformers-style methods are in python/streamfuse), the engine's
//! controls and counters, and its errors as Python exceptions. Every call that can
//! run engine work releases the GIL first, so Python threads run at once, each on its
//! own stream. The engine's `log` records go to Python's `logging` (logger
//! `streamfuse` and its children, by module path) through `pyo3-log`, from `info` up
//! unless `set_log_level` says otherwise.
//!
//! [`Embedder`]: streamfuse::embedder::Embedder

mod convert;
mod embed;
mod engine;
mod errors;
mod tensor;

use pyo3::prelude::*;

#[pymodule]
fn _streamfuse(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The bridge is set once per process; a second import (a subinterpreter) keeps
    // the first, so its error is ignored. It passes every level, but `log`'s own
    // maximum starts at `info` (`engine::set_log_level` changes it): the engine's
    // debug and trace narration then costs nothing, and never waits for the GIL.
    let bridge = pyo3_log::Logger::new(m.py(), pyo3_log::Caching::LoggersAndLevels)?
        .filter(log::LevelFilter::Trace);
    if bridge.install().is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    errors::register(m)?;
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<embed::PyEmbedder>()?;
    m.add_class::<embed::PyReranker>()?;
    m.add_function(wrap_pyfunction!(engine::sync, m)?)?;
    m.add_function(wrap_pyfunction!(engine::stats, m)?)?;
    m.add_function(wrap_pyfunction!(engine::cpu_tier, m)?)?;
    m.add_function(wrap_pyfunction!(engine::set_fusion, m)?)?;
    m.add_function(wrap_pyfunction!(engine::set_kernel_threads, m)?)?;
    m.add_function(wrap_pyfunction!(engine::set_load_aware, m)?)?;
    m.add_function(wrap_pyfunction!(engine::load_aware, m)?)?;
    m.add_function(wrap_pyfunction!(engine::trace_start, m)?)?;
    m.add_function(wrap_pyfunction!(engine::trace_stop, m)?)?;
    m.add_function(wrap_pyfunction!(engine::set_log_level, m)?)?;
    Ok(())
}
