//! `cat`: any number of inputs joined along one dim.

use super::{dst, output, per_output_element, typed, Family, FusionClass};
use crate::ir::OpKind;
use crate::kernels::{self, KernelError};

/// The registry entry of `cat`.
pub(super) static FAMILY: Family = Family {
    name: "cat",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let OpKind::Cat { dim } = op.kind else {
            return Err(KernelError(format!("{op} is not cat (engine bug)")));
        };
        with_dtype!(output(op)?.dtype, T => {
            let srcs = inputs
                .iter()
                .zip(&op.inputs)
                .map(|(x, d)| Ok((typed::<T>(*x)?, &d.layout)))
                .collect::<Result<Vec<_>, KernelError>>()?;
            kernels::cat::<T>(&srcs, dim, dst(out)?, par)
        })
    },
};
