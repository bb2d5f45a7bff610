//! The element-wise ops of a fused program applied to a tile of the accumulator, as
//! portable loops (one per op, so that each is vectorised); the vector paths use them
//! for the ops they have no intrinsics for.

use crate::ir::{BinaryOp, UnaryOp};
use crate::kernels::math;

/// `acc[i] = op(acc[i])`; one loop per op so that each is vectorised.
#[inline(always)]
pub(super) fn unary_acc(op: UnaryOp, acc: &mut [f32]) {
    #[inline(always)]
    fn map(acc: &mut [f32], f: impl Fn(f32) -> f32) {
        for x in acc.iter_mut() {
            *x = f(*x);
        }
    }
    match op {
        // The branch-free functions: one loop compiled for the CPU's SIMD level.
        UnaryOp::Exp => math::in_place(acc, math::Exp),
        UnaryOp::Log => map(acc, f32::ln),
        UnaryOp::Sqrt => map(acc, f32::sqrt),
        UnaryOp::Recip => map(acc, |x| 1.0 / x),
        UnaryOp::Neg => map(acc, |x| -x),
        UnaryOp::Abs => map(acc, f32::abs),
        UnaryOp::Tanh => math::in_place(acc, math::Tanh),
        UnaryOp::Sigmoid => math::in_place(acc, math::Sigmoid),
        UnaryOp::Relu => map(acc, math::relu),
        UnaryOp::Gelu => math::in_place(acc, math::Gelu),
        UnaryOp::GeluTanh => math::in_place(acc, math::GeluTanh),
        UnaryOp::Silu => math::in_place(acc, math::Silu),
        UnaryOp::Affine { mul, add } => {
            let (m, c) = affine(mul, add);
            map(acc, move |x| x * m + c)
        }
        UnaryOp::Powf(e) => {
            let e = f64::from_bits(e) as f32;
            map(acc, move |x| x.powf(e))
        }
    }
}

/// The f32 multiplier and addend of an `Affine` op.
#[inline(always)]
pub(super) fn affine(mul: u64, add: u64) -> (f32, f32) {
    (f64::from_bits(mul) as f32, f64::from_bits(add) as f32)
}

/// `acc[i] = op(acc[i], x[i])` (`acc_left`) or `op(x[i], acc[i])`, for the elements
/// both have; one loop per op so that each is vectorised.
#[inline(always)]
pub(super) fn binary_acc(op: BinaryOp, acc: &mut [f32], x: &[f32], acc_left: bool) {
    use crate::ir::Element;
    #[inline(always)]
    fn zip(acc: &mut [f32], x: &[f32], f: impl Fn(f32, f32) -> f32) {
        for (a, &y) in acc.iter_mut().zip(x) {
            *a = f(*a, y);
        }
    }
    let (max, min) = (<f32 as Element>::maximum, <f32 as Element>::minimum);
    match (op, acc_left) {
        (BinaryOp::Add, _) => zip(acc, x, |a, y| a + y),
        (BinaryOp::Mul, _) => zip(acc, x, |a, y| a * y),
        (BinaryOp::Sub, true) => zip(acc, x, |a, y| a - y),
        (BinaryOp::Sub, false) => zip(acc, x, |a, y| y - a),
        (BinaryOp::Div, true) => zip(acc, x, |a, y| a / y),
        (BinaryOp::Div, false) => zip(acc, x, |a, y| y / a),
        (BinaryOp::Maximum, true) => zip(acc, x, max),
        (BinaryOp::Maximum, false) => zip(acc, x, move |a, y| max(y, a)),
        (BinaryOp::Minimum, true) => zip(acc, x, min),
        (BinaryOp::Minimum, false) => zip(acc, x, move |a, y| min(y, a)),
    }
}
