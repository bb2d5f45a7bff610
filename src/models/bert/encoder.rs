//! The forward pass: embeddings, the transformer layers, mean pooling over the real
//! tokens and L2 normalisation ([`BertModel::forward`]).

use super::{BertModel, Layer};
use crate::{DType, Error, Result, Tensor};

impl BertModel {
    /// Sentence embeddings of a batch: `input_ids` `[batch, len]` (u32 or i64 token
    /// ids, padded on the right) and `attention_mask` `[batch, len]` (1 for a real
    /// token, 0 for padding; f32, u32 or i64). Returns `[batch, hidden]`: the mean of
    /// the last hidden states over the real tokens, L2-normalised. Padding changes
    /// nothing: padded positions are masked out of attention and pooling.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        let op = "bert_forward";
        if input_ids.rank() != 2 || attention_mask.dims() != input_ids.dims() {
            return Err(Error::Shape {
                op,
                msg: format!(
                    "input_ids and attention_mask must both be [batch, len], got {:?} and {:?}",
                    input_ids.dims(),
                    attention_mask.dims()
                ),
            });
        }
        let (b, l) = (input_ids.dims()[0], input_ids.dims()[1]);
        let cfg = &self.config;
        if b == 0 || l == 0 {
            return Err(Error::Shape {
                op,
                msg: format!("empty batch {:?}", input_ids.dims()),
            });
        }
        if l > cfg.positions() {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "sequences of {l} tokens are longer than the model's {} positions",
                    cfg.positions()
                ),
            });
        }
        let (h, heads, dh) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim());
        let mask = match attention_mask.dtype() {
            DType::F32 => attention_mask.clone(),
            _ => attention_mask.to_dtype(DType::F32)?,
        };

        let ids = input_ids.reshape(&[b * l])?;
        let x = self
            .word_emb
            .index_select(&ids, 0)?
            .reshape(&[b, l, h])?
            .add(&self.pos_type_emb.narrow(0, 0, l)?)?
            .layer_norm(&self.emb_ln_w, &self.emb_ln_b, cfg.layer_norm_eps)?;
        let mut x = x.reshape(&[b * l, h])?;

        // 0 where a key is a real token, -1e9 where it is padding; plus MPNet's
        // relative position bias, the same for every layer.
        let mut key_bias = mask.affine(1e9, -1e9)?.reshape(&[b, 1, 1, l])?;
        if let Some(rel) = &self.rel_bias {
            key_bias = key_bias.add(&rel.scores(l)?)?;
        }
        for layer in &self.layers {
            x = self.layer(layer, &x, |qkv| {
                // q, k and v viewed as [3, b, heads, l, dh]: one kernel for scores,
                // mask, softmax and the product with v, per head, read from the
                // projection's layout and written as [b, l, heads, dh] rows.
                let qkv = qkv
                    .reshape(&[b, l, 3, heads, dh])?
                    .permute(&[2, 0, 3, 1, 4])?;
                let part = |i| qkv.narrow(0, i, 1)?.squeeze(0);
                part(0)?
                    .attention(&part(1)?, &part(2)?, Some(&key_bias), 1.0)?
                    .reshape(&[b * l, h])
            })?;
        }

        // Mean pooling over real tokens: mask [b, 1, l] x hidden [b, l, h].
        let summed = mask
            .reshape(&[b, 1, l])?
            .matmul(&x.reshape(&[b, l, h])?)?
            .reshape(&[b, h])?;
        let count = mask.sum_keepdim(-1)?.maximum(&Tensor::full(1e-9, &[1])?)?;
        let mean = summed.div(&count)?;
        let norm = mean
            .mul(&mean)?
            .sum_keepdim(-1)?
            .sqrt()?
            .maximum(&Tensor::full(1e-12, &[1])?)?;
        mean.div(&norm)
    }

    /// One post-norm transformer layer over hidden states `x` `[rows, hidden]`:
    /// `attend` turns the fused QKV projection `[rows, 3 · hidden]` (query part
    /// pre-scaled by 1/√dh at load) into the attention context `[rows, hidden]`, so
    /// the padded and the packed forward passes share everything else.
    pub(super) fn layer(
        &self,
        layer: &Layer,
        x: &Tensor,
        attend: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let eps = self.config.layer_norm_eps;
        let ctx = attend(&x.matmul(&layer.qkv_w)?.add(&layer.qkv_b)?)?;
        let a = ctx
            .matmul(&layer.out_w)?
            .add(&layer.out_b)?
            .add(x)?
            .layer_norm(&layer.ln1_w, &layer.ln1_b, eps)?;
        // Feed-forward.
        self.act
            .apply(&a.matmul(&layer.ff_in_w)?.add(&layer.ff_in_b)?)?
            .matmul(&layer.ff_out_w)?
            .add(&layer.ff_out_b)?
            .add(&a)?
            .layer_norm(&layer.ln2_w, &layer.ln2_b, eps)
    }
}
