//! `index_select`: rows of one dim of a source picked by 1-D u32 or i64 indices.

use super::{dst, output, per_output_element, typed, Family, FusionClass};
use crate::ir::OpKind;
use crate::kernels::{self, KernelError};

/// The registry entry of `index_select`.
pub(super) static FAMILY: Family = Family {
    name: "index_select",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let OpKind::IndexSelect { dim } = op.kind else {
            return Err(KernelError(format!(
                "{op} is not index_select (engine bug)"
            )));
        };
        with_dtype!(output(op)?.dtype, T => {
            with_dtype!(op.inputs[1].dtype, I => kernels::index_select::<T, I>(
                typed(inputs[0])?,
                &op.inputs[0].layout,
                typed(inputs[1])?,
                &op.inputs[1].layout,
                dim,
                dst(out)?,
                par,
            ))
        })
    },
};
