//! Sentence pooling as engine operations: from the last hidden states of a ragged
//! batch (`[total, hidden]`, the sequences' rows one after another) to one vector per
//! sequence, in each mode sentence-transformers' `Pooling` module names, several at
//! once concatenated in its order.
//!
//! `cls`, `lasttoken` and `max` are lazy tensor ops that are planned like the rest of
//! the forward pass: row indices for the token `cls` and `lasttoken` take, and, for
//! `max`, the rows of each sequence gathered into `[sequences, longest, hidden]` with
//! a large negative bias on the slots past its end before a max reduction over the
//! tokens (a max is exact, so where a sequence sits does not change its bits). The
//! mean modes are summed on the host, each sequence on its own in f64, so that a
//! vector's bits never depend on the batch it ran in (the contract of the Embedder's
//! dynamic batching and of `encode`'s `batch_size`).
//!
//! A sequence's first `skip` tokens are its prompt when the pooling config says
//! `include_prompt: false`: sentence-transformers 6 masks them out, so they are left
//! out of the mean, weighted mean and max modes, and `cls` takes the first token
//! after them (the first unmasked one, as it does); `lasttoken` takes the last token
//! regardless.

use crate::{Error, Result, Tensor};

/// How a sentence embedding is pooled from the last hidden states of its tokens
/// (sentence-transformers' pooling config names these modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// The mean over the tokens (`pooling_mode_mean_tokens`; all-MiniLM-L6-v2's).
    #[default]
    Mean,
    /// The first token's state (`pooling_mode_cls_token`).
    Cls,
    /// The sum over the tokens divided by √length (`pooling_mode_mean_sqrt_len_tokens`).
    MeanSqrtLen,
    /// The largest value of each feature over the tokens (`pooling_mode_max_tokens`).
    Max,
    /// The mean weighted by position, the `i`-th token (from 1) weighing `i`
    /// (`pooling_mode_weightedmean_tokens`).
    WeightedMean,
    /// The last token's state (`pooling_mode_lasttoken`; decoder embedders').
    LastToken,
}

impl Pooling {
    /// Every mode, in the order sentence-transformers concatenates them when a config
    /// turns on several.
    pub const ALL: [Pooling; 6] = [
        Pooling::Cls,
        Pooling::Max,
        Pooling::Mean,
        Pooling::MeanSqrtLen,
        Pooling::WeightedMean,
        Pooling::LastToken,
    ];

    /// The key of the mode in a sentence-transformers pooling config.
    pub fn config_key(self) -> &'static str {
        match self {
            Pooling::Mean => "pooling_mode_mean_tokens",
            Pooling::Cls => "pooling_mode_cls_token",
            Pooling::MeanSqrtLen => "pooling_mode_mean_sqrt_len_tokens",
            Pooling::Max => "pooling_mode_max_tokens",
            Pooling::WeightedMean => "pooling_mode_weightedmean_tokens",
            Pooling::LastToken => "pooling_mode_lasttoken",
        }
    }

    /// The mode's short name (sentence-transformers' `pooling_mode` string, and Text
    /// Embeddings Inference's).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::MeanSqrtLen => "mean_sqrt_len_tokens",
            Pooling::Max => "max",
            Pooling::WeightedMean => "weightedmean",
            Pooling::LastToken => "lasttoken",
        }
    }
}

/// Where one sequence lies in a packed batch's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Its first row.
    pub start: usize,
    /// Its tokens (at least 1).
    pub len: usize,
    /// Its leading tokens left out of pooling (a prompt, with `include_prompt:
    /// false`; see the module's doc); fewer than `len`.
    pub skip: usize,
}

/// Row indices `[n]` (u32) of each span's token `pick` chooses.
fn rows(spans: &[Span], pick: impl Fn(&Span) -> usize) -> Result<Tensor> {
    let idx = spans.iter().map(|s| pick(s) as u32).collect();
    Tensor::from_vec(idx, &[spans.len()])
}

