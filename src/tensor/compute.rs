//! Matmul, reductions, softmax and norms: the ops that combine many elements into one.
//!
//! Reductions work over one dim and drop it (or keep it with size 1 for the `_keepdim`
//! forms). Softmax works over any dim; the kernel works over the last, so another dim
//! is moved last and back with views. Norms work over the last dim, with per-feature
//! weights (and bias) of that size.

use super::{Dim, Tensor};
use crate::error::Result;
use crate::ir::{DType, Layout, OpKind, ReduceOp};
use crate::ops;

impl Tensor {
    /// Prepares this matrix to be the right operand of many products (a model's
    /// weight): computes it if needed, then packs it once, now, into the layout the
    /// matrix-product kernel streams, so every later `x.matmul(&w)` (and every chain
    /// headed by one) reads the packed copy instead of repacking the weight on each
    /// call. Without it, a tensor is packed the second time it is a right operand.
    ///
    /// The packed copy costs as much memory again as the matrix (it counts in
    /// `stats().live_bytes`) and is freed with the tensor's buffer. It is a no-op for
    /// a tensor that is not an f32 matrix of at least 16 × 16, and on a CPU without
    /// AVX-512, where products use `gemm` as before. Fails only if computing the
    /// tensor fails.
    pub fn prepack(&self) -> Result<()> {
        if self.dtype() != DType::F32 || self.rank() != 2 {
            return Ok(());
        }
        let buffer = self.materialize()?;
        // Packed for the layout a product reads it through: its own.
        let _ = buffer.packed_rhs(self.layout(), true);
        Ok(())
    }

    /// Matrix product of the last two dims, `[.., m, k] x [.., k, n] -> [.., m, n]`;
    /// leading (batch) dims broadcast as in numpy. Both operands have rank 2 or more;
    /// the left one is f32, the right one f32 or a weight kept in `BF16` or `I8` (see
    /// [`Tensor::to_dtype`]: the product then reads the weight's packed form, rounds or
    /// quantises the left rows inside the kernel, and sums in f32). The result is f32.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let op = "matmul";
        let dims = ops::matmul::shape((self.dims(), self.dtype()), (rhs.dims(), rhs.dtype()))?;
        super::checked_numel(&dims, op)?;
        Tensor::record(
            OpKind::MatMul,
            &[self, rhs],
            DType::F32,
            Layout::contiguous(&dims),
        )
    }

    /// Rotary position embedding in the "rotate half" form of HF transformers
    /// (ModernBERT, Qwen3, Llama): `self` is f32 `[.., seq, dh]` or
    /// `[.., seq, heads, dh]` with `dh` even, `cos` and `sin` are f32 tables
    /// `[seq, dh/2]` (or `[seq, 1, dh/2]` to pick the heads form when `heads == seq`).
    /// With `x1`, `x2` the two halves of each row and `c`, `s` the tables' row at its
    /// position: `[x1·c − x2·s, x2·c + x1·s]`. Fails, naming the op and the shapes, on
    /// other dtypes or shapes.
    pub fn rotary(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let dims = crate::ops::rotary::shape(
            (self.dims(), self.dtype()),
            (cos.dims(), cos.dtype()),
            (sin.dims(), sin.dtype()),
        )?;
        Tensor::record(
            OpKind::Rotary,
            &[self, cos, sin],
            DType::F32,
            Layout::contiguous(&dims),
        )
    }

    /// The running sum along `dim` (f32, u32 or i64; the integers wrap on overflow):
    /// element `i` of the dim is the sum of elements `0..=i`, so lengths `[3, 1, 2]`
    /// give the ends `[3, 4, 6]`. Same dims and dtype as `self`.
    pub fn cumsum(&self, dim: impl Dim) -> Result<Tensor> {
        let d = dim.resolve(self.rank(), "cumsum")?;
        ops::cumsum::shape((self.dims(), self.dtype()), d)?;
        Tensor::record(
            OpKind::Cumsum { dim: d },
            &[self],
            self.dtype(),
            Layout::contiguous(self.dims()),
        )
    }

    fn reduce(&self, op: ReduceOp, dim: impl Dim, keepdim: bool) -> Result<Tensor> {
        let d = dim.resolve(self.rank(), op.name())?;
        let (dims, dtype) = ops::reduce::shape(op, (self.dims(), self.dtype()), d, keepdim)?;
        Tensor::record(
            OpKind::Reduce {
                op,
                dim: d,
                keepdim,
            },
            &[self],
            dtype,
            Layout::contiguous(&dims),
        )
    }

    /// Sum over `dim`, which is removed.
    pub fn sum(&self, dim: impl Dim) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dim, false)
    }

    /// Sum over `dim`, which is kept with size 1.
    pub fn sum_keepdim(&self, dim: impl Dim) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dim, true)
    }

    /// Mean over `dim` (f32 only), which is removed.
    pub fn mean(&self, dim: impl Dim) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, dim, false)
    }

    /// Mean over `dim` (f32 only), which is kept with size 1.
    pub fn mean_keepdim(&self, dim: impl Dim) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, dim, true)
    }

    /// Largest element over `dim`, which is removed.
    pub fn max(&self, dim: impl Dim) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dim, false)
    }

    /// Largest element over `dim`, which is kept with size 1.
    pub fn max_keepdim(&self, dim: impl Dim) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dim, true)
    }

    /// Index (u32) of the first largest element over `dim`, which is removed.
    pub fn argmax(&self, dim: impl Dim) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, dim, false)
    }

    /// Softmax over `dim` (f32 only): `exp(x - max) / sum(exp(x - max))`.
    pub fn softmax(&self, dim: impl Dim) -> Result<Tensor> {
        let op = "softmax";
        let d = dim.resolve(self.rank(), op)?;
        ops::norm::softmax_shape((self.dims(), self.dtype()))?;
        let last = self.rank() - 1;
        if d != last {
            return self.transpose(d, last)?.softmax(last)?.transpose(d, last);
        }
        Tensor::record(
            OpKind::Softmax,
            &[self],
            DType::F32,
            Layout::contiguous(self.dims()),
        )
    }

    /// Layer normalisation over the last dim: `(x - mean) / sqrt(var + eps) * weight +
    /// bias`, with the biased variance; `weight` and `bias` are 1-D of the last dim's
    /// size.
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        let op = "layer_norm";
        let params = [
            ("weight", weight.dims(), weight.dtype()),
            ("bias", bias.dims(), bias.dtype()),
        ];
        ops::norm::shape(op, (self.dims(), self.dtype()), &params)?;
        Tensor::record(
            OpKind::LayerNorm { eps: eps.to_bits() },
            &[self, weight, bias],
            DType::F32,
            Layout::contiguous(self.dims()),
        )
    }

    /// RMS normalisation over the last dim: `x / sqrt(mean(x^2) + eps) * weight`;
    /// `weight` is 1-D of the last dim's size.
    pub fn rms_norm(&self, weight: &Tensor, eps: f64) -> Result<Tensor> {
        let op = "rms_norm";
        let params = [("weight", weight.dims(), weight.dtype())];
        ops::norm::shape(op, (self.dims(), self.dtype()), &params)?;
        Tensor::record(
            OpKind::RmsNorm { eps: eps.to_bits() },
            &[self, weight],
            DType::F32,
            Layout::contiguous(self.dims()),
        )
    }
}
