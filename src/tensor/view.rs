//! Views and gathers: reshape, transpose, permute, narrow, (un)squeeze, broadcast,
//! contiguous, cat and index_select.
//!
//! A view op moves no data: it records a new layout over the same buffer (`OpKind::View`).
//! `reshape` is a view whenever the strides allow it (always for a contiguous tensor);
//! otherwise it copies first. `cat` and `index_select` always make a new buffer.

use super::{Dim, Tensor};
use crate::error::{Error, Result};
use crate::ir::{DType, Dims, Layout, OpKind};
use crate::ops;

impl Tensor {
    fn view(&self, layout: Layout) -> Result<Tensor> {
        Tensor::record(OpKind::View, &[self], self.dtype(), layout)
    }

    /// The same elements in row-major order with new `dims` (same element count). A view
    /// when the layout allows it, a copy otherwise.
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor> {
        let n = super::checked_numel(dims, "reshape")?;
        if n != self.numel() {
            return Err(Error::Shape {
                op: "reshape",
                msg: format!(
                    "cannot reshape {:?} ({} elements) to {dims:?} ({n} elements)",
                    self.dims(),
                    self.numel()
                ),
            });
        }
        match self.layout().reshape(dims) {
            Some(layout) => self.view(layout),
            None => {
                let c = self.contiguous()?;
                let layout = c.layout().reshape(dims).expect("contiguous reshapes");
                c.view(layout)
            }
        }
    }

    /// Swaps dims `d0` and `d1` (a view).
    pub fn transpose(&self, d0: impl Dim, d1: impl Dim) -> Result<Tensor> {
        let a = d0.resolve(self.rank(), "transpose")?;
        let b = d1.resolve(self.rank(), "transpose")?;
        let mut perm: Dims = (0..self.rank()).collect();
        perm.swap(a, b);
        self.view(self.layout().permute(&perm))
    }

    /// Reorders the dims: dim `i` of the result is dim `perm[i]` of `self` (a view).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.rank()];
        let ok = perm.len() == self.rank()
            && perm
                .iter()
                .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
        if !ok {
            return Err(Error::Arg {
                op: "permute",
                msg: format!(
                    "{perm:?} is not a permutation of the {} dims of shape {:?}",
                    self.rank(),
                    self.dims()
                ),
            });
        }
        self.view(self.layout().permute(perm))
    }

    /// `len` elements of `dim` starting at `start` (a view).
    pub fn narrow(&self, dim: impl Dim, start: usize, len: usize) -> Result<Tensor> {
        let d = dim.resolve(self.rank(), "narrow")?;
        let size = self.dims()[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::Arg {
                op: "narrow",
                msg: format!(
                    "range {start}..{} is out of bounds for dim {d} of shape {:?}",
                    start.saturating_add(len),
                    self.dims()
                ),
            });
        }
        self.view(self.layout().narrow(d, start, len))
    }

    /// Inserts a dim of size 1 at `dim` (`-1` appends one at the end) (a view).
    pub fn unsqueeze(&self, dim: impl Dim) -> Result<Tensor> {
        let d = dim.resolve_insert(self.rank(), "unsqueeze")?;
        let mut dims = self.dims().to_vec();
        dims.insert(d, 1);
        super::checked_numel(&dims, "unsqueeze")?;
        self.view(self.layout().unsqueeze(d))
    }

    /// Removes `dim`, which must have size 1 (a view).
    pub fn squeeze(&self, dim: impl Dim) -> Result<Tensor> {
        let d = dim.resolve(self.rank(), "squeeze")?;
        if self.dims()[d] != 1 {
            return Err(Error::Shape {
                op: "squeeze",
                msg: format!(
                    "dim {d} of shape {:?} has size {}, not 1",
                    self.dims(),
                    self.dims()[d]
                ),
            });
        }
        self.view(self.layout().squeeze(d))
    }

    /// The tensor read as `dims` by numpy broadcasting (a view; no data is repeated).
    pub fn broadcast_as(&self, dims: &[usize]) -> Result<Tensor> {
        super::checked_numel(dims, "broadcast_as")?;
        match self.layout().broadcast_as(dims) {
            Some(layout) => self.view(layout),
            None => Err(Error::Shape {
                op: "broadcast_as",
                msg: format!("cannot broadcast shape {:?} to {dims:?}", self.dims()),
            }),
        }
    }

    /// The tensor in a row-major buffer of its own; `self` if it already is laid out so.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.layout().is_contiguous() {
            return Ok(self.clone());
        }
        Tensor::record(
            OpKind::Contiguous,
            &[self],
            self.dtype(),
            Layout::contiguous(self.dims()),
        )
    }

    /// The tensors joined along `dim`; all must have the same dtype and the same dims
    /// except `dim`.
    pub fn cat(tensors: &[&Tensor], dim: impl Dim) -> Result<Tensor> {
        let op = "cat";
        // The first part's rank resolves the dim (no part: the shape rule's error).
        let d = match tensors.first() {
            Some(first) => dim.resolve(first.rank(), op)?,
            None => 0,
        };
        let parts = tensors.iter().map(|t| (t.dims(), t.dtype()));
        let dims = ops::cat::shape(parts, d)?;
        super::checked_numel(&dims, op)?;
        Tensor::record(
            OpKind::Cat { dim: d },
            tensors,
            tensors[0].dtype(),
            Layout::contiguous(&dims),
        )
    }

    /// The entries of `dim` picked by `indices` (1-D, u32 or i64), in that order. An
    /// index out of range is an error: at once when the indices are already computed,
    /// otherwise when the kernel runs (reported by the next read or sync).
    pub fn index_select(&self, indices: &Tensor, dim: impl Dim) -> Result<Tensor> {
        let op = "index_select";
        let d = dim.resolve(self.rank(), op)?;
        if !matches!(indices.dtype(), DType::U32 | DType::I64) {
            return Err(Error::DType {
                op,
                msg: format!("indices must be u32 or i64, got {}", indices.dtype()),
            });
        }
        if indices.rank() != 1 {
            return Err(Error::Shape {
                op,
                msg: format!("indices must be 1-D, got shape {:?}", indices.dims()),
            });
        }
        let size = self.dims()[d];
        let bad = match indices.dtype() {
            DType::U32 => indices.peek::<u32>().and_then(|v| {
                v.iter()
                    .position(|&i| i as usize >= size)
                    .map(|p| (p, v[p] as i64))
            }),
            _ => indices.peek::<i64>().and_then(|v| {
                v.iter()
                    .position(|&i| i < 0 || i as u64 >= size as u64)
                    .map(|p| (p, v[p]))
            }),
        };
        if let Some((pos, value)) = bad {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "index {value} at position {pos} is out of range for dim {d} of size {size} (shape {:?})",
                    self.dims()
                ),
            });
        }
        let mut dims = self.dims().to_vec();
        dims[d] = indices.dims()[0];
        Tensor::record(
            OpKind::IndexSelect { dim: d },
            &[self, indices],
            self.dtype(),
            Layout::contiguous(&dims),
        )
    }
}
