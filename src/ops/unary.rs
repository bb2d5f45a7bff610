//! Unary element-wise ops (`exp`, `gelu`, `affine`, ...): one f32 input, fused into
//! register programs when the plan builder can, else run by the unary kernel.
//!
//! The file ends with its scalar reference (each function in f64 from its definition)
//! and the unit test that holds the kernel binding to it on strided and broadcast x.

use super::{dst, per_output_element, typed, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Dims, OpKind, UnaryOp};
use crate::kernels::{self, KernelError};

/// The output dims of the unary `op` on `x` (dims, dtype): those of x, which must be
/// a float tensor (the output has its dtype). The error names the op and x.
pub(crate) fn shape(op: UnaryOp, x: (&[usize], DType)) -> crate::Result<Dims> {
    if !x.1.is_float() {
        return Err(Error::DType {
            op: op.name(),
            msg: format!(
                "needs a float tensor, got {} with shape {:?} (use to_dtype(DType::F32))",
                x.1, x.0
            ),
        });
    }
    Ok(Dims::from_slice(x.0))
}

/// The registry entry of the unary ops.
pub(super) static FAMILY: Family = Family {
    name: "unary",
    class: FusionClass::Elementwise { arity: 1 },
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let OpKind::Unary(u) = op.kind else {
            return Err(KernelError(format!("{op} is not unary (engine bug)")));
        };
        kernels::unary(u, typed(inputs[0])?, &op.inputs[0].layout, dst(out)?, par)
    },
};

/// The file's scalar reference: the unary `op` of `x` in f64, from each function's
/// definition (std's f64 functions, and `erf` by its series).
#[cfg(test)]
pub(crate) fn reference(op: UnaryOp, x: f64) -> f64 {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    match op {
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => x / 2.0 * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::GeluTanh => {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            x / 2.0 * (1.0 + inner.tanh())
        }
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Affine { mul, add } => x * f64::from_bits(mul) + f64::from_bits(add),
        UnaryOp::Powf(e) => x.powf(f64::from_bits(e)),
    }
}

/// `erf(z)` for the reference: `2/√π · e^(−z²) · Σₙ (2z²)ⁿ z / (1·3·…·(2n+1))`, a series
/// of positive terms that converges for every `z` (to f64 precision for `|z| < 6`).
#[cfg(test)]
fn erf(z: f64) -> f64 {
    let (z2, mut term, mut sum) = (z * z, z, z);
    for n in 1..200 {
        term *= 2.0 * z2 / f64::from(2 * n + 1);
        sum += term;
        if term.abs() < 1e-17 * sum.abs() {
            break;
        }
    }
    2.0 / std::f64::consts::PI.sqrt() * (-z2).exp() * sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Layout;
    use crate::ops::testing::{self, assert_within, dense, f32_rounded, run_op, view, PARS};
    use crate::ops::Data;

    /// The unary kernel itself on random views (every rank to 3, strided, offset,
    /// broadcast), against the reference rounded to f32.
    #[test]
    fn the_kernel_matches_the_reference_on_random_views() {
        use crate::kernels::testutil::{assert_close, gather, pars, random_layout, Rng};
        let mut rng = Rng::new(50);
        for case in 0..120 {
            let dims = rng.dims(case % 4, 6);
            let (buf, l) = random_layout(&mut rng, &dims, |r| r.f32() * 6.0);
            let xs = gather(&buf, &l);
            for op in UnaryOp::ALL {
                let want: Vec<f32> = xs
                    .iter()
                    .map(|&x| reference(op, f64::from(x)) as f32)
                    .collect();
                for par in pars() {
                    let mut out = vec![0.0; want.len()];
                    kernels::unary(op, &buf, &l, &mut out, par).unwrap();
                    assert_close(&out, &want, 2e-6);
                }
            }
        }
    }

    /// Every unary op through its binding, on x read permuted from a padded buffer at
    /// an offset, and broadcast along a dim of stride 0, against the reference.
    #[test]
    fn the_binding_matches_the_reference_over_strided_and_broadcast_inputs() {
        // [4, 6, 5] stored as [6, 5, 4]; [3, 1, 7] stored as [7, 3, 1] and read as
        // [3, 5, 7] (dim 1 broadcast).
        let cases: [(&[usize], &[usize], &[usize]); 2] = [
            (&[4, 6, 5], &[1, 2, 0], &[4, 6, 5]),
            (&[3, 1, 7], &[2, 0, 1], &[3, 5, 7]),
        ];
        for (stored, order, dims) in cases {
            for u in UnaryOp::ALL {
                // x in [-6, 6]; in [0.25, 6.25] for the functions of positive x.
                let positive = matches!(
                    u,
                    UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Recip | UnaryOp::Powf(_)
                );
                let (buf, base) = view(stored, order, |i| {
                    let x = (i as f64 * 0.731).sin() * 6.0;
                    (if positive { x.abs() + 0.25 } else { x }) as f32
                });
                let layout: Layout = base.broadcast_as(dims).unwrap();
                let exact: Vec<f64> = dense(&buf, &layout)
                    .into_iter()
                    .map(|x| reference(u, x))
                    .collect();
                // Negation, |x|, relu, sqrt, 1/x and x·0.5 + a (an exact product, one
                // rounded sum) are correctly rounded in f32: the reference rounded, to
                // the bit. The others are f32 forms within a few ulp (`kernels::math`
                // states each: exp 2, tanh 3, gelu 5e-7 relative; libm's ln and powf
                // 1): 2e-6 relative is 16 ulp. gelu_tanh's `1 + tanh` cancels for
                // negative x, where only tanh's absolute error (3 ulp of 1, times
                // |x|/2 <= 3) holds: 1e-6 absolute.
                let (want, rel, abs) = match u {
                    UnaryOp::Neg
                    | UnaryOp::Abs
                    | UnaryOp::Relu
                    | UnaryOp::Sqrt
                    | UnaryOp::Recip
                    | UnaryOp::Affine { .. } => (f32_rounded(&exact), 0.0, 0.0),
                    UnaryOp::GeluTanh => (exact, 2e-6, 1e-6),
                    _ => (exact, 2e-6, 0.0),
                };
                let op = testing::op(
                    OpKind::Unary(u),
                    &[(DType::F32, layout)],
                    (DType::F32, dims),
                );
                for par in PARS {
                    let got: Vec<f32> = run_op(&op, &[Data::F32(&buf)], None, par);
                    assert_within(
                        &got,
                        &want,
                        rel,
                        abs,
                        &format_args!("{u:?} {dims:?} {par:?}"),
                    );
                }
            }
        }
    }

    /// The reference's erf against values of the function (Abramowitz and Stegun,
    /// table 7.1), so the gelu it checks is the real one.
    #[test]
    fn the_reference_erf_is_erf() {
        for (z, want) in [
            (0.5, 0.520_499_877_8),
            (1.0, 0.842_700_792_9),
            (2.0, 0.995_322_265_0),
        ] {
            assert!((erf(z) - want).abs() < 1e-10, "erf({z}) = {}", erf(z));
            assert!((erf(-z) + want).abs() < 1e-10);
        }
    }
}
