//! Ragged batches: [`BertModel::embed_packed`] runs several sequences of different
//! lengths as one forward pass with no padding. Their tokens are packed one after
//! another into `[total_tokens, hidden]`, so every dense op (the projections, the
//! feed-forward, the norms) works on real tokens only; each sequence's positions come
//! from the position table by index; attention runs per sequence over the packed rows
//! ([`Tensor::attention_ragged`], given the sequences' offsets); then the
//! [`Head`] (pooling, `Dense` layers, L2 normalisation) runs on the last hidden
//! states as engine ops too.
//!
//! [`Packing::Bucketed`] rounds the packed length up (by at most 1/16, as one filler
//! sequence that is computed and thrown away) so that a server seeing every possible
//! total length meets a few dozen shapes instead of one per length. Since plans are
//! keyed by structure, a new total is an instantiation of the stored plan rather than
//! a build (about 0.2 ms for all-MiniLM-L6-v2's 33 kernels), so [`Packing::Exact`]
//! costs no builds either, and the `Embedder` and the `Reranker` run `Exact`: the
//! filler cost more than the instantiations it saved. Zen 5, binaries alternated:
//! `embed --batch 32 --workers 2` medians of 8 640.4 -> 647.7 sentences/s (6 of 8
//! won); one text a call p50 2.21 -> 2.12 ms (medians of 4, 4 of 4 won); `loadgen
//! --in-process`, 16 clients of 1-8 texts, 621/608/582 -> 640/638/648 texts/s. A
//! MiniLM-sized cross-encoder (all-MiniLM-L6-v2's encoder with a random classifier),
//! requests of a query and 32 documents one at a time from Python, alternated 5
//! times: medians 219.3 -> 223.1 pairs/s, p50 148.3 -> 144.5 ms (5 of 5 won), the
//! logits' bits unchanged.

use super::BertModel;
use crate::models::head::Head;
use crate::models::pooling::{Pooling, Span};
use crate::{Error, Result, Tensor};

/// Whether a packed batch is run at its exact length or rounded up to a bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Packing {
    /// Exactly the sequences' tokens.
    #[default]
    Exact,
    /// The total rounded up to a multiple of `max(8, 2^⌊log2 total⌋ / 16)` tokens and
    /// the number of sequences to a power of two, both with filler that is thrown
    /// away: at most 1/16 (or 7 tokens) more work, and few distinct shapes for the plan
    /// cache.
    Bucketed,
}

/// `total` rounded up as [`Packing::Bucketed`] does.
pub(crate) fn bucket_tokens(total: usize) -> usize {
    if total == 0 {
        return 0;
    }
    let pow = 1usize << (usize::BITS - 1 - total.leading_zeros());
    let step = (pow / 16).max(8);
    total.div_ceil(step) * step
}

/// A ragged batch laid out for one forward pass ([`BertModel::pack`]).
pub(super) struct Packed {
    /// Token ids `[total]` (u32), filler included.
    ids: Tensor,
    /// Each token's row of the position-type table `[total]` (u32):
    /// `type * positions + position` ([`BertConfig::positions`](super::BertConfig::positions)).
    rows: Tensor,
    /// The sequences' offsets `[n_offsets]` (u32, from 0 to `total`; the filler and
    /// empty sequences pad it to a bucket).
    offsets: Tensor,
    /// The row each real sequence starts at.
    pub(super) starts: Vec<u32>,
    /// Sequences the batch is shaped for (`offsets` has one more entry): the real
    /// ones, then filler.
    pub(super) slots: usize,
    /// The longest sequence, filler included, rounded up to a multiple of 8: the side
    /// of a bias by position within a sequence (MPNet's), so that few sizes occur.
    longest: usize,
}

impl BertModel {
    /// Embeddings of `seqs` (token ids, each 1 to `BertConfig::positions` long and
    /// below `vocab_size`) from one ragged forward pass: no padding, attention per
    /// sequence, then `pooling` and L2 normalisation per sequence. Results are in
    /// input order and equal [`BertModel::embed_batch`]'s (mean pooling) to float
    /// rounding, whatever the mix of lengths.
    pub fn embed_packed(
        &self,
        seqs: &[&[u32]],
        pooling: Pooling,
        packing: Packing,
    ) -> Result<Vec<Vec<f32>>> {
        self.embed_packed_normalizing(seqs, pooling, packing, &vec![true; seqs.len()])
    }

