//! `streamfuse.Tensor`: the engine's lazy tensor for Python. Every op is checked and
//! queued on the calling thread's stream, as in Rust, and returns at once; values are
//! computed when they are read (`numpy()`, `np.asarray(t)`, `streamfuse.sync()`).
//! Every call into the engine runs with the GIL released, so Python threads record
//! and run their own streams at once. Operators take tensors, NumPy arrays (copied in)
//! and Python numbers (a rank-0 float32 tensor, broadcast, so `t / 3` rounds as NumPy's
//! float32 division does).

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::IntoPyObjectExt;
use streamfuse::{DType, Tensor};

use crate::convert::{dtype_name, from_numpy, parse_dtype, to_numpy};
use crate::errors::engine_err;

/// A lazy tensor of the engine (see the module docs).
#[pyclass(
    frozen,
    from_py_object,
    module = "streamfuse._streamfuse",
    name = "Tensor"
)]
#[derive(Clone)]
pub struct PyTensor {
    /// The engine's handle; `None` only inside `drop`, which takes it to release it
    /// without the GIL.
    t: Option<Tensor>,
}

impl PyTensor {
    fn new(t: Tensor) -> PyTensor {
        PyTensor { t: Some(t) }
    }

    /// The engine's handle.
    fn t(&self) -> &Tensor {
        self.t
            .as_ref()
            .expect("a PyTensor's handle is only taken by its drop")
    }
}

impl Drop for PyTensor {
    /// Releases the handle without the GIL: the engine may take a stream's lock to
    /// forget a queued value, and a worker holding that lock may be waiting for the GIL
    /// (to log).
    fn drop(&mut self) {
        if let Some(t) = self.t.take() {
            Python::attach(|py| py.detach(move || drop(t)));
        }
    }
}

/// Runs `f` without the GIL and wraps its tensor.
fn detached(
    py: Python<'_>,
    f: impl FnOnce() -> streamfuse::Result<Tensor> + Send,
) -> PyResult<PyTensor> {
    py.detach(f).map(PyTensor::new).map_err(engine_err)
}

/// The right-hand operand of an operator as a tensor: a `Tensor`, a NumPy array
/// (copied) or a Python number (a rank-0 float32 tensor); `None` for anything else
/// (the operator then returns `NotImplemented`).
fn operand(other: &Bound<'_, PyAny>) -> PyResult<Option<Tensor>> {
    if let Ok(t) = other.cast::<PyTensor>() {
        return Ok(Some(t.get().t().clone()));
    }
    if other.cast::<numpy::PyUntypedArray>().is_ok() {
        return from_numpy(other, false).map(Some);
    }
    if other.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(None);
    }
    if let Ok(x) = other.extract::<f64>() {
        let py = other.py();
        return py
            .detach(|| Tensor::full(x as f32, &[]))
            .map(Some)
            .map_err(engine_err);
    }
    Ok(None)
}

/// `op(lhs, rhs)` for an operator, `NotImplemented` when `other` is no operand.
fn binary(
    py: Python<'_>,
    lhs: &Tensor,
    other: &Bound<'_, PyAny>,
    swap: bool,
    op: fn(&Tensor, &Tensor) -> streamfuse::Result<Tensor>,
) -> PyResult<Py<PyAny>> {
    let Some(rhs) = operand(other)? else {
        return Ok(py.NotImplemented());
    };
    let (a, b) = if swap { (&rhs, lhs) } else { (lhs, &rhs) };
    detached(py, || op(a, b))?.into_py_any(py)
}

#[pymethods]
impl PyTensor {
    /// `None`: NumPy's operators then leave `array + tensor` to `Tensor.__radd__`
    /// (a lazy tensor) instead of converting the tensor to an array.
    #[classattr]
    fn __array_ufunc__(py: Python<'_>) -> Py<PyAny> {
        py.None()
    }

    /// A tensor of `array` (float32, uint32 or int64; any strides). A C-contiguous,
    /// aligned array that owns its memory is read in place, without a copy, and
    /// becomes read-only (the engine reads it lazily, on other threads: a write would
    /// race with it; views of it taken before must not be written either); any other
    /// array, or `copy=True`, is copied.
    #[staticmethod]
    #[pyo3(signature = (array, copy = false))]
    fn from_numpy(array: &Bound<'_, PyAny>, copy: bool) -> PyResult<Self> {
        from_numpy(array, !copy).map(PyTensor::new)
    }

    /// A tensor of `shape` filled with zeros.
    #[staticmethod]
    #[pyo3(signature = (shape, dtype = "float32"))]
    fn zeros(py: Python<'_>, shape: Vec<usize>, dtype: &str) -> PyResult<Self> {
        let d = parse_dtype(dtype)?;
        detached(py, || Tensor::zeros(&shape, d))
    }

