//! The forward pass over a ragged batch ([`Qwen3Model::embed_packed_head`]): the
//! sequences' tokens packed one after another with no padding (as BERT's ragged pass
//! packs them, bucketed lengths included), every dense op on real tokens only,
//! attention causal within each sequence, then the [`Head`] (pooling, `Dense`
//! layers, normalisation) on the final states.

use super::Qwen3Model;
use crate::models::bert::bucket_tokens;
use crate::models::head::Head;
use crate::models::pooling::Span;
use crate::{Error, Result, Tensor};

/// A ragged batch laid out for one forward pass.
struct Packed {
    /// Token ids `[total]` (u32), filler included.
    ids: Tensor,
    /// Each token's position within its sequence `[total]` (u32): its row of the
    /// rotary tables.
    positions: Tensor,
    /// The sequences' offsets (u32, from 0 to `total`).
    offsets: Tensor,
    /// The row each real sequence starts at.
    starts: Vec<usize>,
    /// The longest sequence, filler included, rounded up to a multiple of 8.
    longest: usize,
}

impl Qwen3Model {
    /// Vectors of `seqs` from one ragged forward pass through the decoder and `head`
    /// (pooling, `Dense` layers), in input order: sequence `i`'s first `prompt[i]`
    /// tokens are its prompt (left out of pooling unless the head includes prompts),
    /// and it is L2-normalised where `normalize[i]`. Each sequence is 1 to
    /// `max_position_embeddings` ids below `vocab_size`.
    pub fn embed_packed_head(
        &self,
        seqs: &[&[u32]],
        head: &Head,
        prompt: &[usize],
        normalize: &[bool],
    ) -> Result<Vec<Vec<f32>>> {
        let op = "qwen3_embed_packed";
        if normalize.len() != seqs.len() || prompt.len() != seqs.len() {
            return Err(Error::Internal {
                msg: format!(
                    "{op}: {} normalize flags and {} prompt lengths for {} sequences",
                    normalize.len(),
                    prompt.len(),
                    seqs.len()
                ),
            });
        }
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let packed = self.pack(op, seqs)?;
        let spans: Vec<Span> = seqs
            .iter()
            .zip(&packed.starts)
            .zip(prompt)
            .map(|((s, &start), &skip)| Span {
                start,
                len: s.len(),
                skip: skip.min(s.len() - 1),
            })
            .collect();
        let states = self.decode_packed(&packed)?;
        let v = head.apply(&states, &spans, normalize)?.to_vec::<f32>()?;
        Ok(v.chunks_exact(head.dim()).map(<[f32]>::to_vec).collect())
    }

    /// `seqs` checked and packed, with one filler sequence up to the bucketed length.
    fn pack(&self, op: &'static str, seqs: &[&[u32]]) -> Result<Packed> {
        let c = &self.config;
        for (i, s) in seqs.iter().enumerate() {
            if s.is_empty() || s.len() > c.max_position_embeddings {
                return Err(Error::Arg {
                    op,
                    msg: format!(
                        "sequence {i} has {} tokens; the model takes 1 to {}",
                        s.len(),
                        c.max_position_embeddings
                    ),
                });
            }
            if let Some(bad) = s.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(Error::Arg {
                    op,
                    msg: format!(
                        "sequence {i} has token id {bad}; the vocabulary has {}",
                        c.vocab_size
                    ),
                });
            }
        }
        let real: usize = seqs.iter().map(|s| s.len()).sum();
        let total = bucket_tokens(real);
        if u32::try_from(total).is_err() {
            return Err(Error::Arg {
                op,
                msg: format!("a packed batch of {total} tokens is more than u32 offsets hold"),
            });
        }
        let n_offsets = (seqs.len() + 2).next_power_of_two().max(8);
        let mut ids = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut offsets = vec![0u32];
        for s in seqs {
            ids.extend_from_slice(s);
            positions.extend(0..s.len() as u32);
            offsets.push(ids.len() as u32);
        }
        let starts = offsets[..seqs.len()].iter().map(|&o| o as usize).collect();
        // Filler: token 0 counting up from position 0, one sequence of its own (at
        // most 1/16 of the batch, so within the positions).
        positions.extend(0..(total - ids.len()) as u32);
        ids.resize(total, 0);
        offsets.resize(n_offsets, total as u32);
        let longest = offsets.windows(2).map(|w| (w[1] - w[0]) as usize).max();
        Ok(Packed {
            ids: Tensor::from_vec(ids, &[total])?,
            positions: Tensor::from_vec(positions, &[total])?,
            offsets: Tensor::from_vec(offsets, &[n_offsets])?,
            starts,
            longest: longest.unwrap_or(0).next_multiple_of(8),
        })
    }

    /// The final states `[total, hidden]` of a packed batch.
    fn decode_packed(&self, packed: &Packed) -> Result<Tensor> {
        let c = &self.config;
        let (heads, kv, dh) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (eps, inter) = (c.rms_norm_eps, c.intermediate_size);
        let total = packed.ids.dims()[0];
        // The rotary angles of each token, `[total, 1, dh / 2]`: one row for its heads.
        let turn = |t: &Tensor| {
            t.index_select(&packed.positions, 0)?
                .reshape(&[total, 1, dh / 2])
        };
        let (cos, sin) = (turn(&self.cos)?, turn(&self.sin)?);
        let causal = causal_bias(packed.longest)?;
        // Query head h reads key/value head h / (heads / kv).
        let group: Vec<u32> = (0..heads).map(|h| (h / (heads / kv)) as u32).collect();
        let group = Tensor::from_vec(group, &[heads])?;
        let mut x = self.embed.index_select(&packed.ids, 0)?;
        for layer in &self.layers {
            let qkv = x.rms_norm(&layer.in_norm, eps)?.matmul(&layer.qkv_w)?;
            // [total, n, dh] heads of the projection, normalised, as [n, total, dh].
            let part = |from: usize, n: usize, norm: Option<&Tensor>| -> Result<Tensor> {
                let p = qkv.narrow(1, from * dh, n * dh)?.reshape(&[total, n, dh])?;
                let p = match norm {
                    Some(w) => p.rms_norm(w, eps)?.rotary(&cos, &sin)?,
                    None => p,
                };
                p.permute(&[1, 0, 2])
            };
            let q = part(0, heads, Some(&layer.q_norm))?;
            let k = part(heads, kv, Some(&layer.k_norm))?.index_select(&group, 0)?;
            let v = part(heads + kv, kv, None)?.index_select(&group, 0)?;
            let ctx = q
                .attention_ragged_biased(&k, &v, &packed.offsets, &causal, 1.0)?
                .reshape(&[total, heads * dh])?;
            x = ctx.matmul(&layer.out_w)?.add(&x)?;
            let gu = x
                .rms_norm(&layer.post_norm, eps)?
                .matmul(&layer.gate_up_w)?;
            let ff = gu
                .narrow(1, 0, inter)?
                .silu()?
                .mul(&gu.narrow(1, inter, inter)?)?;
            x = ff.matmul(&layer.down_w)?.add(&x)?;
        }
        x.rms_norm(&self.final_norm, eps)
    }
}

/// `[1, len, len]`: 0 where key `j` is at or before query `i`, -1e9 after it.
fn causal_bias(len: usize) -> Result<Tensor> {
    let v = (0..len)
        .flat_map(|i| (0..len).map(move |j| if j <= i { 0.0 } else { -1e9 }))
        .collect();
    Tensor::from_vec(v, &[1, len, len])
}
