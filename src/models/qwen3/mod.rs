//! Qwen3 as an embedder (Qwen3-Embedding): a decoder whose last token's final state,
//! L2-normalised, is the sentence's embedding.
//!
//! Each of its `num_hidden_layers` pre-norm layers is RMS norm, then causal attention
//! with grouped-query heads (several query heads share one key/value head), each
//! query and key head RMS-normalised and turned by rotary positions; then RMS norm
//! and a SwiGLU feed-forward (`silu(x·gate) * (x·up)`, then `down`), each with a
//! residual; a last RMS norm ends it. No biases anywhere.
//!
//! This module owns the model's data ([`Qwen3Model`]); `config` reads `config.json`
//! ([`Qwen3Config`], refusing what it cannot run exactly), `weights` loads
//! `model.safetensors` into the layout the forward pass multiplies with (the query,
//! key and value projections joined into one weight, and the gate and up projections
//! into another, each one product; the attention scale folded into the query norm's
//! weight), and `forward` runs a ragged batch as engine ops
//! ([`Qwen3Model::embed_packed_head`]): sequences packed along the tokens with no
//! padding, each token's rotary angles by the position within its sequence.

mod config;
mod forward;
mod weights;

pub use config::Qwen3Config;

use super::Precision;
use crate::Tensor;

/// One decoder layer's weights, laid out for `x @ w`.
struct Layer {
    /// `[hidden]`: the RMS norm before attention.
    in_norm: Tensor,
    /// `[hidden, (heads + 2 · kv_heads) · head_dim]`: query, key and value.
    qkv_w: Tensor,
    /// `[head_dim]`: the query heads' RMS norm, times the attention scale.
    q_norm: Tensor,
    /// `[head_dim]`: the key heads' RMS norm.
    k_norm: Tensor,
    /// `[heads · head_dim, hidden]`.
    out_w: Tensor,
    /// `[hidden]`: the RMS norm before the feed-forward.
    post_norm: Tensor,
    /// `[hidden, 2 · intermediate]`: gate, then up.
    gate_up_w: Tensor,
    /// `[intermediate, hidden]`.
    down_w: Tensor,
}

/// A Qwen3 decoder run as an embedder: loaded once, then shared by any number of
/// threads (`Send + Sync`; its weights are read-only tensors every stream reads).
pub struct Qwen3Model {
    config: Qwen3Config,
    precision: Precision,
    /// `[vocab, hidden]`.
    embed: Tensor,
    layers: Vec<Layer>,
    /// `[hidden]`: the last RMS norm.
    final_norm: Tensor,
    /// `[max_position_embeddings, head_dim / 2]`: the rotary angles' cosines and
    /// sines by position, in f32 as Hugging Face computes them.
    cos: Tensor,
    sin: Tensor,
}

impl Qwen3Model {
    /// The model's config.
    pub fn config(&self) -> &Qwen3Config {
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
