//! The forward pass over a ragged batch ([`Qwen3Model::embed_packed_head`]): the
//! sequences' tokens packed one after another with no padding (as BERT's ragged pass
//! packs them, bucketed lengths included), every dense op on real tokens only,
//! attention causal within each sequence, then the [`Head`] (pooling, `Dense`
//! layers, normalisation) on the final states.

use super::Qwen3Model;
use crate::models::head::Head;
use crate::models::ragged::{self, Limits, Packed};
use crate::Result;
use crate::{KeyWindow, Tensor};

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
        let limits = Limits {
            op: "qwen3_embed_packed",
            vocab_size: self.config.vocab_size,
            max_positions: self.config.max_position_embeddings,
        };
        ragged::embed(limits, seqs, head, prompt, normalize, |p| {
            self.decode_packed(p)
        })
    }

    /// The final states `[total, hidden]` of a packed batch.
    fn decode_packed(&self, packed: &Packed) -> Result<Tensor> {
        let c = &self.config;
        let (heads, kv, dh) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (eps, inter) = (c.rms_norm_eps, c.intermediate_size);
        let total = packed.total();
        // The rotary angles of each token, `[total, 1, dh / 2]`: one row for its heads.
        let turn = |t: &Tensor| {
            t.index_select(&packed.positions, 0)?
                .reshape(&[total, 1, dh / 2])
        };
        let (cos, sin) = (turn(&self.cos)?, turn(&self.sin)?);
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
            let k = part(heads, kv, Some(&layer.k_norm))?;
            let v = part(heads + kv, kv, None)?;
            // Causal within each sequence; query head h reads key/value head
            // h / (heads / kv) (the kernel's grouped heads).
            let ctx = q
                .attention_ragged_with(&k, &v, &packed.offsets, None, 1.0, KeyWindow::CAUSAL)?
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
