//! `attention` and `attention_ragged`: `softmax(q·kᵀ · scale + bias) · v` per head,
//! padded (with an optional additive bias) or over a packed batch of sequences (with
//! an optional bias by position within a sequence), each with a key window and k and v
//! of fewer (grouped) heads. Its cost is the visible (query, key) pairs.
//!
//! The file ends with its scalar reference (f64 by coordinates, for both forms, every
//! window and grouped heads) and the unit tests that hold the kernel binding to it.

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

/// The geometry of the reference's operands: q `[batch, heads, lq, dh]`, k and v
/// `[batch, kv_heads, lk, dh]`.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
struct Heads {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    lq: usize,
    lk: usize,
    dh: usize,
}

/// The file's scalar reference, for both forms, in f64 by coordinates: q, k and v
/// dense as `g` says (query head `h` reads kv head `h / (heads / kv_heads)`); `spans`
/// the (query rows, key rows) of each sequence of a batch entry (`0..lq` and `0..lk`
/// padded, each sequence's tokens ragged); query `i` of a span sees its key `j` when
/// `j + before >= i` and `j <= i + after` (positions within the span, a side of
/// `None` unbounded), with `bias(b, h, i, j)` added to the scaled score `q·k · scale`.
/// Each output row `[b, query, h, ..]` is `Σⱼ e^(sⱼ − max) vⱼ / Σⱼ e^(sⱼ − max)` over
/// the keys it sees, zeros when it sees none.
#[cfg(test)]
fn reference(
    [q, k, v]: [&[f64]; 3],
    g: Heads,
    spans: &[(std::ops::Range<usize>, std::ops::Range<usize>)],
    bias: &dyn Fn(usize, usize, usize, usize) -> f64,
    scale: f64,
    (before, after): (Option<usize>, Option<usize>),
) -> Vec<f64> {
    let Heads {
        batch,
        heads,
        kv_heads,
        lq,
        lk,
        dh,
    } = g;
    let mut out = vec![0.0; batch * lq * heads * dh];
    for b in 0..batch {
        for h in 0..heads {
            let kh = h / (heads / kv_heads);
            let q_at = |i: usize| ((b * heads + h) * lq + i) * dh;
            let kv_at = |j: usize| ((b * kv_heads + kh) * lk + j) * dh;
            for (queries, keys) in spans {
                for i in queries.clone() {
                    let pos = i - queries.start;
                    let sees = |j: &usize| {
                        let kp = j - keys.start;
                        before.is_none_or(|w| kp + w >= pos) && after.is_none_or(|w| kp <= pos + w)
                    };
                    let scores: Vec<(usize, f64)> = keys
                        .clone()
                        .filter(sees)
                        .map(|j| {
                            let dot: f64 = (0..dh).map(|d| q[q_at(i) + d] * k[kv_at(j) + d]).sum();
                            (j, dot * scale + bias(b, h, pos, j - keys.start))
                        })
                        .collect();
                    let max = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = scores.iter().map(|s| (s.1 - max).exp()).sum();
                    let row = ((b * lq + i) * heads + h) * dh;
                    for &(j, s) in &scores {
                        for d in 0..dh {
                            out[row + d] += (s - max).exp() / total * v[kv_at(j) + d];
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{self, assert_within, dense, flat, run_op, view, PARS};
    use crate::ops::Data;

    /// Values in [-1, 1] with no pattern a wrong index could reproduce.
    fn values(seed: f64) -> impl Fn(usize) -> f32 {
        move |i| ((i as f64 + seed) * 0.37).sin() as f32
    }

    /// The score scale, not exact in binary (the kernel takes it as f32).
    const SCALE: f32 = 0.35;

    /// The op's kind for `window` (`(before, after)`).
    fn kind(ragged: bool, (before, after): (Option<usize>, Option<usize>)) -> OpKind {
        OpKind::Attention {
            scale: f64::from(SCALE).to_bits(),
            ragged,
            before: before.map(|x| x as u64),
            after: after.map(|x| x as u64),
        }
    }

    /// Runs `op` on `data` with each of [`PARS`] against `want`. The bound is 2e-6
    /// absolute: the kernel's scores are f32 sums of `dh` <= 8 products of values in
    /// [-1, 1] (scaled, under 3 in size: a few 1e-7 off at most), so each weight is
    /// within about 1e-6 relative, exp within 2 ulp, and an output row is an average of
    /// v's values in [-1, 1] (1.6e-7 is the largest difference seen on Zen 5); a
    /// wrong key, head, mask or bias is off by far more.
    fn check(op: &Op, data: &[Data<'_>], want: &[f64]) {
        for par in PARS {
            let got: Vec<f32> = run_op(op, data, None, par);
            assert_within(
                &got,
                want,
                0.0,
                2e-6,
                &format_args!("{:?} {par:?}", op.kind),
            );
        }
    }

    /// Appends `bias`, when given, to the op's inputs and their data, and returns it
    /// as the reference reads it: element `(b, h, i, j)` by coordinates matched from
    /// the right (`[heads | 1, len, len]` ignores `b`), dims of 1 repeated; 0 without.
    fn with_bias<'a>(
        bias: Option<&'a (Vec<f32>, Layout)>,
        inputs: &mut Vec<(DType, Layout)>,
        data: &mut Vec<Data<'a>>,
    ) -> Box<dyn Fn(usize, usize, usize, usize) -> f64> {
        let Some((buf, bl)) = bias else {
            return Box::new(|_, _, _, _| 0.0);
        };
        inputs.push((DType::F32, *bl));
        data.push(Data::F32(buf));
        let (values, dims) = (dense(buf, bl), bl.dims().to_vec());
        Box::new(move |b, h, i, j| values[flat(&[b, h, i, j], &dims)])
    }

    /// Padded attention through the binding: q read as a transposed view of a
    /// `[batch, lq, heads, dh]` projection, k and v of fewer (grouped) heads from
    /// other orders, all padded at an offset; without a bias, with a padding mask
    /// `[batch, 1, 1, lk]` broadcast, and with a full bias of one batch entry read
    /// transposed; with every key seen, causal, a window of 3 before and 2 after, and
    /// (more queries than keys) a window that leaves rows seeing nothing (zeros).
    #[test]
    fn the_padded_binding_matches_the_reference() {
        let all_causal_window = [(None, None), (None, Some(0)), (Some(3), Some(2))];
        let unseeing = [(Some(1), Some(0)), (None, None)];
        let geometries = [
            (
                Heads {
                    batch: 2,
                    heads: 4,
                    kv_heads: 2,
                    lq: 19,
                    lk: 37,
                    dh: 8,
                },
                &all_causal_window[..],
            ),
            (
                Heads {
                    batch: 1,
                    heads: 2,
                    kv_heads: 1,
                    lq: 40,
                    lk: 7,
                    dh: 5,
                },
                &unseeing[..],
            ),
        ];
        for (g, windows) in geometries {
            let (b, heads, lq, lk, dh) = (g.batch, g.heads, g.lq, g.lk, g.dh);
            let (q, ql) = view(&[b, heads, lq, dh], &[0, 2, 1, 3], values(1.0));
            let (k, kl) = view(&[b, g.kv_heads, lk, dh], &[2, 0, 1, 3], values(2.0));
            let (v, vl) = view(&[b, g.kv_heads, lk, dh], &[1, 0, 2, 3], values(3.0));
            let dense_qkv = [dense(&q, &ql), dense(&k, &kl), dense(&v, &vl)];
            let mask = view(&[b, 1, 1, lk], &[0, 1, 2, 3], |i| -((i % 3) as f32));
            let full = view(&[1, heads, lq, lk], &[0, 1, 3, 2], values(4.0));
            for bias in [None, Some(&mask), Some(&full)] {
                let mut inputs = vec![(DType::F32, ql), (DType::F32, kl), (DType::F32, vl)];
                let mut data = vec![Data::F32(&q), Data::F32(&k), Data::F32(&v)];
                let bias_of = with_bias(bias, &mut inputs, &mut data);
                for &window in windows {
                    let op = testing::op(
                        kind(false, window),
                        &inputs,
                        (DType::F32, &[b, lq, heads, dh]),
                    );
                    let qkv = [&dense_qkv[0][..], &dense_qkv[1], &dense_qkv[2]];
                    let spans = [(0..lq, 0..lk)];
                    let want = reference(qkv, g, &spans, &*bias_of, f64::from(SCALE), window);
                    check(&op, &data, &want);
                }
            }
        }
    }

    /// Ragged attention through the binding: a packed batch of sequences of 5, 0, 16
    /// and 9 tokens (offsets read at an offset in their buffer), q, k and v of grouped
    /// heads read as transposed views, without a bias, with one per head read
    /// transposed, and with one for all heads (`[1, len, len]`, longer than any
    /// sequence); every key, causal, and a window of 2 before and 1 after.
    #[test]
    fn the_ragged_binding_matches_the_reference() {
        let (heads, kv_heads, total, dh, len) = (4, 2, 30, 8, 18);
        let offsets = [0u32, 5, 5, 21, 30];
        let offsets_buf = [&[9][..], &offsets, &[9]].concat();
        let ol = Layout::contiguous(&[offsets_buf.len()]).narrow(0, 1, offsets.len());
        let g = Heads {
            batch: 1,
            heads,
            kv_heads,
            lq: total,
            lk: total,
            dh,
        };
        let (q, ql) = view(&[1, heads, total, dh], &[0, 2, 1, 3], values(5.0));
        let (k, kl) = view(&[1, kv_heads, total, dh], &[0, 2, 1, 3], values(6.0));
        let (v, vl) = view(&[1, kv_heads, total, dh], &[2, 1, 0, 3], values(7.0));
        let dense_qkv = [dense(&q, &ql), dense(&k, &kl), dense(&v, &vl)];
        let spans: Vec<_> = offsets
            .windows(2)
            .map(|w| (w[0] as usize..w[1] as usize, w[0] as usize..w[1] as usize))
            .collect();
        let per_head = view(&[heads, len, len], &[0, 2, 1], values(8.0));
        let all_heads = view(&[1, len, len], &[0, 1, 2], values(9.0));
        for bias in [None, Some(&per_head), Some(&all_heads)] {
            let four = [
                (DType::F32, ql),
                (DType::F32, kl),
                (DType::F32, vl),
                (DType::U32, ol),
            ];
            let mut inputs = four.to_vec();
            let mut data = vec![
                Data::F32(&q),
                Data::F32(&k),
                Data::F32(&v),
                Data::U32(&offsets_buf),
            ];
            let bias_of = with_bias(bias, &mut inputs, &mut data);
            for window in [(None, None), (None, Some(0)), (Some(2), Some(1))] {
                let op = testing::op(
                    kind(true, window),
                    &inputs,
                    (DType::F32, &[1, total, heads, dh]),
                );
                let qkv = [&dense_qkv[0][..], &dense_qkv[1], &dense_qkv[2]];
                let want = reference(qkv, g, &spans, &*bias_of, f64::from(SCALE), window);
                check(&op, &data, &want);
            }
        }
    }
}
