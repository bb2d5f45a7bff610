//! Normalisations over the last dim: `softmax`, `layer_norm`, `rms_norm`. Each may end
//! a chain (a product and its epilogue), else runs as its own kernel.

use super::{dst, per_output_element, typed, Family, FusionClass};
use crate::error::{Error, Result};
use crate::ir::{DType, Dims, OpKind};
use crate::kernels::{self, KernelError};

/// Checks softmax's input (over a dim the `Tensor` method has resolved, and moves last
/// by transposing around the op): f32. The error names the dtype and the shape.
pub(crate) fn softmax_shape(x: (&[usize], DType)) -> Result<()> {
    f32_only("softmax", x.0, x.1)
}

/// `Ok` for an f32 operand; the error names `op`, the dtype and the shape.
fn f32_only(op: &'static str, dims: &[usize], dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 => Ok(()),
        _ => Err(Error::DType {
            op,
            msg: format!("needs an f32 tensor, got {dtype} with shape {dims:?}"),
        }),
    }
}

/// The output dims of the norm `op` (`layer_norm`, `rms_norm`) of `x` with its
/// per-feature `params` (name, dims, dtype: `weight`, and `bias` for layer norm): x
/// f32 of rank 1 or more, each parameter f32 `[n]` with `n` x's last dim. The error
/// names the op and the shapes.
pub(crate) fn shape(
    op: &'static str,
    x: (&[usize], DType),
    params: &[(&str, &[usize], DType)],
) -> Result<Dims> {
    f32_only(op, x.0, x.1)?;
    let Some(&n) = x.0.last() else {
        return Err(Error::Shape {
            op,
            msg: "needs a tensor of rank 1 or more, got a scalar".into(),
        });
    };
    for &(name, dims, dtype) in params {
        f32_only(op, dims, dtype)?;
        if dims != [n] {
            return Err(Error::Shape {
                op,
                msg: format!(
                    "{name} has shape {dims:?} but the input {:?} needs [{n}] (its last dim)",
                    x.0
                ),
            });
        }
    }
    Ok(Dims::from_slice(x.0))
}

/// The registry entry of the row normalisations.
pub(super) static FAMILY: Family = Family {
    name: "norm",
    class: FusionClass::RowNorm,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let lay = |i: usize| &op.inputs[i].layout;
        match op.kind {
            OpKind::Softmax => kernels::softmax(typed(inputs[0])?, lay(0), dst(out)?, par),
            OpKind::LayerNorm { eps } => kernels::layer_norm(
                typed(inputs[0])?,
                lay(0),
                typed(inputs[1])?,
                lay(1),
                typed(inputs[2])?,
                lay(2),
                f64::from_bits(eps),
                dst(out)?,
                par,
            ),
            OpKind::RmsNorm { eps } => kernels::rms_norm(
                typed(inputs[0])?,
                lay(0),
                typed(inputs[1])?,
                lay(1),
                f64::from_bits(eps),
                dst(out)?,
                par,
            ),
            _ => Err(KernelError(format!("{op} is not a norm (engine bug)"))),
        }
    },
};
