//! Normalisations over the last dim: `softmax`, `layer_norm`, `rms_norm`. Each may end
//! a chain (a product and its epilogue), else runs as its own kernel.

use super::{dst, per_output_element, typed, Family, FusionClass};
use crate::ir::OpKind;
use crate::kernels::{self, KernelError};

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
