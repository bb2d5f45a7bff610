//! `attention` and `attention_ragged`: `softmax(q·kᵀ · scale + bias) · v` per head,
//! padded (with an optional additive bias) or over a packed batch of sequences (with
//! an optional bias by position within a sequence), each with a key window and k and v
//! of fewer (grouped) heads. Its cost is the visible (query, key) pairs.

use super::{broadcast, dst, typed, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Layout, Op, OpKind};
use crate::kernels::{self, KernelError, Window, MAX_HEAD_DIM};

/// An operand as the checks see it: its dims and dtype.
type Operand<'a> = (&'a [usize], DType);

/// Checks padded attention `op` (`attention`, `attention_with`) of `[q, k, v]`, each
/// f32 `[batch, heads, len, head_dim]` (k and v with a whole divisor of q's heads, the
/// same batch and head_dim, and k and v one shape), with an optional f32 `bias`
/// broadcastable to the scores `[batch, heads, lq, lk]`, a head_dim the kernel takes
/// and a finite `scale`. Returns q's `[batch, heads, lq, head_dim]`; errors name the
/// operand and the shapes.
pub(crate) fn shape(
    op: &'static str,
    [q, k, v]: [Operand<'_>; 3],
    bias: Option<Operand<'_>>,
    scale: f32,
) -> crate::Result<[usize; 4]> {
    let named = [("q", q), ("k", k), ("v", v)];
    let all = named.into_iter().chain(bias.map(|b| ("bias", b)));
    check_operands(op, all, "4 ([batch, heads, len, head_dim])")?;
    let (qd, kd, vd) = (q.0, k.0, v.0);
    if kd[0] != qd[0] || kd[3] != qd[3] || vd != kd {
        return Err(Error::Shape {
            op,
            msg: format!(
                "q {qd:?}, k {kd:?} and v {vd:?} must agree on batch and head_dim, \
                 and k and v on heads and length"
            ),
        });
    }
    check_groups(op, qd[1], kd[1], "q", qd, kd)?;
    let [b, heads, lq, dh] = [qd[0], qd[1], qd[2], qd[3]];
    check_head(op, dh, scale)?;
    let scores = [b, heads, lq, kd[2]];
    if let Some((bd, _)) = bias {
        if bd.iter().zip(&scores).any(|(&x, &s)| x != s && x != 1) {
            return Err(Error::Shape {
                op,
                msg: format!(
                    "bias {bd:?} cannot be broadcast to the scores' [batch, heads, lq, lk] = {scores:?}"
                ),
            });
        }
    }
    Ok([b, heads, lq, dh])
}

/// Checks ragged attention `op` of `[q, k, v]`, each f32 `[heads, total_tokens,
/// head_dim]` (k and v of one shape, with a whole divisor of q's heads), by
/// `offsets`, a non-empty 1-D u32 tensor, with an optional f32 `bias` `[heads | 1, len,
/// len]`, a head_dim the kernel takes and a finite `scale`. Returns q's `[heads,
/// total_tokens, head_dim]`. The offsets' values are data, checked when the op runs.
pub(crate) fn shape_ragged(
    op: &'static str,
    [q, k, v]: [Operand<'_>; 3],
    offsets: Operand<'_>,
    bias: Option<Operand<'_>>,
    scale: f32,
) -> crate::Result<[usize; 3]> {
    let named = [("q", q), ("k", k), ("v", v)];
    check_operands(op, named, "3 ([heads, total_tokens, head_dim])")?;
    let (qd, kd, vd) = (q.0, k.0, v.0);
    if kd[1..] != qd[1..] || vd != kd {
        return Err(Error::Shape {
            op,
            msg: format!(
                "q {qd:?}, k {kd:?} and v {vd:?} must have the same shape, but for k's \
                 and v's heads, which may be fewer (a divisor of q's)"
            ),
        });
    }
    check_groups(op, qd[0], kd[0], "q", qd, kd)?;
    let [heads, total, dh] = [qd[0], qd[1], qd[2]];
    check_head(op, dh, scale)?;
    if let Some(bias) = bias {
        check_operands(op, [("bias", bias)], "3 ([heads, len, len])")?;
        let bd = bias.0;
        if (bd[0] != heads && bd[0] != 1) || bd[1] != bd[2] {
            return Err(Error::Shape {
                op,
                msg: format!(
                    "bias {bd:?} must be [heads, len, len] or [1, len, len], with {heads} heads"
                ),
            });
        }
    }
    let (od, odt) = offsets;
    if odt != DType::U32 || od.len() != 1 || od[0] == 0 {
        return Err(Error::Arg {
            op,
            msg: format!(
                "seq_offsets must be a non-empty 1-D u32 tensor (n + 1 offsets), got {odt} {od:?}"
            ),
        });
    }
    Ok([heads, total, dh])
}

/// `heads` query heads can share `kv_heads` kv heads: a whole number of each (the
/// error names q's and k's shapes, `what` the query operand).
fn check_groups(
    op: &'static str,
    heads: usize,
    kv_heads: usize,
    what: &str,
    qd: &[usize],
    kd: &[usize],
) -> crate::Result<()> {
    // (`is_multiple_of` is true for 0 heads of 0 kv heads, false for more.)
    if heads.is_multiple_of(kv_heads) {
        return Ok(());
    }
    Err(Error::Shape {
        op,
        msg: format!(
            "{what} {qd:?} has {heads} heads, not a multiple of k's and v's {kv_heads} \
             (k {kd:?}): each kv head must serve a whole group of query heads"
        ),
    })
}

/// Every operand is f32 and of `rank` (the text names the rank and the dims' meaning).
fn check_operands<'a>(
    op: &'static str,
    named: impl IntoIterator<Item = (&'static str, Operand<'a>)>,
    rank: &str,
) -> crate::Result<()> {
    for (what, (dims, dtype)) in named {
        if dtype != DType::F32 {
            return Err(Error::DType {
                op,
                msg: format!("{what} must be f32, got {dtype}"),
            });
        }
        if rank.split(' ').next().and_then(|r| r.parse().ok()) != Some(dims.len()) {
            return Err(Error::Shape {
                op,
                msg: format!("{what} must have rank {rank}, got shape {dims:?}"),
            });
        }
    }
    Ok(())
}

/// The head size fits the kernel's tiles and the scale is finite.
fn check_head(op: &'static str, dh: usize, scale: f32) -> crate::Result<()> {
    if dh > MAX_HEAD_DIM {
        return Err(Error::Arg {
            op,
            msg: format!("head_dim {dh} is above the largest supported, {MAX_HEAD_DIM}"),
        });
    }
    if !scale.is_finite() {
        return Err(Error::Arg {
            op,
            msg: format!("scale must be finite, got {scale}"),
        });
    }
    Ok(())
}

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
