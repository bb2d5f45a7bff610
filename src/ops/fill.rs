//! `fill`: no input, every element set to one value cast to the output's dtype.
//!
//! The file ends with its scalar reference and the unit test that holds the kernel
//! binding to it, for f32, u32 and i64.

use super::{checked_numel, dst, output, per_output_element, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Element, OpKind};
use crate::kernels::{self, KernelError};

/// Checks a fill's output (`op` is `zeros`, `ones` or `full`): a dtype that is not a
/// weight's (those are made from f32 by `to_dtype`) and `dims` within the rank and
/// element limits.
pub(crate) fn shape(op: &'static str, dims: &[usize], dtype: DType) -> crate::Result<()> {
    if dtype.is_weight_only() {
        return Err(Error::DType {
            op,
            msg: format!(
                "{dtype} tensors are weights: make an f32 one and convert it with to_dtype"
            ),
        });
    }
    checked_numel(dims, op)?;
    Ok(())
}

/// The registry entry of `fill` (`zeros`, `ones`, `full`).
pub(super) static FAMILY: Family = Family {
    name: "fill",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, _, _, out, _| {
        let OpKind::Fill { value } = op.kind else {
            return Err(KernelError(format!("{op} is not a fill (engine bug)")));
        };
        with_dtype!(output(op)?.dtype, T => {
            kernels::fill(dst::<T>(out)?, T::from_f64(f64::from_bits(value)))
        });
        Ok(())
    },
};

/// The file's scalar reference: `n` elements of `value` as a `dtype` value (f32
/// rounds; the integers drop the fraction, saturate and take NaN to 0:
/// `testing::in_dtype`, the rule of every conversion).
#[cfg(test)]
fn reference(value: f64, dtype: DType, n: usize) -> Vec<f64> {
    vec![super::testing::in_dtype(value, dtype); n]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{self, assert_within, run_op, Elem, PARS};

    /// Fills of `T` through the binding, with values that round, truncate and
    /// saturate, of a 3-D output and an empty one, against the reference, exactly.
    fn check<T: Elem>() {
        for value in [2.5, -3.7, 1e10, -1e30, f64::NAN, 0.1, -0.0] {
            for dims in [&[2, 3, 4][..], &[0, 5]] {
                let kind = OpKind::Fill {
                    value: value.to_bits(),
                };
                let op = testing::op(kind, &[], (T::DTYPE, dims));
                let want = reference(value, T::DTYPE, dims.iter().product());
                for par in PARS {
                    let got: Vec<T> = run_op(&op, &[], None, par);
                    let what = format_args!("{value} as {} {dims:?} {par:?}", T::DTYPE);
                    assert_within(&got, &want, 0.0, 0.0, &what);
                }
            }
        }
    }

    #[test]
    fn the_binding_matches_the_reference() {
        check::<f32>();
        check::<u32>();
        check::<i64>();
    }
}
