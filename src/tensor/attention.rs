//! [`Tensor::attention`]: scaled dot-product attention as one op, recorded for the
//! fused kernel (`kernels::attention`), which never stores the score matrix; and
//! [`Tensor::attention_ragged`], the same over a packed batch of sequences of
//! different lengths (no padding), each attending only to itself. Both take a
//! [`KeyWindow`] (causal, sliding-window and local attention, whose hidden keys the
//! kernel never reads) and k and v of fewer, grouped heads
//! ([`Tensor::attention_with`], [`Tensor::attention_ragged_with`]).

use std::fmt;

use super::Tensor;
use crate::ir::{Layout, OpKind};
use crate::ops;
use crate::{DType, Result};

/// Which keys each query of an attention sees, by position (within its sequence for
/// the ragged form): query `i` sees key `j` iff `j + before >= i` (when `before` is
/// `Some`) and `j <= i + after` (when `after` is `Some`). The kernel skips the key
/// tiles a block of queries does not see, rather than adding a `-1e9` mask to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyWindow {
    /// How many keys before its own position a query sees at most; `None`: all.
    pub before: Option<usize>,
    /// How many keys after its own position a query sees at most; `None`: all.
    pub after: Option<usize>,
}

impl KeyWindow {
    /// Every key (no window): `before` and `after` `None`.
    pub const ALL: KeyWindow = KeyWindow {
        before: None,
        after: None,
    };

    /// Causal (decoder) attention: query `i` sees keys `j <= i` (`after` `Some(0)`).
    pub const CAUSAL: KeyWindow = KeyWindow {
        before: None,
        after: Some(0),
    };

    /// Local attention of `half` keys either side: query `i` sees key `j` iff
    /// `|i - j| <= half`. ModernBERT's local layers (window 128) are `around(64)`.
    pub const fn around(half: usize) -> KeyWindow {
        KeyWindow {
            before: Some(half),
            after: Some(half),
        }
    }

    /// The op's encoding (part of its plan key).
    fn encoded(self) -> (Option<u64>, Option<u64>) {
        (self.before.map(|x| x as u64), self.after.map(|x| x as u64))
    }
}

