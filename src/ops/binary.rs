//! Binary element-wise ops (`add`, `mul`, `maximum`, ...): two inputs of one dtype
//! broadcast to the output's dims, fused into register programs when the plan builder
//! can, else run by the binary kernel.

use super::{broadcast, dst, output, per_output_element, typed, Family, FusionClass};
use crate::error::{Error, Result};
use crate::ir::{DType, Dims, OpKind};
use crate::kernels::{self, KernelError};

/// The output dims of the binary op `op` on `a` and `b` (dims, dtype): both of one
/// dtype, their shapes broadcast together. The error names the op and both.
pub(crate) fn shape(op: &'static str, a: (&[usize], DType), b: (&[usize], DType)) -> Result<Dims> {
    if a.1 != b.1 {
        return Err(Error::DType {
            op,
            msg: format!(
                "operands have different dtypes, {} and {} (convert one with to_dtype)",
                a.1, b.1
            ),
        });
    }
    broadcast_shape(a.0, b.0, op)
}

/// The shape both operands broadcast to, or an error naming `op` and both shapes.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize], op: &'static str) -> Result<Dims> {
    let rank = a.len().max(b.len());
    // Both operands are tensors, so both ranks (and the result's) are at most MAX_RANK.
    let mut out = Dims::zeros(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            _ if da == db => da,
            (1, d) | (d, 1) => d,
            _ => {
                return Err(Error::Shape {
                    op,
                    msg: format!(
                        "shapes {a:?} and {b:?} cannot be broadcast together \
                         (dim {i} of the result: {da} vs {db})"
                    ),
                })
            }
        };
    }
    Ok(out)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_shapes() {
        assert_eq!(
            *broadcast_shape(&[2, 1, 3], &[4, 1], "add").unwrap(),
            [2, 4, 3]
        );
        assert_eq!(*broadcast_shape(&[], &[2], "add").unwrap(), [2]);
        let e = broadcast_shape(&[2, 3], &[4], "add")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("add") && e.contains("[2, 3]") && e.contains("[4]"),
            "{e}"
        );
    }
}
