//! The BERT encoder as sentence-transformers runs it for all-MiniLM-L6-v2: token,
//! position and type embeddings, `num_hidden_layers` post-norm transformer layers,
//! then mean pooling over the real (unmasked) tokens and L2 normalisation. The same
//! encoder runs RoBERTa's families (other position ids) and MPNet (no token types,
//! plus a relative position bias on the attention scores, `relative`); `names` says
//! where each family keeps a layer's weights in its file.
//!
//! This module owns the model's data ([`BertModel`] and its layers) and splits its
//! work by job: `config` reads `config.json` into a [`BertConfig`], `weights` loads
//! `model.safetensors` ([`BertModel::load`]), `encoder` runs the forward pass
//! ([`BertModel::forward`]), and `embed` is the API over token ids
//! ([`BertModel::embed`]): sequences sorted by length and batched with their
//! neighbours, so a batch pays only for the padding up to its own longest sequence,
//! on one stream or split over several threads that share one copy of the weights.
//! `packed` runs a ragged batch with no padding at all ([`BertModel::embed_packed`]:
//! sequences packed along the tokens, attention per sequence), what a server batching
//! unrelated requests needs. `classify` puts a sequence-classification head on the
//! encoder ([`BertClassifier`]: `BertForSequenceClassification`, a cross-encoder
//! reranker), over ragged batches of sequences with token types.
//!
//! Weights are converted once, at load, into the layout the forward pass multiplies
//! with: linear weights transposed to `[in, out]`, the query, key and value
//! projections joined into one `[hidden, 3 * hidden]` matrix (with the attention
//! scale `1/sqrt(head_dim)` folded into the query part), and the position and token
//! type embeddings added into one table (a row per position and token type). Each weight is one contiguous `Vec<f32>`
//! made straight from the file's bytes; the file's bytes are dropped after loading.

mod classify;
mod config;
mod embed;
mod encoder;
mod names;
mod packed;
mod relative;
#[cfg(test)]
pub(crate) mod testing;
mod weights;

pub use super::pooling::Pooling;
pub use classify::BertClassifier;
pub use config::BertConfig;
pub use embed::{length_sorted_batches, EmbedOptions};
pub(in crate::models) use packed::bucket_tokens;
pub use packed::Packing;

use super::Precision;
use crate::Tensor;
use config::Activation;

/// The weights of one transformer layer, laid out for `x @ w + b`.
struct Layer {
    /// `[hidden, 3 * hidden]`: query (pre-scaled), key and value projections.
    qkv_w: Tensor,
    qkv_b: Tensor,
    /// `[hidden, hidden]`.
    out_w: Tensor,
    out_b: Tensor,
    ln1_w: Tensor,
    ln1_b: Tensor,
    /// `[hidden, intermediate]`.
    ff_in_w: Tensor,
    ff_in_b: Tensor,
    /// `[intermediate, hidden]`.
    ff_out_w: Tensor,
    ff_out_b: Tensor,
    ln2_w: Tensor,
    ln2_b: Tensor,
}

/// A BERT encoder with sentence-transformers pooling: loaded once, then shared by any
/// number of threads (`BertModel` is `Send + Sync`; its weights are read-only tensors
/// that every stream reads without copying).
pub struct BertModel {
    config: BertConfig,
    /// What the matrix weights are kept in.
    precision: Precision,
    act: Activation,
    /// `[vocab, hidden]`.
    word_emb: Tensor,
    /// `[type_vocab_size * max_positions, hidden]`: row `t * max_positions + p` is
    /// position `p`'s embedding plus token type `t`'s (the first `max_positions` rows,
    /// type 0, are what a sequence without token types reads).
    pos_type_emb: Tensor,
    emb_ln_w: Tensor,
    emb_ln_b: Tensor,
    layers: Vec<Layer>,
    /// MPNet's relative position bias, shared by every layer's attention; `None` for
    /// BERT and RoBERTa's families.
    rel_bias: Option<relative::RelativeBias>,
}

impl BertModel {
    /// The model's config.
    pub fn config(&self) -> &BertConfig {
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
