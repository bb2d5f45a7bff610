//! Unary element-wise ops (`exp`, `gelu`, `affine`, ...): one f32 input, fused into
//! register programs when the plan builder can, else run by the unary kernel.

use super::{dst, per_output_element, typed, Family, FusionClass};
use crate::ir::OpKind;
use crate::kernels::{self, KernelError};

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
