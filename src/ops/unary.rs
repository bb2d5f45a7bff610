//! Unary element-wise ops (`exp`, `gelu`, `affine`, ...): one f32 input, fused into
//! register programs when the plan builder can, else run by the unary kernel.

use super::{dst, per_output_element, typed, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Dims, OpKind, UnaryOp};
use crate::kernels::{self, KernelError};

/// The output dims of the unary `op` on `x` (dims, dtype): those of x, which must be
/// a float tensor (the output has its dtype). The error names the op and x.
pub(crate) fn shape(op: UnaryOp, x: (&[usize], DType)) -> crate::Result<Dims> {
    if !x.1.is_float() {
        return Err(Error::DType {
            op: op.name(),
            msg: format!(
                "needs a float tensor, got {} with shape {:?} (use to_dtype(DType::F32))",
                x.1, x.0
            ),
        });
    }
    Ok(Dims::from_slice(x.0))
}

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
