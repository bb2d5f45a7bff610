//! `fill`: no input, every element set to one value cast to the output's dtype.

use super::{dst, output, per_output_element, Family, FusionClass};
use crate::ir::{Element, OpKind};
use crate::kernels::{self, KernelError};

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
