//! Reductions over one dim (`sum`, `max`, `mean`, `argmax`).
//!
//! The file ends with its scalar reference (f64, each output reduced afresh along the
//! dim) and the unit test that holds the kernel binding to it, for f32, u32 and i64.

use super::{dst, output, per_output_element, typed, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Dims, OpKind, ReduceOp};
use crate::kernels::{self, KernelError};

/// The output dims and dtype of the reduction `op` of `x` (dims, dtype) over its dim
/// `d` (already resolved, `< x`'s rank), which is dropped or, with `keepdim`, kept
/// with size 1: `argmax` gives u32, `mean` needs a float tensor, and only `sum` takes
/// an empty dim. The error names the op and the shape.
pub(crate) fn shape(
    op: ReduceOp,
    x: (&[usize], DType),
    d: usize,
    keepdim: bool,
) -> crate::Result<(Dims, DType)> {
    let name = op.name();
    let dtype = match op {
        ReduceOp::ArgMax => DType::U32,
        ReduceOp::Mean if !x.1.is_float() => {
            return Err(Error::DType {
                op: name,
                msg: format!("needs a float tensor, got {}", x.1),
            })
        }
        _ => x.1,
    };
    if x.0[d] == 0 && op != ReduceOp::Sum {
        return Err(Error::Shape {
            op: name,
            msg: format!("dim {d} of shape {:?} is empty", x.0),
        });
    }
    let mut dims = Dims::from_slice(x.0);
    if keepdim {
        dims[d] = 1;
    } else {
        dims.remove(d);
    }
    Ok((dims, dtype))
}

/// The registry entry of the reductions.
pub(super) static FAMILY: Family = Family {
    name: "reduce",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let OpKind::Reduce { op: r, dim, .. } = op.kind else {
            return Err(KernelError(format!("{op} is not a reduction (engine bug)")));
        };
        let lay = &op.inputs[0].layout;
        match r {
            ReduceOp::ArgMax => with_dtype!(op.inputs[0].dtype, S => {
                kernels::argmax::<S>(typed(inputs[0])?, lay, dim, dst(out)?, par)
            }),
            _ => with_dtype!(output(op)?.dtype, T => {
                kernels::reduce::<T>(r, typed(inputs[0])?, lay, dim, dst(out)?, par)
            }),
        }
    },
};

/// The file's scalar reference: the reduction `op` of the dense `x` (of `dims`) over
/// `dim`, one value per element of the other dims in row-major order, each reduced
/// from the `dims[dim]` values along the dim read by coordinates. `max` is NaN when one
/// is; `argmax` is the index of the first NaN, else of the first largest.
#[cfg(test)]
fn reference(op: ReduceOp, x: &[f64], dims: &[usize], dim: usize) -> Vec<f64> {
    let (outer, len) = (dims[..dim].iter().product::<usize>(), dims[dim]);
    let inner: usize = dims[dim + 1..].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let along: Vec<f64> = (0..len).map(|j| x[(o * len + j) * inner + i]).collect();
            let first_nan = along.iter().position(|v| v.is_nan());
            let largest = along.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out.push(match op {
                ReduceOp::Sum => along.iter().sum(),
                ReduceOp::Mean => along.iter().sum::<f64>() / len as f64,
                ReduceOp::Max if first_nan.is_some() => f64::NAN,
                ReduceOp::Max => largest,
                ReduceOp::ArgMax => {
                    let first = first_nan.or_else(|| along.iter().position(|&v| v == largest));
                    first.unwrap_or(0) as f64
                }
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{self, assert_within, dense, f32_rounded, run_op, view, Elem, PARS};

    /// Each of `ops` over each dim, kept and dropped, through the binding, of x
    /// `[4, 3, 5]` read permuted from a padded buffer (`[5, 4, 3]` stored) and of x
    /// `[4, 1, 5]` broadcast to `[4, 3, 5]`, against the reference, exactly: small
    /// integer values make every sum exact in any order, and a mean is its sum divided
    /// in f64 and rounded once, as the reference's rounded to f32.
    fn check<T: Elem>(ops: &[ReduceOp], value: impl Fn(usize) -> T) {
        let dims = [4, 3, 5];
        let (a, al) = view(&dims, &[2, 0, 1], &value);
        let (b, bl) = view(&[4, 1, 5], &[0, 1, 2], &value);
        for (buf, layout) in [(&a, al), (&b, bl.broadcast_as(&dims).unwrap())] {
            let x = dense(buf, &layout);
            for &r in ops {
                for (dim, keepdim) in [(0, false), (1, true), (2, false), (2, true)] {
                    let (out, dtype) = shape(r, (&dims, T::DTYPE), dim, keepdim).unwrap();
                    let kind = OpKind::Reduce {
                        op: r,
                        dim,
                        keepdim,
                    };
                    let op = testing::op(kind, &[(T::DTYPE, layout)], (dtype, &out));
                    let want = reference(r, &x, &dims, dim);
                    let want = if dtype == DType::F32 {
                        f32_rounded(&want)
                    } else {
                        want
                    };
                    for par in PARS {
                        let what = format_args!("{r:?} of {} over {dim} {par:?}", T::DTYPE);
                        let inputs = [T::data(buf)];
                        if r == ReduceOp::ArgMax {
                            let got: Vec<u32> = run_op(&op, &inputs, None, par);
                            assert_within(&got, &want, 0.0, 0.0, &what);
                        } else {
                            let got: Vec<T> = run_op(&op, &inputs, None, par);
                            assert_within(&got, &want, 0.0, 0.0, &what);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_binding_matches_the_reference_over_strided_and_broadcast_inputs() {
        use ReduceOp::{ArgMax, Max, Mean, Sum};
        // Ties (the first largest wins) and negative values.
        check(&[Sum, Mean, Max, ArgMax], |i| ((i * 7) % 11) as f32 - 5.0);
        check(&[Sum, Max, ArgMax], |i| ((i * 7) % 11) as i64 - 5);
        check(&[Sum, Max, ArgMax], |i| ((i * 5) % 13) as u32);
        // A NaN: max is NaN, argmax its index, sum and mean NaN.
        check(&[Sum, Mean, Max, ArgMax], |i| match i % 23 {
            19 => f32::NAN,
            _ => ((i * 7) % 11) as f32 - 5.0,
        });
    }
}
