//! `fill`: no input, every element set to one value cast to the output's dtype.

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
