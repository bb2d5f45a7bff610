//! Engine errors as Python exceptions, one rule for the whole package: an engine
//! [`Error`] or an [`EmbedError`] becomes `ValueError` when the caller's arguments were
//! at fault (shapes, dtypes, dims, values, texts, settings, the model folder),
//! `MemoryError` when the system refused an allocation, and `RuntimeError` otherwise
//! (a kernel that failed, an internal error, worker threads). The message is always
//! the engine's own. Dtype errors are [`DTypeError`], a `ValueError` that is also a
//! `TypeError`, so either `except` catches them.

use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use streamfuse::embedder::EmbedError;
use streamfuse::Error;

pyo3::create_exception!(
    _streamfuse,
    DTypeError,
    PyValueError,
    "A dtype an operation cannot take (a ValueError that is also a TypeError)."
);

/// Which Python exception an engine error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Value,
    DType,
    Memory,
    Runtime,
}

/// The class of `e` under the module's rule.
fn class(e: &Error) -> Class {
    match e {
        Error::DType { .. } => Class::DType,
        Error::Shape { .. } | Error::Dim { .. } | Error::Arg { .. } => Class::Value,
        Error::OutOfMemory { .. } => Class::Memory,
        Error::Kernel { .. } | Error::Internal { .. } => Class::Runtime,
    }
}

/// An exception of `class` with `msg`.
fn raise(class: Class, msg: String) -> PyErr {
    match class {
        Class::Value => PyValueError::new_err(msg),
        Class::DType => dtype_err(msg),
        Class::Memory => PyMemoryError::new_err(msg),
        Class::Runtime => PyRuntimeError::new_err(msg),
    }
}

/// The Python exception for an engine error, with the engine's message.
pub fn engine_err(e: Error) -> PyErr {
    raise(class(&e), e.to_string())
}

/// A [`DTypeError`] with `msg`.
pub fn dtype_err(msg: impl Into<String>) -> PyErr {
    DTypeError::new_err(msg.into())
}

/// The Python exception for an embedder or reranker error, with its message: a failed
/// forward pass takes its engine error's class; worker threads that could not start
/// are a `RuntimeError`; everything else (the folder, the settings, the request's
/// texts) was an argument, a `ValueError`.
pub fn embed_err(e: EmbedError) -> PyErr {
    let class = match &e {
        EmbedError::Model(inner) => class(inner),
        EmbedError::Workers(_) => Class::Runtime,
        _ => Class::Value,
    };
    raise(class, e.to_string())
}

/// Registers [`DTypeError`] on the module and makes it a `TypeError` too.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let ty = py.get_type::<DTypeError>();
    // `create_exception!` takes one base; the second is added to `__bases__`.
    let bases = pyo3::types::PyTuple::new(
        py,
        [py.get_type::<PyValueError>(), py.get_type::<PyTypeError>()],
    )?;
    ty.setattr("__bases__", bases)?;
    m.add("DTypeError", ty)
}

/// A `RuntimeError` for a broken invariant of the bindings themselves.
pub fn internal(msg: String) -> PyErr {
    PyRuntimeError::new_err(format!(
        "internal error in streamfuse's Python bindings: {msg}"
    ))
}
