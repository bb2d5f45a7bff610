//! Binary element-wise ops (`add`, `mul`, `maximum`, ...): two inputs of one dtype
//! broadcast to the output's dims, fused into register programs when the plan builder
//! can, else run by the binary kernel.
//!
//! The file ends with its scalar reference (f64, broadcast by coordinates) and the unit
//! test that holds the kernel binding to it, for f32, u32 and i64.

use super::{broadcast, dst, output, per_output_element, typed, Family, FusionClass};
use crate::error::{Error, Result};
#[cfg(test)]
use crate::ir::BinaryOp;
use crate::ir::{DType, Dims, OpKind};
use crate::kernels::{self, KernelError};

/// The output dims of the binary op `op` on `a` and `b` (dims, dtype): both of one
/// dtype, their shapes broadcast together. The error names the op and both.
pub(crate) fn shape(op: &'static str, a: (&[usize], DType), b: (&[usize], DType)) -> Result<Dims> {
    if a.1 != b.1 {
        return Err(Error::DType {
            op,
            msg: format!(
                "operands have different dtypes, {} and {} (convert one with to_dtype)",
                a.1, b.1
            ),
        });
    }
    broadcast_shape(a.0, b.0, op)
}

/// The shape both operands broadcast to, or an error naming `op` and both shapes.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize], op: &'static str) -> Result<Dims> {
    let rank = a.len().max(b.len());
    // Both operands are tensors, so both ranks (and the result's) are at most MAX_RANK.
    let mut out = Dims::zeros(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            _ if da == db => da,
            (1, d) | (d, 1) => d,
            _ => {
                return Err(Error::Shape {
                    op,
                    msg: format!(
                        "shapes {a:?} and {b:?} cannot be broadcast together \
                         (dim {i} of the result: {da} vs {db})"
                    ),
                })
            }
        };
    }
    Ok(out)
}

/// The registry entry of the binary ops.
pub(super) static FAMILY: Family = Family {
    name: "binary",
    class: FusionClass::Elementwise { arity: 2 },
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let OpKind::Binary(bin) = op.kind else {
            return Err(KernelError(format!("{op} is not binary (engine bug)")));
        };
        let desc = output(op)?;
        let l = broadcast(&op.inputs[0].layout, &desc.layout.dims)?;
        let r = broadcast(&op.inputs[1].layout, &desc.layout.dims)?;
        with_dtype!(desc.dtype, T => kernels::binary::<T>(
            bin,
            typed(inputs[0])?,
            &l,
            typed(inputs[1])?,
            &r,
            dst(out)?,
            par,
        ))
    },
};

/// The file's scalar reference: `op` of `a` and `b` (dense, with their dims) broadcast
/// to `out` by coordinates, in f64, for elements of `dtype`: integer division drops the
/// fraction and gives 0 for a zero divisor, u32 wraps, `maximum` and `minimum`
/// propagate NaN.
#[cfg(test)]
fn reference(
    op: BinaryOp,
    (a, a_dims): (&[f64], &[usize]),
    (b, b_dims): (&[f64], &[usize]),
    out: &[usize],
    dtype: DType,
) -> Vec<f64> {
    use super::testing::flat;
    let integer = dtype != DType::F32;
    let nan_or = |x: f64, y: f64, pick: fn(f64, f64) -> f64| {
        if x.is_nan() || y.is_nan() {
            f64::NAN
        } else {
            pick(x, y)
        }
    };
    crate::kernels::testutil::indices(out)
        .iter()
        .map(|idx| {
            let (x, y) = (a[flat(idx, a_dims)], b[flat(idx, b_dims)]);
            let r = match op {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x * y,
                BinaryOp::Div if integer && y == 0.0 => 0.0,
                BinaryOp::Div if integer => (x / y).trunc(),
                BinaryOp::Div => x / y,
                BinaryOp::Maximum => nan_or(x, y, f64::max),
                BinaryOp::Minimum => nan_or(x, y, f64::min),
            };
            match dtype {
                DType::U32 => r.rem_euclid(2f64.powi(32)),
                _ => r,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{self, assert_within, dense, f32_rounded, run_op, view, Elem, PARS};

    #[test]
    fn broadcast_shapes() {
        assert_eq!(
            *broadcast_shape(&[2, 1, 3], &[4, 1], "add").unwrap(),
            [2, 4, 3]
        );
        assert_eq!(*broadcast_shape(&[], &[2], "add").unwrap(), [2]);
        let e = broadcast_shape(&[2, 3], &[4], "add")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("add") && e.contains("[2, 3]") && e.contains("[4]"),
            "{e}"
        );
    }

    /// Each op of `ops` through the binding, `a` (`[3, 1, 5]` stored as `[5, 3, 1]`,
    /// broadcast over dim 1) with `b` (`[4, 5]` stored transposed), and `a` with a
    /// same-shaped `b` (both permuted), against the reference, exactly: the values are
    /// small integers (0 among them), so every sum, difference and product is exact,
    /// and an f32 quotient is the exact one rounded to f32 (as the reference's,
    /// rounded: f64 holds the quotient of two f32 to more than twice their precision).
    fn check<T: Elem>(ops: &[BinaryOp], value: impl Fn(usize) -> T) {
        let (a, al) = view(&[3, 1, 5], &[2, 0, 1], &value);
        let (b, bl) = view(&[4, 5], &[1, 0], |i| value(i + 7));
        let (c, cl) = view(&[3, 4, 5], &[1, 2, 0], |i| value(i * 3 + 1));
        for &bin in ops {
            for (rhs, rl) in [(&b, bl), (&c, cl)] {
                let out = [3, 4, 5];
                let op = testing::op(
                    OpKind::Binary(bin),
                    &[(T::DTYPE, al), (T::DTYPE, rl)],
                    (T::DTYPE, &out),
                );
                let want = reference(
                    bin,
                    (&dense(&a, &al), al.dims()),
                    (&dense(rhs, &rl), rl.dims()),
                    &out,
                    T::DTYPE,
                );
                let want = if T::DTYPE == DType::F32 {
                    f32_rounded(&want)
                } else {
                    want
                };
                for par in PARS {
                    let got: Vec<T> = run_op(&op, &[T::data(&a), T::data(rhs)], None, par);
                    let what = format_args!("{bin:?} {} by {:?} {par:?}", T::DTYPE, rl.dims());
                    assert_within(&got, &want, 0.0, 0.0, &what);
                }
            }
        }
    }

    #[test]
    fn the_binding_matches_the_reference_over_strided_and_broadcast_inputs() {
        check(&BinaryOp::ALL, |i| ((i * 7) % 17) as f32 - 8.0);
        check(&BinaryOp::ALL, |i| ((i * 7) % 17) as i64 - 8);
        // u32: sums, products, and differences that wrap.
        check(&BinaryOp::ALL, |i| ((i * 7) % 17) as u32);
        // NaN in either operand of maximum and minimum gives NaN.
        check(&[BinaryOp::Maximum, BinaryOp::Minimum], |i| {
            if i % 5 == 2 {
                f32::NAN
            } else {
                (i % 9) as f32 - 4.0
            }
        });
    }
}
