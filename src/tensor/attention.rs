//! [`Tensor::attention`]: scaled dot-product attention as one op, recorded for the
//! fused kernel (`kernels::attention`), which never stores the score matrix.

use super::Tensor;
use crate::ir::{Layout, OpKind};
use crate::kernels::MAX_HEAD_DIM;
use crate::{DType, Error, Result};

impl Tensor {
    /// Scaled dot-product attention: `softmax(q · kᵀ · scale + bias) · v` for every
    /// batch and head, with `self` as `q`.
    ///
    /// - `self` (q) is `[batch, heads, lq, head_dim]`, `k` and `v` are
    ///   `[batch, heads, lk, head_dim]`, all f32. They may be views (a permuted
    ///   narrow of a fused QKV projection, say): they are read where they lie as long
    ///   as each row's `head_dim` elements are contiguous (otherwise they are copied
    ///   first).
    /// - `bias`, when given, is added to the scaled scores before the softmax: 0 keeps
    ///   a key, a large negative number (`-1e9`, say) masks it out. Rank 4, each dim
    ///   equal to that of `[batch, heads, lq, lk]` or 1 (a padding mask is
    ///   `[batch, 1, 1, lk]`).
    /// - The result is `[batch, lq, heads, head_dim]`, heads interleaved per query, so
    ///   that `reshape(&[batch * lq, heads * head_dim])` (what an output projection
    ///   reads) is free. (`transpose(1, 2)` gives the `[batch, heads, lq, head_dim]`
    ///   order of other libraries as a view.)
    ///
    /// The kernel keeps one block of scores at a time in cache and never writes the
    /// `[batch, heads, lq, lk]` score tensor; every result is within 1e-6 (relative to
    /// the largest) of `q.matmul(kᵀ) · scale + bias → softmax → matmul(v)`
    /// (`tests/attention.rs`).
    /// `head_dim` is at most 256.
    pub fn attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        bias: Option<&Tensor>,
        scale: f32,
    ) -> Result<Tensor> {
        let op = "attention";
        let named = [("q", self), ("k", k), ("v", v)];
        for (what, t) in named.iter().chain(bias.map(|b| ("bias", b)).iter()) {
            if t.dtype() != DType::F32 {
                return Err(Error::DType {
                    op,
                    msg: format!("{what} must be f32, got {}", t.dtype()),
                });
            }
            if t.rank() != 4 {
                return Err(Error::Shape {
                    op,
                    msg: format!(
                        "{what} must have rank 4 ([batch, heads, len, head_dim]), got shape {:?}",
                        t.dims()
                    ),
                });
            }
        }
        let (qd, kd, vd) = (self.dims(), k.dims(), v.dims());
        if kd[..2] != qd[..2] || kd[3] != qd[3] || vd != kd {
            return Err(Error::Shape {
                op,
                msg: format!(
                    "q {qd:?}, k {kd:?} and v {vd:?} must agree on batch, heads and head_dim, \
                     and k and v on length"
                ),
            });
        }
        let [b, heads, lq, dh] = [qd[0], qd[1], qd[2], qd[3]];
        let lk = kd[2];
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
        let scores = [b, heads, lq, lk];
        if let Some(bias) = bias {
            let bd = bias.dims();
            if bd.iter().zip(&scores).any(|(&x, &s)| x != s && x != 1) {
                return Err(Error::Shape {
                    op,
                    msg: format!(
                        "bias {bd:?} cannot be broadcast to the scores' [batch, heads, lq, lk] = {scores:?}"
                    ),
                });
            }
        }
        let rows = |t: &Tensor| -> Result<Tensor> {
            let l = t.layout();
            if l.dims()[3] > 1 && l.strides()[3] != 1 {
                t.contiguous()
            } else {
                Ok(t.clone())
            }
        };
        let (q, k, v) = (rows(self)?, rows(k)?, rows(v)?);
        let out = Layout::contiguous(&[b, lq, heads, dh]);
        super::checked_numel(out.dims(), op)?;
        let kind = OpKind::Attention {
            scale: f64::from(scale).to_bits(),
        };
        Ok(match bias {
            Some(bias) => Tensor::record(kind, &[&q, &k, &v, bias], DType::F32, out),
            None => Tensor::record(kind, &[&q, &k, &v], DType::F32, out),
        })
    }
}
