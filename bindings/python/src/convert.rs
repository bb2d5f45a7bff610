//! NumPy arrays to engine tensors and back, and dtype names. The engine's tensors own
//! their memory (a `Vec` the engine's pool recycles), so an array is **copied** in:
//! one `memcpy` when it is C-contiguous, an element-by-element walk in C order
//! otherwise. Borrowing the array's memory would need the engine to hold foreign
//! buffers, which it cannot (its storage is `Vec<f32>`/`Vec<u32>`/`Vec<i64>`, freed
//! and reused by its own allocator). Results come out without a second copy: the
//! `Vec` read from the engine becomes the array's buffer.

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    Element, IntoPyArray, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use streamfuse::{DType, Tensor, TensorElement};

use crate::errors::{dtype_err, engine_err};

/// The NumPy-style name of a dtype (`float32`, `uint32`, `int64`; the packed weight
/// forms `bfloat16`, `int8`, `bf16x3`).
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::BF16X3 => "bf16x3",
        _ => "unknown",
    }
}

/// The dtype a name means: NumPy's names and the engine's (`f32`, `bf16`, `i8`, ...).
pub fn parse_dtype(name: &str) -> PyResult<DType> {
    Ok(match name {
        "float32" | "f32" => DType::F32,
        "uint32" | "u32" => DType::U32,
        "int64" | "i64" => DType::I64,
        "bfloat16" | "bf16" => DType::BF16,
        "int8" | "i8" => DType::I8,
        "bf16x3" => DType::BF16X3,
        other => {
            return Err(dtype_err(format!(
                "unknown dtype {other:?}: expected float32, uint32, int64 (or, for a \
                 weight matrix, bfloat16, int8, bf16x3)"
            )))
        }
    })
}

/// A tensor holding a copy of `array` (float32, uint32 or int64, any strides; a
/// zero-size array gives a zero-size tensor).
pub fn from_numpy(array: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let untyped = array.cast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!(
            "from_numpy takes a numpy.ndarray, got {}",
            array
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    let py = array.py();
    let dtype = untyped.dtype();
    if dtype.is_equiv_to(&numpy::dtype::<f32>(py)) {
        copy_in::<f32>(array)
    } else if dtype.is_equiv_to(&numpy::dtype::<u32>(py)) {
        copy_in::<u32>(array)
    } else if dtype.is_equiv_to(&numpy::dtype::<i64>(py)) {
        copy_in::<i64>(array)
    } else {
        Err(dtype_err(format!(
            "from_numpy: arrays of dtype {dtype} are not supported; streamfuse tensors are \
             float32, uint32 or int64 in native byte order (convert first, e.g. \
             a.astype(numpy.float32))"
        )))
    }
}

/// Copies an array whose dtype is `T` into a new tensor.
fn copy_in<T: TensorElement + Element + Copy>(array: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let typed = array.cast::<PyArrayDyn<T>>()?;
    let view = typed.try_readonly()?;
    let dims = view.shape().to_vec();
    // `as_slice` also takes Fortran-ordered arrays, whose memory is not in C order.
    let data: Vec<T> = match view.as_slice() {
        Ok(contiguous) if typed.is_c_contiguous() => contiguous.to_vec(),
        _ => view.as_array().iter().copied().collect(),
    };
    let py = array.py();
    py.detach(|| Tensor::from_vec(data, &dims))
        .map_err(engine_err)
}

/// The tensor's values as a new NumPy array of its shape; runs what it waits on first
/// (without the GIL). A packed weight (bfloat16, int8, bf16x3) has no elements to
/// read: an error says to convert it with `to_dtype("float32")`.
pub fn to_numpy<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let dims = t.dims().to_vec();
    match t.dtype() {
        DType::F32 => array_of::<f32>(py, t, dims),
        DType::U32 => array_of::<u32>(py, t, dims),
        DType::I64 => array_of::<i64>(py, t, dims),
        other => Err(dtype_err(format!(
            "a {} tensor is a packed weight with no elements to read; \
             use to_dtype(\"float32\") first",
            dtype_name(other)
        ))),
    }
}

fn array_of<'py, T: TensorElement + Element + Send>(
    py: Python<'py>,
    t: &Tensor,
    dims: Vec<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let data = py.detach(|| t.to_vec::<T>()).map_err(engine_err)?;
    let array = ArrayD::from_shape_vec(IxDyn(&dims), data).map_err(|e| {
        crate::errors::internal(format!("the tensor's values do not fit its shape: {e}"))
    })?;
    Ok(array.into_pyarray(py).into_any())
}
