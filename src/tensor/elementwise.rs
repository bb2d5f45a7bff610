//! Element-wise ops: unary functions, binary ops with numpy broadcasting, casts.
//!
//! Each op checks dtypes (transcendental functions need f32); a binary op's shape rule
//! (one dtype on both sides, numpy broadcasting: dims matched from the right, a dim of
//! 1 stretches, missing leading dims are added) is `ops::binary::shape`.

use super::Tensor;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, DType, Layout, OpKind, UnaryOp};
use crate::ops;
use crate::runtime::TensorBuffer;

impl Tensor {
    fn binary(&self, rhs: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let dims = ops::binary::shape(
            op.name(),
            (self.dims(), self.dtype()),
            (rhs.dims(), rhs.dtype()),
        )?;
        super::checked_numel(&dims, op.name())?;
        Tensor::record(
            OpKind::Binary(op),
            &[self, rhs],
            self.dtype(),
            Layout::contiguous(&dims),
        )
    }

    /// `self + rhs`, element-wise with broadcasting.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Add)
    }

    /// `self - rhs`, element-wise with broadcasting.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Sub)
    }

    /// `self * rhs`, element-wise with broadcasting.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Mul)
    }

    /// `self / rhs`, element-wise with broadcasting (integer division by zero gives 0).
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Div)
    }

    /// The larger of `self` and `rhs`, element-wise with broadcasting.
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Maximum)
    }

    /// The smaller of `self` and `rhs`, element-wise with broadcasting.
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Minimum)
    }

    fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let dims = ops::unary::shape(op, (self.dims(), self.dtype()))?;
        Tensor::record(
            OpKind::Unary(op),
            &[self],
            self.dtype(),
            Layout::contiguous(&dims),
        )
    }

    /// `self * mul + add`, element-wise.
    pub fn affine(&self, mul: f64, add: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Affine {
            mul: mul.to_bits(),
            add: add.to_bits(),
        })
    }

    /// `e^x`, element-wise.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }

    /// Natural logarithm, element-wise.
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }

    /// Square root, element-wise.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }

    /// `1 / x`, element-wise.
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip)
    }

    /// `-x`, element-wise.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }

    /// `|x|`, element-wise.
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }

    /// Hyperbolic tangent, element-wise.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }

    /// `1 / (1 + e^-x)`, element-wise.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }

    /// `max(x, 0)`, element-wise.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }

    /// GELU in its exact (erf) form, as BERT uses it.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu)
    }

    /// GELU with the tanh approximation.
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::GeluTanh)
    }

    /// `x * sigmoid(x)`, element-wise.
    pub fn silu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Silu)
    }

    /// `x ^ e`, element-wise.
    pub fn powf(&self, e: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Powf(e.to_bits()))
    }

    /// The tensor converted to `dtype` (float to integer truncates toward zero and
    /// saturates; NaN becomes 0). Converting to the same dtype returns `self`.
    ///
    /// **Weights in reduced precision.** To `BF16`, `I8` or `BF16X3`, an f32 matrix
    /// `[k, n]` becomes a weight kept in that precision, packed once for the product
    /// kernel: `BF16` rounds each element to the nearest bfloat16 (half the memory);
    /// `I8` stores each column as signed 8-bit integers times one f32 scale (the
    /// column's largest magnitude / 127; a quarter of the memory; on the `avx2` tier,
    /// [`crate::cpu::Tier::Avx2`], the form its products take: 7-bit integers with a
    /// scale per column and group of 64 rows, the group's largest magnitude / 63);
    /// `BF16X3` keeps each
    /// element as the sum of two bfloat16 (the f32's memory), for products taken as
    /// three bf16 products on AMX tiles (see [`DType::BF16X3`]). Such a tensor can only be the right
    /// operand of [`Tensor::matmul`] or converted again; any other op on it is an
    /// [`Error::DType`]. This conversion is not lazy: it computes the source (running
    /// what it waits on) and packs it at the call, as a model does when it loads. From
    /// such a weight, `to_dtype(DType::F32)` gives its values (the rounded, split or
    /// dequantised ones). Errors: a source that is not a 2-D f32 matrix (or a
    /// weight), non-finite elements for `I8`, memory the system refuses.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        if dtype.is_weight_only() {
            return self.to_weight(dtype);
        }
        Tensor::record(
            OpKind::Cast,
            &[self],
            dtype,
            Layout::contiguous(self.dims()),
        )
    }

    /// `to_dtype` to a weight-only dtype: packs the matrix at once.
    fn to_weight(&self, dtype: DType) -> Result<Tensor> {
        let op = "to_dtype";
        ops::layout::to_weight(self.dtype(), self.dims(), dtype)?;
        let src = match self.dtype() {
            DType::F32 => self.clone(),
            _ => self.to_dtype(DType::F32)?,
        };
        let buffer = src.materialize()?;
        let data = buffer.as_slice::<f32>().unwrap_or_default();
        let packed = crate::kernels::PackedRhs::pack_as(data, src.layout(), dtype)
            .map_err(|e| Error::Arg { op, msg: e.0 })?;
        let len = src.numel();
        Ok(Tensor::ready(
            TensorBuffer::from_packed(packed, len),
            dtype,
            Layout::contiguous(src.dims()),
        ))
    }
}