impl fmt::Display for KeyWindow {
    /// `all`, `causal`, `around(h)`, or `before b, after a` (`-` for `None`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.before, self.after) {
            (None, None) => write!(f, "all"),
            (None, Some(0)) => write!(f, "causal"),
            (Some(b), Some(a)) if a == b => write!(f, "around({b})"),
            (b, a) => {
                let side = |x: Option<usize>| x.map_or("-".to_string(), |x| x.to_string());
                write!(f, "before {}, after {}", side(b), side(a))
            }
        }
    }
}

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
        self.attention_with(k, v, bias, scale, KeyWindow::ALL)
    }

    /// [`Tensor::attention`] where each query sees only the keys of `window` (query
    /// `i` and key `j` are their indices in `lq` and `lk`, both from 0: causal with
    /// `lq != lk` aligns the first query with the first key), and `k` and `v` may have
    /// fewer heads than `q`.
    ///
    /// - `k` and `v` are `[batch, kv_heads, lk, head_dim]` with `heads` a multiple of
    ///   `kv_heads`; query head `h` reads kv head `h / (heads / kv_heads)` (grouped-
    ///   query attention, Hugging Face's `repeat_kv` grouping).
    /// - The result equals [`Tensor::attention`] with the kv heads repeated and a
    ///   `-1e9` bias on the keys the window hides (within 1e-6, `tests/attention.rs`),
    ///   but the kernel reads only the key tiles a block of queries sees, so causal
    ///   attention costs about half and a window of `w` keys about `w / lk`.
    /// - A query that sees no key at all (only possible when `lq > lk`) gives zeros.
    pub fn attention_with(
        &self,
        k: &Tensor,
        v: &Tensor,
        bias: Option<&Tensor>,
        scale: f32,
        window: KeyWindow,
    ) -> Result<Tensor> {
        let op = if window == KeyWindow::ALL {
            "attention"
        } else {
            "attention_with"
        };
        let bias_of = bias.map(operand);
        let [b, heads, lq, dh] =
            ops::attention::shape(op, [operand(self), operand(k), operand(v)], bias_of, scale)?;
        let (q, k, v) = (rows(self)?, rows(k)?, rows(v)?);
        let out = Layout::contiguous(&[b, lq, heads, dh]);
        ops::checked_numel(out.dims(), op)?;
        let (before, after) = window.encoded();
        let kind = OpKind::Attention {
            scale: f64::from(scale).to_bits(),
            ragged: false,
            before,
            after,
        };
        match bias {
            Some(bias) => Tensor::record(kind, &[&q, &k, &v, bias], DType::F32, out),
            None => Tensor::record(kind, &[&q, &k, &v], DType::F32, out),
        }
    }

    /// Attention over a packed (ragged) batch: several sequences of different lengths
    /// laid one after another along the token axis with no padding, each attending
    /// only to its own tokens (FlashAttention's "varlen" form), with `self` as `q`.
    ///
    /// - `self` (q), `k` and `v` are `[heads, total_tokens, head_dim]`, f32, read where
    ///   they lie when each row's `head_dim` elements are contiguous (a permuted view
    ///   of a fused QKV projection of `[total_tokens, 3 · hidden]` is).
    /// - `seq_offsets` is a 1-D u32 tensor of `n + 1` offsets (`cu_seqlens`): sequence
    ///   `s` is tokens `seq_offsets[s]..seq_offsets[s + 1]`. They must start at 0,
    ///   never decrease and end at `total_tokens`; that is checked when the op runs
    ///   (the offsets are data), and a violation is an error on the result.
    /// - Returns `[total_tokens, heads, head_dim]`: per sequence and head,
    ///   `softmax(q·kᵀ · scale) · v`, so `reshape(&[total_tokens, heads · head_dim])`
    ///   is free.
    ///
    /// The work is the sum of each sequence's squared length, never the square of the
    /// total; every row equals what [`Tensor::attention`] gives the sequence on its own
    /// (`tests/attention.rs`).
    pub fn attention_ragged(
        &self,
        k: &Tensor,
        v: &Tensor,
        seq_offsets: &Tensor,
        scale: f32,
    ) -> Result<Tensor> {
        self.attention_ragged_with(k, v, seq_offsets, None, scale, KeyWindow::ALL)
    }

    /// [`Tensor::attention_ragged`] with an additive bias that depends on positions
    /// within a sequence, the same for every sequence of the batch: MPNet's and T5's
    /// relative position bias, ALiBi. Query `i` and key `j` of a sequence (counted
    /// from its first token) get `bias[h, i, j]` added to their scaled score, for head
    /// `h`.
    ///
    /// - `bias` is f32 `[heads, len, len]`, or `[1, len, len]` for every head alike,
    ///   where `len` is at least the longest sequence's length (that is checked when
    ///   the op runs, as the offsets are data).
    /// - Every row equals what [`Tensor::attention`] gives the sequence on its own with
    ///   the bias's top-left `[heads, l, l]` corner as its bias (`tests/attention.rs`).
    pub fn attention_ragged_biased(
        &self,
        k: &Tensor,
        v: &Tensor,
        seq_offsets: &Tensor,
        bias: &Tensor,
        scale: f32,
    ) -> Result<Tensor> {
        self.attention_ragged_with(k, v, seq_offsets, Some(bias), scale, KeyWindow::ALL)
    }

    /// The ragged form with everything: [`Tensor::attention_ragged`], with the bias of
    /// [`Tensor::attention_ragged_biased`] when given, where each query sees only the
    /// keys of `window` by position within its sequence, and `k` and `v` may have
    /// fewer heads than `q`.
    ///
    /// - `k` and `v` are `[kv_heads, total_tokens, head_dim]` with `heads` a multiple
    ///   of `kv_heads`; query head `h` reads kv head `h / (heads / kv_heads)`.
    /// - Every row equals what [`Tensor::attention_with`] gives its sequence on its own
    ///   with the same window (`tests/attention.rs`); the work is each sequence's
    ///   visible pairs (about half of `Σ len²` for causal attention).
    pub fn attention_ragged_with(
        &self,
        k: &Tensor,
        v: &Tensor,
        seq_offsets: &Tensor,
        bias: Option<&Tensor>,
        scale: f32,
        window: KeyWindow,
    ) -> Result<Tensor> {
        let op = match (bias.is_some(), window == KeyWindow::ALL) {
            (_, false) => "attention_ragged_with",
            (true, true) => "attention_ragged_biased",
            (false, true) => "attention_ragged",
        };
        let [heads, total, dh] = ops::attention::shape_ragged(
            op,
            [operand(self), operand(k), operand(v)],
            operand(seq_offsets),
            bias.map(operand),
            scale,
        )?;
        let offsets = if seq_offsets.numel() > 1 && seq_offsets.layout().strides()[0] != 1 {
            seq_offsets.contiguous()?
        } else {
            seq_offsets.clone()
        };
        let (q, k, v) = (
            rows(&self.unsqueeze(0)?)?,
            rows(&k.unsqueeze(0)?)?,
            rows(&v.unsqueeze(0)?)?,
        );
        let out = Layout::contiguous(&[1, total, heads, dh]);
        ops::checked_numel(out.dims(), op)?;
        let (before, after) = window.encoded();
        let kind = OpKind::Attention {
            scale: f64::from(scale).to_bits(),
            ragged: true,
            before,
            after,
        };
        match bias {
            Some(bias) => {
                Tensor::record(kind, &[&q, &k, &v, &offsets, bias], DType::F32, out)?.squeeze(0)
            }
            None => Tensor::record(kind, &[&q, &k, &v, &offsets], DType::F32, out)?.squeeze(0),
        }
    }
}

/// `t` (rank 4) itself when each row's last dim is contiguous, else a contiguous copy.
fn rows(t: &Tensor) -> Result<Tensor> {
    let l = t.layout();
    if l.dims()[3] > 1 && l.strides()[3] != 1 {
        t.contiguous()
    } else {
        Ok(t.clone())
    }
}

/// An operand as the shape rules take it: its dims and dtype.
fn operand(t: &Tensor) -> (&[usize], DType) {
    (t.dims(), t.dtype())
}