    /// [`BertModel::embed_packed`], L2-normalising sequence `i` only where
    /// `normalize[i]` (one flag per sequence); the others are the pooled states as
    /// they are (Text Embeddings Inference's `normalize: false`). A normalised
    /// sequence has [`BertModel::embed_packed`]'s bits.
    pub fn embed_packed_normalizing(
        &self,
        seqs: &[&[u32]],
        pooling: Pooling,
        packing: Packing,
        normalize: &[bool],
    ) -> Result<Vec<Vec<f32>>> {
        if normalize.len() != seqs.len() {
            return Err(crate::Error::Internal {
                msg: format!(
                    "bert_embed_packed: {} normalize flags for {} sequences",
                    normalize.len(),
                    seqs.len()
                ),
            });
        }
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let head = Head::pooling_only(self.dim(), pooling);
        self.embed_packed_head(seqs, &head, packing, &vec![0; seqs.len()], normalize)
    }

    /// Vectors of `seqs` from one ragged forward pass through the encoder and `head`
    /// (pooling, `Dense` layers), in input order: sequence `i`'s first `prompt[i]`
    /// tokens are its prompt (left out of pooling unless the head includes prompts),
    /// and it is L2-normalised where `normalize[i]`. All of it is engine ops, the
    /// pooling included.
    pub fn embed_packed_head(
        &self,
        seqs: &[&[u32]],
        head: &Head,
        packing: Packing,
        prompt: &[usize],
        normalize: &[bool],
    ) -> Result<Vec<Vec<f32>>> {
        if normalize.len() != seqs.len() || prompt.len() != seqs.len() {
            return Err(crate::Error::Internal {
                msg: format!(
                    "bert_embed_packed: {} normalize flags and {} prompt lengths for {} sequences",
                    normalize.len(),
                    prompt.len(),
                    seqs.len()
                ),
            });
        }
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let packed = self.pack("bert_embed_packed", seqs, &[], packing)?;
        let spans: Vec<Span> = seqs
            .iter()
            .zip(&packed.starts)
            .zip(prompt)
            .map(|((s, &start), &skip)| Span {
                start: start as usize,
                len: s.len(),
                // The last token always stays in.
                skip: skip.min(s.len() - 1),
            })
            .collect();
        let states = self.encode_packed(&packed)?;
        let v = head.apply(&states, &spans, normalize)?.to_vec::<f32>()?;
        Ok(v.chunks_exact(head.dim()).map(<[f32]>::to_vec).collect())
    }

    /// `seqs` packed one after another for [`BertModel::encode_packed`], after checking
    /// them (errors name `op`). `types` is empty (every token of type 0) or holds each
    /// sequence's token types: an empty list (all 0) or one type below
    /// `type_vocab_size` per token.
    pub(super) fn pack(
        &self,
        op: &'static str,
        seqs: &[&[u32]],
        types: &[&[u32]],
        packing: Packing,
    ) -> Result<Packed> {
        for (i, s) in seqs.iter().enumerate() {
            self.check_sequence(op, i, s)?;
        }
        if !types.is_empty() {
            self.check_types(op, seqs, types)?;
        }
        let real: usize = seqs.iter().map(|s| s.len()).sum();
        let (total, n_offsets) = match packing {
            Packing::Exact => (real, seqs.len() + 1),
            // The filler is one more sequence; empty ones pad the offsets.
            Packing::Bucketed => (
                bucket_tokens(real),
                (seqs.len() + 2).next_power_of_two().max(8),
            ),
        };
        if u32::try_from(total).is_err() {
            return Err(Error::Arg {
                op,
                msg: format!("a packed batch of {total} tokens is more than u32 offsets hold"),
            });
        }
        let positions = self.config.positions() as u32;
        let mut ids = Vec::with_capacity(total);
        let mut rows = Vec::with_capacity(total);
        let mut offsets = Vec::with_capacity(n_offsets);
        offsets.push(0u32);
        for (i, s) in seqs.iter().enumerate() {
            ids.extend_from_slice(s);
            match types.get(i).filter(|t| !t.is_empty()) {
                Some(t) => rows.extend(t.iter().zip(0..).map(|(&t, p)| t * positions + p)),
                None => rows.extend(0..s.len() as u32),
            }
            offsets.push(ids.len() as u32);
        }
        let starts = offsets[..seqs.len()].to_vec();
        // Filler: pad tokens at position 0, one sequence of their own.
        ids.resize(total, self.config.pad_token_id);
        rows.resize(total, 0);
        offsets.resize(n_offsets, total as u32);
        let longest = offsets.windows(2).map(|w| (w[1] - w[0]) as usize).max();
        Ok(Packed {
            longest: longest.unwrap_or(0).next_multiple_of(8),
            ids: Tensor::from_vec(ids, &[total])?,
            rows: Tensor::from_vec(rows, &[total])?,
            offsets: Tensor::from_vec(offsets, &[n_offsets])?,
            starts,
            slots: n_offsets - 1,
        })
    }

