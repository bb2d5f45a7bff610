//! Reductions over one dim (`sum`, `max`, `mean`, `argmax`).

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
