//! Views and gathers: reshape, transpose, permute, narrow, (un)squeeze, broadcast,
//! contiguous, cat and index_select.
//!
//! A view op moves no data: it records a new layout over the same buffer (`OpKind::View`).
//! `reshape` is a view whenever the strides allow it (always for a contiguous tensor);
//! otherwise it copies first. `cat` and `index_select` always make a new buffer.

use super::{Dim, Tensor};
use crate::error::Result;
use crate::ir::{DType, Dims, Layout, OpKind};
use crate::ops;

impl Tensor {
    fn view(&self, layout: Layout) -> Result<Tensor> {
        Tensor::record(OpKind::View, &[self], self.dtype(), layout)
    }

    /// The same elements in row-major order with new `dims` (same element count). A view
    /// when the layout allows it, a copy otherwise.
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor> {
        match ops::layout::reshape(self.layout(), dims)? {
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
        self.view(ops::layout::permute(self.layout(), perm)?)
    }

    /// `len` elements of `dim` starting at `start` (a view).
    pub fn narrow(&self, dim: impl Dim, start: usize, len: usize) -> Result<Tensor> {
        let d = dim.resolve(self.rank(), "narrow")?;
        self.view(ops::layout::narrow(self.layout(), d, start, len)?)
    }

    /// Inserts a dim of size 1 at `dim` (`-1` appends one at the end) (a view).
    pub fn unsqueeze(&self, dim: impl Dim) -> Result<Tensor> {
        let d = dim.resolve_insert(self.rank(), "unsqueeze")?;
        self.view(ops::layout::unsqueeze(self.layout(), d)?)
    }

    /// Removes `dim`, which must have size 1 (a view).
    pub fn squeeze(&self, dim: impl Dim) -> Result<Tensor> {
        let d = dim.resolve(self.rank(), "squeeze")?;
        self.view(ops::layout::squeeze(self.layout(), d)?)
    }

    /// The tensor read as `dims` by numpy broadcasting (a view; no data is repeated).
    pub fn broadcast_as(&self, dims: &[usize]) -> Result<Tensor> {
        self.view(ops::layout::broadcast_as(self.layout(), dims)?)
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
        let d = dim.resolve(self.rank(), "index_select")?;
        let dims = ops::index_select::shape(
            self.dims(),
            d,
            (indices.dims(), indices.dtype()),
            // Indices already computed are checked now, the others when the kernel runs.
            || match indices.dtype() {
                DType::U32 => indices.peek::<u32>().map(ops::index_select::Known::U32),
                DType::I64 => indices.peek::<i64>().map(ops::index_select::Known::I64),
                _ => None,
            },
        )?;
        Tensor::record(
            OpKind::IndexSelect { dim: d },
            &[self, indices],
            self.dtype(),
            Layout::contiguous(&dims),
        )
    }
}
