//! The forward pass over a ragged batch ([`ModernBertModel::embed_packed_head`]): the
//! sequences' tokens packed one after another with no padding (transformers'
//! unpadded form, bucketed lengths as BERT's ragged pass has them), every dense op on
//! real tokens only, attention within each sequence (and within the local window in
//! the local layers), then the [`Head`] (pooling, `Dense` layers, normalisation) on
//! the final states.

use super::{ModernBertModel, Rotary};
use crate::models::head::Head;
use crate::models::ragged::{self, Limits, Packed};
use crate::{KeyWindow, Result, Tensor};

impl ModernBertModel {
    /// Vectors of `seqs` from one ragged forward pass through the encoder and `head`
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
            op: "modernbert_embed_packed",
            vocab_size: self.config.vocab_size,
            max_positions: self.config.max_position_embeddings,
        };
        ragged::embed(limits, seqs, head, prompt, normalize, |p| {
            self.encode_packed(p)
        })
    }

    /// The final states `[total, hidden]` of a packed batch.
    fn encode_packed(&self, packed: &Packed) -> Result<Tensor> {
        let c = &self.config;
        let (h, heads, dh) = (c.hidden_size, c.num_attention_heads, c.head_dim());
        let (eps, inter, total) = (c.norm_eps, c.intermediate_size, packed.total());
        let scale = 1.0 / (dh as f32).sqrt();
        // Each token's rotary angles, `[total, 1, dh / 2]`: one row for its heads.
        let turn = |r: &Rotary| -> Result<(Tensor, Tensor)> {
            let pick = |t: &Tensor| {
                t.index_select(&packed.positions, 0)?
                    .reshape(&[total, 1, dh / 2])
            };
            Ok((pick(&r.cos)?, pick(&r.sin)?))
        };
        let global = turn(&self.global)?;
        let local = turn(&self.local)?;
        // The local layers' window: keys at most local_attention / 2 positions away.
        let local_window = KeyWindow::around(c.local_attention / 2);
        let (w, b) = &self.embed_norm;
        let mut x = self
            .embed
            .index_select(&packed.ids, 0)?
            .layer_norm(w, b, eps)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let normed = match &layer.attn_norm {
                Some((w, b)) => x.layer_norm(w, b, eps)?,
                None => x.clone(),
            };
            let qkv = normed.matmul(&layer.qkv_w)?;
            let (cos, sin) = if c.is_local(l) { &local } else { &global };
            // [total, heads, dh] heads of the projection, as [heads, total, dh].
            let part = |i: usize, turned: bool| -> Result<Tensor> {
                let p = qkv.narrow(1, i * h, h)?.reshape(&[total, heads, dh])?;
                let p = if turned { p.rotary(cos, sin)? } else { p };
                p.permute(&[1, 0, 2])
            };
            let (q, k, v) = (part(0, true)?, part(1, true)?, part(2, false)?);
            let window = match c.is_local(l) {
                true => local_window,
                false => KeyWindow::ALL,
            };
            let ctx = q.attention_ragged_with(&k, &v, &packed.offsets, None, scale, window)?;
            let ctx = ctx.reshape(&[total, h])?;
            x = ctx.matmul(&layer.out_w)?.add(&x)?;
            let (w, b) = &layer.mlp_norm;
            let gi = x.layer_norm(w, b, eps)?.matmul(&layer.wi)?;
            let ff = gi
                .narrow(1, 0, inter)?
                .gelu()?
                .mul(&gi.narrow(1, inter, inter)?)?;
            x = ff.matmul(&layer.wo)?.add(&x)?;
        }
        let (w, b) = &self.final_norm;
        x.layer_norm(w, b, eps)
    }
}
