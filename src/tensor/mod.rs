//! The user-facing [`Tensor`]: a cheap handle to a lazily computed value.
//!
//! A `Tensor` is an `Arc` around its id, dtype, layout, data slot and home stream.
//! Calling an op checks its arguments (shapes, dtypes, dims) right away and returns an
//! error naming what was wrong, recording nothing; on success it queues the op on the
//! calling thread's stream and returns the handle of the output at once. Data is
//! computed only when it is needed: `to_vec`, [`sync`](crate::sync), the queue limit,
//! or another stream reading it. Dropping the last handle queues a Drop op, so a
//! flushed segment knows which of its tensors die inside it.
//!
//! The ops are spread over files by family: [`elementwise`](self) (unary, binary,
//! casts), matmul and reductions in `compute`, views and gathers in `view`.

mod attention;
pub use attention::KeyWindow;
mod compute;
mod dim;
mod elementwise;
mod view;

pub use dim::Dim;

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ir::{DType, Layout, OpKind, TensorDesc, TensorId};
use crate::reuse::cells::{last_ref, LocalCells};
use crate::runtime::{Slot, StorageElement, TensorBuffer};
use crate::stream::{self, Stream};

/// A handle to a tensor: an n-dimensional array of one [`DType`], computed lazily.
///
/// Cloning is cheap (an `Arc`). A `Tensor` is `Send + Sync`: it can be read, used in
/// ops or dropped on any thread.
#[derive(Clone)]
pub struct Tensor(Option<Arc<Handle>>);

/// What a tensor handle holds; shared by its clones.
pub(crate) struct Handle {
    desc: TensorDesc,
    /// `None` once released (the handle waits on a free list for reuse).
    slot: Option<Arc<Slot>>,
    home: Arc<Stream>,
}

thread_local! {
    /// Free tensor handles of this thread (no slot), for [`Tensor::from_parts`].
    static FREE_HANDLES: LocalCells<Handle> = const { LocalCells::new() };
}

impl Handle {
    /// The last handle of a tensor went away: queue its Drop (when still pending) and
    /// let go of the slot.
    fn release(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.home.push_drop(self.desc.clone(), &slot);
            Slot::release(slot);
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Reached only when the last two clones of a tensor were dropped at once on
        // two threads (neither saw itself as the last); otherwise `Tensor::drop`
        // released the handle already.
        self.release();
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        let Some(mut handle) = self.0.take() else {
            return;
        };
        if let Some(h) = last_ref(&mut handle) {
            h.release();
            LocalCells::give(&FREE_HANDLES, handle);
        }
    }
}

impl Tensor {
    /// A handle for a tensor described by `desc` whose data is (or will be) in `slot`,
    /// made by stream `home`; reuses a free handle of this thread when there is one.
    fn from_parts(desc: TensorDesc, slot: Arc<Slot>, home: &Arc<Stream>) -> Tensor {
        if let Some(mut cell) = LocalCells::take(&FREE_HANDLES) {
            if let Some(h) = Arc::get_mut(&mut cell) {
                h.desc = desc;
                h.slot = Some(slot);
                if !Arc::ptr_eq(&h.home, home) {
                    h.home = home.clone();
                }
                return Tensor(Some(cell));
            }
        }
        Tensor(Some(Arc::new(Handle {
            desc,
            slot: Some(slot),
            home: home.clone(),
        })))
    }

    /// The handle (present for the whole life of a `Tensor`).
    fn h(&self) -> &Handle {
        self.0
            .as_deref()
            .expect("a tensor holds its handle until dropped")
    }

    /// The tensor's data slot.
    fn slot(&self) -> &Arc<Slot> {
        self.h()
            .slot
            .as_ref()
            .expect("a handle in use holds its slot")
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({} {}{:?})",
            self.h().desc.id,
            self.h().desc.dtype,
            self.h().desc.layout.dims
        )
    }
}

/// Element types a tensor can be built from or read into: `f32`, `u32`, `i64`.
pub trait TensorElement: StorageElement {}
impl TensorElement for f32 {}
impl TensorElement for u32 {}
impl TensorElement for i64 {}

use crate::ops::checked_numel;

impl Tensor {
    /// A tensor that reads `data`'s elements (row-major, see [`External`]) where they
    /// lie, without a copy: a NumPy array's buffer, a memory-mapped file. The engine
    /// keeps `data` while any tensor or pending op reads it and drops it after. Errors
    /// if `data` does not hold the product of `dims` elements.
    ///
    /// [`External`]: crate::External
    pub fn from_external<T: TensorElement>(
        data: impl crate::External<T>,
        dims: &[usize],
    ) -> Result<Tensor> {
        let n = checked_numel(dims, "from_external")?;
        let have = data.elements().len();
        if have != n {
            return Err(Error::Shape {
                op: "from_external",
                msg: format!("{have} elements given for shape {dims:?}, which holds {n}"),
            });
        }
        let buffer = TensorBuffer::from_external(Box::new(data), n);
        Ok(Tensor::ready(buffer, T::DTYPE, Layout::contiguous(dims)))
    }