/// `[n, hidden]`: the (weighted) mean modes, each sequence's rows of `data` (the
/// states, `[total, hidden]`, read once) summed in f64 in token order and divided by
/// its denominator. Summed per sequence on its own, so a vector's bits never depend on
/// which other sequences share its batch or where its rows sit: a product by a
/// `[n, total]` weight matrix, tried first, gave other bits when a sequence moved
/// (the tile's accumulation order follows the position along `total`).
fn weighted(data: &[f32], h: usize, spans: &[Span], mode: Pooling) -> Result<Tensor> {
    let mut out = Vec::with_capacity(spans.len() * h);
    let mut acc = vec![0.0f64; h];
    for s in spans {
        acc.iter_mut().for_each(|a| *a = 0.0);
        let mut sum = 0.0f64;
        for p in s.skip..s.len {
            // Positions count from 1 in the weighted mean, the prompt included.
            let weight = if mode == Pooling::WeightedMean {
                (p + 1) as f64
            } else {
                1.0
            };
            let row = &data[(s.start + p) * h..(s.start + p + 1) * h];
            for (a, &x) in acc.iter_mut().zip(row) {
                *a += weight * f64::from(x);
            }
            sum += weight;
        }
        let den = match mode {
            Pooling::MeanSqrtLen => sum.sqrt(),
            _ => sum.max(1e-9),
        };
        out.extend(acc.iter().map(|&a| (a / den) as f32));
    }
    Tensor::from_vec(out, &[spans.len(), h])
}

/// `[n, hidden]`: each feature's largest value over each sequence's tokens (those
/// past `skip`), gathered into `[n, longest, hidden]` with slots past a sequence's end
/// reading its first row under a bias of -1e9 (sentence-transformers' fill value).
fn max(states: &Tensor, spans: &[Span]) -> Result<Tensor> {
    let h = states.dims()[1];
    let n = spans.len();
    let longest = spans.iter().map(|s| s.len - s.skip).max().unwrap_or(1);
    let mut idx = Vec::with_capacity(n * longest);
    let mut bias = Vec::with_capacity(n * longest);
    for s in spans {
        for j in 0..longest {
            let real = s.skip + j < s.len;
            idx.push((s.start + if real { s.skip + j } else { 0 }) as u32);
            bias.push(if real { 0.0f32 } else { -1e9 });
        }
    }
    states
        .index_select(&Tensor::from_vec(idx, &[n * longest])?, 0)?
        .reshape(&[n, longest, h])?
        .add(&Tensor::from_vec(bias, &[n, longest, 1])?)?
        .max(1)
}

