//! Reductions over one dim (`sum`, `max`, `mean`, `argmax`).

use super::{dst, output, per_output_element, typed, Family, FusionClass};
use crate::ir::{OpKind, ReduceOp};
use crate::kernels::{self, KernelError};

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