    /// A tensor that takes ownership of `data` (row-major) with the given dims. No copy
    /// is made; the data is ready at once. Errors if `data.len()` is not the product of
    /// `dims`.
    pub fn from_vec<T: TensorElement>(data: Vec<T>, dims: &[usize]) -> Result<Tensor> {
        let n = checked_numel(dims, "from_vec")?;
        if n != data.len() {
            return Err(Error::Shape {
                op: "from_vec",
                msg: format!(
                    "{} elements given for shape {dims:?}, which holds {n}",
                    data.len()
                ),
            });
        }
        Ok(Tensor::ready(
            TensorBuffer::from_vec(data),
            T::DTYPE,
            Layout::contiguous(dims),
        ))
    }

    /// A `[k, n]` f32 matrix meant to be the right operand of products (a model's
    /// weight), kept only in the layout the product kernel streams: it costs its size
    /// once (a [`Tensor::prepack`]ed tensor keeps both forms), and `x.matmul(&w)`, and
    /// every chain it heads, reads the packed panels. It is an ordinary tensor in
    /// every other way: reading its elements (`to_vec`, any other op, a product through
    /// another view of it) unpacks them once and keeps them beside it. On a tier with
    /// no f32 tile (`portable`: no AVX2 with FMA, AVX-512 or NEON; see
    /// [`crate::cpu`]) it is stored as [`Tensor::from_vec`] stores it. Errors if `dims`
    /// is not 2-D or `data.len()` is not their product.
    pub fn weight(data: Vec<f32>, dims: &[usize]) -> Result<Tensor> {
        if dims.len() != 2 {
            return Err(Error::Shape {
                op: "weight",
                msg: format!("a weight is a matrix [k, n], got dims {dims:?}"),
            });
        }
        let n = checked_numel(dims, "weight")?;
        if n != data.len() {
            return Err(Error::Shape {
                op: "weight",
                msg: format!(
                    "{} elements given for shape {dims:?}, which holds {n}",
                    data.len()
                ),
            });
        }
        let layout = Layout::contiguous(dims);
        let buffer = match crate::kernels::PackedRhs::pack(&data, &layout) {
            Some(packed) => TensorBuffer::from_packed(packed, n),
            None => TensorBuffer::from_vec(data),
        };
        Ok(Tensor::ready(buffer, DType::F32, layout))
    }

    /// A tensor of zeros.
    pub fn zeros(dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::fill(0.0, dims, dtype, "zeros")
    }

    /// A tensor of ones.
    pub fn ones(dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::fill(1.0, dims, dtype, "ones")
    }

    /// An f32 tensor with every element equal to `value`.
    pub fn full(value: f32, dims: &[usize]) -> Result<Tensor> {
        Tensor::fill(value as f64, dims, DType::F32, "full")
    }

    fn fill(value: f64, dims: &[usize], dtype: DType, op: &'static str) -> Result<Tensor> {
        crate::ops::fill::shape(op, dims, dtype)?;
        Tensor::record(
            OpKind::Fill {
                value: value.to_bits(),
            },
            &[],
            dtype,
            Layout::contiguous(dims),
        )
    }

    fn ready(buffer: TensorBuffer, dtype: DType, layout: Layout) -> Tensor {
        let home = stream::current();
        let id = TensorId::fresh();
        Tensor::from_parts(
            TensorDesc { id, dtype, layout },
            Slot::ready(id, buffer),
            &home,
        )
    }

    /// Queues `kind` on the calling thread's stream with `inputs`, and returns the
    /// handle of its output (of `dtype`, read through `layout`). The caller has checked
    /// every argument but one, checked here for every op: a weight kept in reduced
    /// precision (`BF16`, `I8`) is only the right operand of a product or the input of
    /// `to_dtype`.
    pub(crate) fn record(
        kind: OpKind,
        inputs: &[&Tensor],
        dtype: DType,
        layout: Layout,
    ) -> Result<Tensor> {
        for (i, t) in inputs.iter().enumerate() {
            let allowed = match kind {
                OpKind::MatMul => i == 1,
                OpKind::Cast => true,
                _ => false,
            };
            if t.dtype().is_weight_only() && !allowed {
                return Err(Error::DType {
                    op: kind.name(),
                    msg: format!(
                        "a {} tensor is a weight: it can only be the right operand of matmul \
                         (or converted with to_dtype); input {i} is {} with dims {:?}",
                        t.dtype(),
                        t.dtype(),
                        t.dims()
                    ),
                });
            }
        }
        let desc = TensorDesc {
            id: TensorId::fresh(),
            dtype,
            layout,
        };
        Ok(stream::record(
            kind,
            inputs.iter().map(|t| (&t.h().desc, t.slot(), &t.h().home)),
            desc.clone(),
            |slot, home| Tensor::from_parts(desc, slot, home),
        ))
    }

