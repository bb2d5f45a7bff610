//! `attention` and `attention_ragged`: `softmax(q·kᵀ · scale + bias) · v` per head,
//! padded (with an optional additive bias) or over a packed batch of sequences (with
//! an optional bias by position within a sequence).

use super::{broadcast, dst, per_output_element, typed, Family, FusionClass};
use crate::ir::{Layout, OpKind};
use crate::kernels::{self, KernelError};

/// The registry entry of attention.
pub(super) static FAMILY: Family = Family {
    name: "attention",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let OpKind::Attention { scale, ragged } = op.kind else {
            return Err(KernelError(format!("{op} is not attention (engine bug)")));
        };
        let lay = |i: usize| &op.inputs[i].layout;
        let scale = f64::from_bits(scale) as f32;
        if ragged {
            // A bias `[heads | 1, len, len]` is read as `[1, heads, len, len]`.
            let bias = match op.inputs.get(4) {
                None => None,
                Some(b) => {
                    let len = b.layout.dims()[1];
                    let dims = [1, lay(0).dims()[1], len, len];
                    Some((typed(inputs[4])?, broadcast(&b.layout.unsqueeze(0), &dims)?))
                }
            };
            return kernels::attention_ragged(
                typed(inputs[0])?,
                lay(0),
                typed(inputs[1])?,
                lay(1),
                typed(inputs[2])?,
                lay(2),
                contiguous_u32(typed(inputs[3])?, lay(3))?,
                bias.as_ref().map(|(data, l)| (*data, l)),
                scale,
                dst(out)?,
                par,
            );
        }
        let (q, k) = (lay(0), lay(1));
        let bias = match op.inputs.len() {
            3 => None,
            _ => {
                let dims = [q.dims()[0], q.dims()[1], q.dims()[2], k.dims()[2]];
                Some((typed(inputs[3])?, broadcast(lay(3), &dims)?))
            }
        };
        kernels::attention(
            typed(inputs[0])?,
            q,
            typed(inputs[1])?,
            k,
            typed(inputs[2])?,
            lay(2),
            bias.as_ref().map(|(data, l)| (*data, l)),
            scale,
            dst(out)?,
            par,
        )
    },
};

/// The elements of a contiguous 1-D u32 input (the sequence offsets of a packed batch).
fn contiguous_u32<'a>(data: &'a [u32], layout: &Layout) -> Result<&'a [u32], KernelError> {
    let n = layout.dims.first().copied().unwrap_or(0);
    if layout.dims.len() != 1 || (n > 1 && layout.strides[0] != 1) {
        return Err(KernelError(format!(
            "sequence offsets must be a contiguous 1-D tensor, got dims {:?} (engine bug)",
            layout.dims
        )));
    }
    data.get(layout.offset..layout.offset + n).ok_or_else(|| {
        KernelError(format!(
            "sequence offsets {}..{} lie outside their buffer of {}",
            layout.offset,
            layout.offset + n,
            data.len()
        ))
    })
}
