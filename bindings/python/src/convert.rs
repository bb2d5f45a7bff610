//! NumPy arrays to engine tensors and back, and dtype names.
//!
//! `Tensor.from_numpy` reads an array **in place** when it can
//! ([`streamfuse::External`]): a C-contiguous, aligned array that owns its memory. The
//! tensor holds a reference to the array, so its buffer lives as long as the engine
//! reads it, and the array is made read-only (its `WRITEABLE` flag cleared): the
//! engine reads lazily, on other threads, so a later write would race with a kernel.
//! Every other array (strided, a view of another array's memory, misaligned), an
//! operator's array operand (`t + a` must not change `a`), and `copy=True` are
//! **copied**: one `memcpy` when C-contiguous, an element-by-element walk in C order
//! otherwise. Results come out without a second copy: the `Vec` read from the engine
//! becomes the array's buffer.

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

/// A tensor of `array` (float32, uint32 or int64, any strides; a zero-size array gives
/// a zero-size tensor): read in place when `borrow` and the array allows it (see the
/// module doc; the array becomes read-only), a copy otherwise.
pub fn from_numpy(array: &Bound<'_, PyAny>, borrow: bool) -> PyResult<Tensor> {
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
        take_in::<f32>(array, borrow)
    } else if dtype.is_equiv_to(&numpy::dtype::<u32>(py)) {
        take_in::<u32>(array, borrow)
    } else if dtype.is_equiv_to(&numpy::dtype::<i64>(py)) {
        take_in::<i64>(array, borrow)
    } else {
        Err(dtype_err(format!(
            "from_numpy: arrays of dtype {dtype} are not supported; streamfuse tensors are \
             float32, uint32 or int64 in native byte order (convert first, e.g. \
             a.astype(numpy.float32))"
        )))
    }
}

/// An array whose dtype is `T` as a tensor: borrowed when `borrow` and it is
/// C-contiguous, aligned, non-empty and owns its memory (then made read-only); copied
/// otherwise.
fn take_in<T: TensorElement + Element + Copy>(
    array: &Bound<'_, PyAny>,
    borrow: bool,
) -> PyResult<Tensor> {
    let typed = array.cast::<PyArrayDyn<T>>()?;
    let flags = array.getattr("flags")?;
    let in_place = borrow
        && typed.is_c_contiguous()
        && typed.len() > 0
        && flags.getattr("owndata")?.extract::<bool>()?
        && flags.getattr("aligned")?.extract::<bool>()?;
    if !in_place {
        return copy_in::<T>(array);
    }
    let kwargs = pyo3::types::PyDict::new(array.py());
    kwargs.set_item("write", false)?;
    array.call_method("setflags", (), Some(&kwargs))?;
    let dims = typed.shape().to_vec();
    let borrowed = Borrowed {
        ptr: typed.data().cast_const(),
        len: typed.len(),
        _array: typed.clone().unbind(),
    };
    array
        .py()
        .detach(|| Tensor::from_external(borrowed, &dims))
        .map_err(engine_err)
}

/// A NumPy array's elements, read in place by the engine: the array (kept alive by
/// this reference), its first element and its element count, taken when it was
/// C-contiguous, aligned, owned its memory and was made read-only.
struct Borrowed<T: Element> {
    ptr: *const T,
    len: usize,
    _array: Py<PyArrayDyn<T>>,
}

// SAFETY: the pointer is only read (through `elements`), and the memory it points to
// never changes while this value lives (see `elements`), so sharing it between the
// engine's threads is sharing an immutable slice; `Py` itself is `Send + Sync` and is
// only dropped here (without the GIL, pyo3 defers the decref to the next holder of it).
unsafe impl<T: Element> Send for Borrowed<T> {}
// SAFETY: as for `Send` above: every use is a read of memory nobody writes.
unsafe impl<T: Element> Sync for Borrowed<T> {}

impl<T: Element + TensorElement> streamfuse::External<T> for Borrowed<T> {
    fn elements(&self) -> &[T] {
        // SAFETY: `ptr` is the first of `len` aligned, initialised elements of an
        // array that owns them (checked when this was made), and `_array` keeps that
        // array, and so its buffer, alive for as long as `self`. NumPy moves or frees
        // an array's buffer only when the array dies or is resized, and `resize`
        // refuses an array that another reference (this one) holds. The array was made
        // read-only, and it owns its memory (no base array to write through), so
        // Python code cannot change the elements while the slice lives; a view taken
        // of it before could, which the `from_numpy` docs forbid.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
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