    /// The tensor's SSA id (unique in the process).
    pub fn id(&self) -> TensorId {
        self.h().desc.id
    }

    /// The size of each dimension.
    pub fn dims(&self) -> &[usize] {
        &self.h().desc.layout.dims
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims().len()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.h().desc.layout.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.h().desc.dtype
    }

    /// The strided layout through which the tensor reads its buffer.
    pub fn layout(&self) -> &Layout {
        &self.h().desc.layout
    }

    /// Whether the tensor's data has been computed (or failed).
    pub fn is_ready(&self) -> bool {
        !self.slot().is_pending()
    }

    /// Computes the tensor if needed and returns its elements in row-major order. `T`
    /// must match the tensor's dtype. Returns the error of any op it depends on that
    /// failed while running, and [`Error::OutOfMemory`] when the system has no memory
    /// for the elements (of the tensor, or of the returned vector).
    pub fn to_vec<T: TensorElement>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType {
                op: "to_vec",
                msg: format!(
                    "the tensor is {} but was read as {} (use to_dtype first)",
                    self.dtype(),
                    T::DTYPE
                ),
            });
        }
        let buffer = self.materialize()?;
        let layout = self.layout();
        let src = buffer.as_slice::<T>().ok_or_else(|| Error::Kernel {
            op: "to_vec",
            msg: "buffer of the wrong type (engine bug)".into(),
        })?;
        let n = layout.numel();
        // The returned vector may be far larger than the buffer (a broadcast view), so
        // it is allocated fallibly too.
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
            op: "to_vec",
            bytes: n.saturating_mul(std::mem::size_of::<T>()),
        })?;
        if layout.is_contiguous() && layout.offset + n <= src.len() {
            out.extend_from_slice(&src[layout.offset..layout.offset + n]);
            return Ok(out);
        }
        out.resize(n, T::zero());
        stream::copy_out(src, layout, &mut out).map_err(|e| Error::Kernel {
            op: "to_vec",
            msg: e.0,
        })?;
        Ok(out)
    }

    /// Computes the tensor if needed and calls `f` with its elements in row-major
    /// order: borrowed from its buffer when they lie there in that order, as a
    /// [`Tensor::to_vec`] copy otherwise. For readers that only look (pooling reads a
    /// batch's states once: the copy was a fresh allocation of the whole batch, page
    /// faults included: 0.1 to 0.4 ms for half a call of 32 texts of all-MiniLM-L6-v2
    /// on Zen 5). Errors as `to_vec`.
    pub(crate) fn read<T: TensorElement, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        if T::DTYPE == self.dtype() && self.layout().is_contiguous() {
            let buffer = self.materialize()?;
            let (offset, n) = (self.layout().offset, self.numel());
            if let Some(src) = buffer
                .as_slice::<T>()
                .and_then(|s| s.get(offset..offset + n))
            {
                return Ok(f(src));
            }
        }
        self.to_vec().map(|v| f(&v))
    }

    /// Runs whatever the tensor still waits for and returns its buffer.
    fn materialize(&self) -> Result<Arc<TensorBuffer>> {
        stream::materialize(self.id(), self.slot(), &self.h().home)
    }

    /// Elements of an already computed tensor, without flushing anything; `None` if
    /// the tensor is still pending or failed.
    pub(crate) fn peek<T: TensorElement>(&self) -> Option<Vec<T>> {
        if self.slot().is_pending() || self.dtype() != T::DTYPE {
            return None;
        }
        self.to_vec().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `read` sees what `to_vec` returns: borrowed for a contiguous tensor (a narrow
    /// of rows is one, at an offset), copied for a transposed view; a wrong element
    /// type is `to_vec`'s error.
    #[test]
    fn read_sees_the_elements_to_vec_returns() {
        let t = Tensor::from_vec((0..12).map(|x| x as f32).collect(), &[4, 3]).unwrap();
        let x = t.add(&t).unwrap();
        for view in [
            x.clone(),
            x.narrow(0, 1, 2).unwrap(),
            x.permute(&[1, 0]).unwrap(),
        ] {
            let want = view.to_vec::<f32>().unwrap();
            assert_eq!(view.read(|s: &[f32]| s.to_vec()).unwrap(), want);
        }
        let e = x.read(|s: &[u32]| s.len()).unwrap_err().to_string();
        assert!(e.contains("read as u32"), "{e}");
    }
}