    /// Checks that `types` has an entry per sequence, each empty or as long as its
    /// sequence, with every type below `type_vocab_size`.
    fn check_types(&self, op: &'static str, seqs: &[&[u32]], types: &[&[u32]]) -> Result<()> {
        if types.len() != seqs.len() {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "{} lists of token types for {} sequences",
                    types.len(),
                    seqs.len()
                ),
            });
        }
        let kinds = self.config.type_vocab_size;
        for (i, (s, t)) in seqs.iter().zip(types).enumerate() {
            if !t.is_empty() && t.len() != s.len() {
                return Err(Error::Arg {
                    op,
                    msg: format!(
                        "sequence {i} has {} tokens but {} token types",
                        s.len(),
                        t.len()
                    ),
                });
            }
            if let Some(bad) = t.iter().find(|&&t| t as usize >= kinds) {
                return Err(Error::Arg {
                    op,
                    msg: format!(
                        "sequence {i} has token type {bad}; the model has {kinds} (0 to {})",
                        kinds - 1
                    ),
                });
            }
        }
        Ok(())
    }

    /// The last hidden states `[total, hidden]` of a packed batch.
    pub(super) fn encode_packed(&self, packed: &Packed) -> Result<Tensor> {
        let cfg = &self.config;
        let (h, heads, dh) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim());
        let total = packed.ids.dims()[0];
        let mut x = self
            .word_emb
            .index_select(&packed.ids, 0)?
            .add(&self.pos_type_emb.index_select(&packed.rows, 0)?)?
            .layer_norm(&self.emb_ln_w, &self.emb_ln_b, cfg.layer_norm_eps)?;
        // MPNet's relative position bias, computed once for every layer.
        let pos_bias = match &self.rel_bias {
            Some(rel) => Some(rel.scores(packed.longest)?.squeeze(0)?),
            None => None,
        };
        for layer in &self.layers {
            x = self.layer(layer, &x, |qkv| {
                // q, k and v viewed as [3, heads, total, dh]; attention within each
                // sequence, written as [total, heads, dh] rows.
                let qkv = qkv
                    .reshape(&[total, 3, heads, dh])?
                    .permute(&[1, 2, 0, 3])?;
                let part = |i| qkv.narrow(0, i, 1)?.squeeze(0);
                let (q, k, v) = (part(0)?, part(1)?, part(2)?);
                match &pos_bias {
                    None => q.attention_ragged(&k, &v, &packed.offsets, 1.0),
                    Some(bias) => q.attention_ragged_biased(&k, &v, &packed.offsets, bias, 1.0),
                }?
                .reshape(&[total, h])
            })?;
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up_by_at_most_a_sixteenth_or_seven_tokens() {
        assert_eq!(bucket_tokens(0), 0);
        assert_eq!(bucket_tokens(1), 8);
        assert_eq!(bucket_tokens(8), 8);
        assert_eq!(bucket_tokens(9), 16);
        assert_eq!(bucket_tokens(130), 136);
        assert_eq!(bucket_tokens(1000), 1024);
        assert_eq!(bucket_tokens(1025), 1088);
        for t in 1..5000 {
            let b = bucket_tokens(t);
            assert!(b >= t && (b - t <= 7 || (b - t) * 16 <= t), "{t} -> {b}");
        }
        let distinct: std::collections::BTreeSet<usize> = (1..=2048).map(bucket_tokens).collect();
        assert!(distinct.len() <= 100, "{} buckets", distinct.len());
    }
}
