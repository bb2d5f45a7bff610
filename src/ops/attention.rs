//! `attention` and `attention_ragged`: `softmax(q·kᵀ · scale + bias) · v` per head,
//! padded (with an optional additive bias) or over a packed batch of sequences (with
//! an optional bias by position within a sequence), each with a key window and k and v
//! of fewer (grouped) heads. Its cost is the visible (query, key) pairs.

use super::{broadcast, dst, typed, Family, FusionClass};
use crate::ir::{Layout, Op, OpKind};
use crate::kernels::{self, KernelError, Window};

/// The registry entry of attention.
pub(super) static FAMILY: Family = Family {
    name: "attention",
    class: FusionClass::Single,
    work,
    run: |op, inputs, _, out, par| {
        let OpKind::Attention {
            scale,
            ragged,
            before,
            after,
        } = op.kind
        else {
            return Err(KernelError(format!("{op} is not attention (engine bug)")));
        };
        let lay = |i: usize| &op.inputs[i].layout;
        let scale = f64::from_bits(scale) as f32;
        let window = window_of(before, after);
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
                window,
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
            window,
            dst(out)?,
            par,
        )
    },
};

/// The kernel's window from the op's fields (a count past `usize` sees every key).
fn window_of(before: Option<u64>, after: Option<u64>) -> Window {
    let wide = |x: Option<u64>| x.and_then(|x| usize::try_from(x).ok());
    Window {
        before: wide(before),
        after: wide(after),
    }
}

/// The cost: `heads · head_dim` per visible (query, key) pair. Padded: the window's
/// pairs of `lq` queries and `lk` keys per batch entry. Ragged: the sequence lengths
/// are data, so one key per token whatever the window (a window only narrows it), the
/// output's size as before windows.
fn work(op: &Op) -> usize {
    let OpKind::Attention {
        before,
        after,
        ragged,
        ..
    } = op.kind
    else {
        return 0;
    };
    let (Some(q), Some(k)) = (op.inputs.first(), op.inputs.get(1)) else {
        return 0;
    };
    let (qd, kd) = (q.layout.dims(), k.layout.dims());
    if qd.len() != 4 || kd.len() != 4 {
        return 0;
    }
    let pairs = if ragged {
        qd[2]
    } else {
        window_of(before, after).pairs(qd[2], kd[2])
    };
    qd[0]
        .saturating_mul(qd[1])
        .saturating_mul(qd[3])
        .saturating_mul(pairs)
}

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
