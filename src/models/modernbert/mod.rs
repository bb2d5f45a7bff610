//! ModernBERT as an embedder (ModernBERT-base and the sentence-embedding models
//! built on it, such as modernbert-embed and gte-modernbert): an encoder whose
//! pooled final states are the sentence's embedding.
//!
//! The token embeddings are layer-normed (there are no position embeddings). Each of
//! its pre-norm layers is layer norm (none before the first layer's attention), then
//! attention with rotary positions, global in every `global_attn_every_n_layers`-th
//! layer and within a local window of ±`local_attention / 2` tokens in the others,
//! each kind with its own rotary base; then layer norm and a GeGLU feed-forward
//! (`gelu(x·Wi_in) * (x·Wi_gate)`, then `Wo`), each with a residual; a final layer
//! norm ends it. No biases in the linear layers, and by default none in the norms.
//!
//! This module owns the model's data ([`ModernBertModel`]); `config` reads
//! `config.json` ([`ModernBertConfig`], refusing what it cannot run exactly),
//! `weights` loads `model.safetensors` into the layout the forward pass multiplies
//! with, and `forward` runs a ragged batch as engine ops
//! ([`ModernBertModel::embed_packed_head`]): sequences packed along the tokens with no
//! padding (what transformers calls unpadding), each token's rotary angles and
//! window by its position within its sequence.

mod config;
mod forward;
mod weights;

pub use config::ModernBertConfig;

use super::Precision;
use crate::Tensor;

/// One encoder layer's weights, laid out for `x @ w`.
struct Layer {
    /// `[hidden]` each: the layer norm before attention (`None` in the first layer,
    /// whose input is the normed embeddings).
    attn_norm: Option<(Tensor, Tensor)>,
    /// `[hidden, 3 · hidden]`: query, key and value.
    qkv_w: Tensor,
    /// `[hidden, hidden]`.
    out_w: Tensor,
    /// `[hidden]` each: the layer norm before the feed-forward (weight, bias).
    mlp_norm: (Tensor, Tensor),
    /// `[hidden, 2 · intermediate]`: the GELU input, then the gate.
    wi: Tensor,
    /// `[intermediate, hidden]`.
    wo: Tensor,
}

/// The rotary tables of one kind of layer: `[max_position_embeddings, head_dim / 2]`
/// cosines and sines, in f32 as transformers computes them.
struct Rotary {
    cos: Tensor,
    sin: Tensor,
}

/// A ModernBERT encoder run as an embedder: loaded once, then shared by any number of
/// threads (`Send + Sync`; its weights are read-only tensors every stream reads).
pub struct ModernBertModel {
    config: ModernBertConfig,
    precision: Precision,
    /// `[vocab, hidden]`.
    embed: Tensor,
    /// `[hidden]` each: the embeddings' layer norm (weight, bias).
    embed_norm: (Tensor, Tensor),
    layers: Vec<Layer>,
    /// `[hidden]` each: the final layer norm (weight, bias).
    final_norm: (Tensor, Tensor),
    /// The global layers' rotary tables.
    global: Rotary,
    /// The local layers' rotary tables.
    local: Rotary,
}

impl ModernBertModel {
    /// The model's config.
    pub fn config(&self) -> &ModernBertConfig {
        &self.config
    }

    /// The precision of the matrix weights.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Width of the embeddings (`hidden_size`).
    pub fn dim(&self) -> usize {
        self.config.hidden_size
    }
}