/// The pooled vectors `[n, modes.len() * hidden]` of the sequences at `spans` of the
/// packed states `[total, hidden]`: each mode in turn, concatenated in the order of
/// `modes`. Errors name what was wrong (no mode, a span out of the states).
pub fn pool(states: &Tensor, spans: &[Span], modes: &[Pooling]) -> Result<Tensor> {
    let op = "pool";
    if states.rank() != 2 {
        return Err(Error::Shape {
            op,
            msg: format!("states must be [total, hidden], got {:?}", states.dims()),
        });
    }
    let total = states.dims()[0];
    if modes.is_empty() || spans.is_empty() {
        return Err(Error::Arg {
            op,
            msg: format!(
                "{} modes for {} sequences; need at least one of each",
                modes.len(),
                spans.len()
            ),
        });
    }
    if let Some((i, s)) = spans
        .iter()
        .enumerate()
        .find(|(_, s)| s.len == 0 || s.skip >= s.len || s.start + s.len > total)
    {
        return Err(Error::Arg {
            op,
            msg: format!("sequence {i} ({s:?}) is empty, all prompt, or past the {total} rows"),
        });
    }
    let h = states.dims()[1];
    let parts = modes
        .iter()
        .map(|&mode| match mode {
            Pooling::Cls => states.index_select(&rows(spans, |s| s.start + s.skip)?, 0),
            Pooling::LastToken => states.index_select(&rows(spans, |s| s.start + s.len - 1)?, 0),
            Pooling::Max => max(states, spans),
            Pooling::Mean | Pooling::MeanSqrtLen | Pooling::WeightedMean => states
                .read(|data| weighted(data, h, spans, mode))
                .and_then(|pooled| pooled),
        })
        .collect::<Result<Vec<Tensor>>>()?;
    match &parts[..] {
        [one] => Ok(one.clone()),
        _ => Tensor::cat(&parts.iter().collect::<Vec<_>>(), 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sequences of 2-wide states: rows 0..3 and 3..5.
    fn states() -> Tensor {
        let v = vec![1.0f32, -4.0, 3.0, 2.0, 5.0, 0.0, -1.0, 7.0, 2.0, -3.0];
        Tensor::from_vec(v, &[5, 2]).unwrap()
    }

    fn run(modes: &[Pooling], skip: usize) -> Vec<f32> {
        let spans = [
            Span {
                start: 0,
                len: 3,
                skip,
            },
            Span {
                start: 3,
                len: 2,
                skip: 0,
            },
        ];
        pool(&states(), &spans, modes)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    }

    #[test]
    fn each_mode_against_its_definition() {
        assert_eq!(run(&[Pooling::Cls], 0), [1.0, -4.0, -1.0, 7.0]);
        assert_eq!(run(&[Pooling::LastToken], 0), [5.0, 0.0, 2.0, -3.0]);
        assert_eq!(run(&[Pooling::Max], 0), [5.0, 2.0, 2.0, 7.0]);
        assert_eq!(run(&[Pooling::Mean], 0), [3.0, -2.0 / 3.0, 0.5, 2.0]);
        let s = run(&[Pooling::MeanSqrtLen], 0);
        let want = [
            9.0 / 3f32.sqrt(),
            -2.0 / 3f32.sqrt(),
            1.0 / 2f32.sqrt(),
            4.0 / 2f32.sqrt(),
        ];
        assert!(
            s.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{s:?}"
        );
        // Weights 1, 2, 3 and 1, 2.
        let w = run(&[Pooling::WeightedMean], 0);
        let want = [
            (1.0 + 6.0 + 15.0) / 6.0,
            (-4.0 + 4.0) / 6.0,
            3.0 / 3.0,
            1.0 / 3.0,
        ];
        assert!(
            w.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{w:?}"
        );
    }

    #[test]
    fn a_prompt_is_left_out_of_every_mode_but_the_last_token() {
        assert_eq!(run(&[Pooling::Mean], 1), [4.0, 1.0, 0.5, 2.0]);
        assert_eq!(run(&[Pooling::Max], 2), [5.0, 0.0, 2.0, 7.0]);
        let w = run(&[Pooling::WeightedMean], 1);
        let want = [(6.0 + 15.0) / 5.0, 4.0 / 5.0, 3.0 / 3.0, 1.0 / 3.0];
        assert!(
            w.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{w:?}"
        );
        assert_eq!(run(&[Pooling::Cls], 2), [5.0, 0.0, -1.0, 7.0]);
        assert_eq!(run(&[Pooling::LastToken], 2), run(&[Pooling::LastToken], 0));
    }

    #[test]
    fn several_modes_are_concatenated_in_order() {
        assert_eq!(
            run(&[Pooling::Cls, Pooling::Max], 0),
            [1.0, -4.0, 5.0, 2.0, -1.0, 7.0, 2.0, 7.0]
        );
    }

    #[test]
    fn bad_spans_and_no_modes_are_errors() {
        let bad = [Span {
            start: 4,
            len: 2,
            skip: 0,
        }];
        assert!(pool(&states(), &bad, &[Pooling::Mean]).is_err());
        let all_prompt = [Span {
            start: 0,
            len: 2,
            skip: 2,
        }];
        assert!(pool(&states(), &all_prompt, &[Pooling::Mean]).is_err());
        let ok = [Span {
            start: 0,
            len: 2,
            skip: 0,
        }];
        assert!(pool(&states(), &ok, &[]).is_err());
    }
}
