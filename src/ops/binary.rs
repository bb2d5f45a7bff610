//! Binary element-wise ops (`add`, `mul`, `maximum`, ...): two inputs of one dtype
//! broadcast to the output's dims, fused into register programs when the plan builder
//! can, else run by the binary kernel.

use super::{broadcast, dst, output, per_output_element, typed, Family, FusionClass};
use crate::ir::OpKind;
use crate::kernels::{self, KernelError};

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