    /// A tensor of `shape` filled with ones.
    #[staticmethod]
    #[pyo3(signature = (shape, dtype = "float32"))]
    fn ones(py: Python<'_>, shape: Vec<usize>, dtype: &str) -> PyResult<Self> {
        let d = parse_dtype(dtype)?;
        detached(py, || Tensor::ones(&shape, d))
    }

    /// A float32 tensor of `shape` filled with `value`.
    #[staticmethod]
    fn full(py: Python<'_>, shape: Vec<usize>, value: f32) -> PyResult<Self> {
        detached(py, || Tensor::full(value, &shape))
    }

    /// Joins `tensors` along `dim`.
    #[staticmethod]
    #[pyo3(signature = (tensors, dim = 0))]
    fn cat(py: Python<'_>, tensors: Vec<PyTensor>, dim: i64) -> PyResult<Self> {
        let refs: Vec<&Tensor> = tensors.iter().map(PyTensor::t).collect();
        detached(py, || Tensor::cat(&refs, dim))
    }

    /// The values as a new NumPy array, computing what they wait on first.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_numpy(py, self.t())
    }

    /// NumPy's conversion protocol: `np.asarray(t)` is `t.numpy()`.
    #[pyo3(signature = (dtype = None, copy = None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = copy; // The array is always new: a copy is all there is.
        let a = to_numpy(py, self.t())?;
        match dtype {
            Some(d) if !d.is_none() => a.call_method1("astype", (d,)),
            _ => Ok(a),
        }
    }

    /// The dims, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.t().dims())
    }

    /// The element type's name (`float32`, `uint32`, `int64`, or a packed weight's
    /// `bfloat16`, `int8`, `bf16x3`).
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.t().dtype())
    }

    /// The rank.
    #[getter]
    fn ndim(&self) -> usize {
        self.t().rank()
    }

    /// The element count.
    #[getter]
    fn size(&self) -> usize {
        self.t().numel()
    }

    /// Whether the values are computed (false while the op is only queued).
    #[getter]
    fn is_ready(&self) -> bool {
        self.t().is_ready()
    }

    fn __len__(&self) -> PyResult<usize> {
        self.t()
            .dims()
            .first()
            .copied()
            .ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("len() of a rank-0 tensor"))
    }

    fn __repr__(&self) -> String {
        let state = if self.t().is_ready() {
            "ready"
        } else {
            "pending"
        };
        format!(
            "Tensor(shape={:?}, dtype={}, {state})",
            self.t().dims(),
            dtype_name(self.t().dtype())
        )
    }

    fn __add__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, false, Tensor::add)
    }
    fn __radd__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, true, Tensor::add)
    }
    fn __sub__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, false, Tensor::sub)
    }
    fn __rsub__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, true, Tensor::sub)
    }
    fn __mul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, false, Tensor::mul)
    }
    fn __rmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, true, Tensor::mul)
    }
    fn __truediv__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, false, Tensor::div)
    }
    fn __rtruediv__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, true, Tensor::div)
    }
    fn __matmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, false, Tensor::matmul)
    }
    fn __rmatmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, self.t(), o, true, Tensor::matmul)
    }
    fn __neg__(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().neg())
    }
    fn __abs__(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().abs())
    }

    /// Matrix product (batched over leading dims, as `@`).
    fn matmul(&self, py: Python<'_>, other: PyTensor) -> PyResult<Self> {
        detached(py, || self.t().matmul(other.t()))
    }
    /// Element-wise maximum of the two.
    fn maximum(&self, py: Python<'_>, other: PyTensor) -> PyResult<Self> {
        detached(py, || self.t().maximum(other.t()))
    }
    /// Element-wise minimum of the two.
    fn minimum(&self, py: Python<'_>, other: PyTensor) -> PyResult<Self> {
        detached(py, || self.t().minimum(other.t()))
    }
    /// `self * mul + add`, element-wise.
    fn affine(&self, py: Python<'_>, mul: f64, add: f64) -> PyResult<Self> {
        detached(py, || self.t().affine(mul, add))
    }
    /// `x ** e`, element-wise.
    fn pow(&self, py: Python<'_>, e: f64) -> PyResult<Self> {
        detached(py, || self.t().powf(e))
    }
    /// `e^x`, element-wise.
    fn exp(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().exp())
    }
    /// Natural logarithm, element-wise.
    fn log(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().log())
    }
    /// Square root, element-wise.
    fn sqrt(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().sqrt())
    }
    /// `1 / x`, element-wise.
    fn recip(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().recip())
    }
    /// `tanh x`, element-wise.
    fn tanh(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().tanh())
    }
    /// The logistic sigmoid, element-wise.
    fn sigmoid(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().sigmoid())
    }
    /// `max(x, 0)`, element-wise.
    fn relu(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().relu())
    }
    /// GELU (the erf form), element-wise.
    fn gelu(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().gelu())
    }
    /// GELU (the tanh approximation), element-wise.
    fn gelu_tanh(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().gelu_tanh())
    }
    /// `x * sigmoid(x)`, element-wise.
    fn silu(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().silu())
    }
    /// Sum over `dim`.
    #[pyo3(signature = (dim, keepdim = false))]
    fn sum(&self, py: Python<'_>, dim: i64, keepdim: bool) -> PyResult<Self> {
        detached(py, || {
            if keepdim {
                self.t().sum_keepdim(dim)
            } else {
                self.t().sum(dim)
            }
        })
    }
    /// Mean over `dim`.
    #[pyo3(signature = (dim, keepdim = false))]
    fn mean(&self, py: Python<'_>, dim: i64, keepdim: bool) -> PyResult<Self> {
        detached(py, || {
            if keepdim {
                self.t().mean_keepdim(dim)
            } else {
                self.t().mean(dim)
            }
        })
    }
    /// Maximum over `dim`.
    #[pyo3(signature = (dim, keepdim = false))]
    fn max(&self, py: Python<'_>, dim: i64, keepdim: bool) -> PyResult<Self> {
        detached(py, || {
            if keepdim {
                self.t().max_keepdim(dim)
            } else {
                self.t().max(dim)
            }
        })
    }
    /// Index of the maximum over `dim` (uint32), which is removed.
    fn argmax(&self, py: Python<'_>, dim: i64) -> PyResult<Self> {
        detached(py, || self.t().argmax(dim))
    }
    /// Running sum over `dim` (float32, uint32 or int64; the integers wrap), as
    /// `numpy.cumsum(axis=dim)` with the input's dtype.
    fn cumsum(&self, py: Python<'_>, dim: i64) -> PyResult<Self> {
        detached(py, || self.t().cumsum(dim))
    }
    /// Softmax over `dim`.
    #[pyo3(signature = (dim = -1))]
    fn softmax(&self, py: Python<'_>, dim: i64) -> PyResult<Self> {
        detached(py, || self.t().softmax(dim))
    }
    /// Layer norm over the last dim, with `weight` and `bias` of its size.
    #[pyo3(signature = (weight, bias, eps = 1e-5))]
    fn layer_norm(
        &self,
        py: Python<'_>,
        weight: PyTensor,
        bias: PyTensor,
        eps: f64,
    ) -> PyResult<Self> {
        detached(py, || self.t().layer_norm(weight.t(), bias.t(), eps))
    }
    /// RMS norm over the last dim, with `weight` of its size.
    #[pyo3(signature = (weight, eps = 1e-6))]
    fn rms_norm(&self, py: Python<'_>, weight: PyTensor, eps: f64) -> PyResult<Self> {
        detached(py, || self.t().rms_norm(weight.t(), eps))
    }
    /// The same elements in `shape` (a view when the layout allows it).
    fn reshape(&self, py: Python<'_>, shape: Vec<usize>) -> PyResult<Self> {
        detached(py, || self.t().reshape(&shape))
    }
    /// Swaps two dims (a view).
    fn transpose(&self, py: Python<'_>, d0: i64, d1: i64) -> PyResult<Self> {
        detached(py, || self.t().transpose(d0, d1))
    }
    /// Reorders the dims (a view).
    fn permute(&self, py: Python<'_>, perm: Vec<usize>) -> PyResult<Self> {
        detached(py, || self.t().permute(&perm))
    }
    /// `length` elements of `dim` from `start` (a view).
    fn narrow(&self, py: Python<'_>, dim: i64, start: usize, length: usize) -> PyResult<Self> {
        detached(py, || self.t().narrow(dim, start, length))
    }
    /// A new dim of size 1 at `dim` (a view).
    fn unsqueeze(&self, py: Python<'_>, dim: i64) -> PyResult<Self> {
        detached(py, || self.t().unsqueeze(dim))
    }
    /// Removes `dim`, of size 1 (a view).
    fn squeeze(&self, py: Python<'_>, dim: i64) -> PyResult<Self> {
        detached(py, || self.t().squeeze(dim))
    }
    /// Broadcasts to `shape` (a view).
    fn broadcast_to(&self, py: Python<'_>, shape: Vec<usize>) -> PyResult<Self> {
        detached(py, || self.t().broadcast_as(&shape))
    }
    /// A contiguous copy (or the tensor itself when it is contiguous).
    fn contiguous(&self, py: Python<'_>) -> PyResult<Self> {
        detached(py, || self.t().contiguous())
    }
    /// The entries of `dim` at `indices` (a rank-1 uint32 or int64 tensor).
    fn index_select(&self, py: Python<'_>, indices: PyTensor, dim: i64) -> PyResult<Self> {
        detached(py, || self.t().index_select(indices.t(), dim))
    }
    /// The tensor in `dtype`: a float32 weight matrix to a packed `bfloat16`, `int8`
    /// or `bf16x3` one (done now, not lazily), or back to `float32`.
    fn to_dtype(&self, py: Python<'_>, dtype: &str) -> PyResult<Self> {
        let d: DType = parse_dtype(dtype)?;
        detached(py, || self.t().to_dtype(d))
    }
}
