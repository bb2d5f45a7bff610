//! [`TextModel`]: the encoder of a sentence-embedding folder, whichever family its
//! `config.json` names (`model_type`), behind one interface the
//! [`Embedder`](crate::embedder::Embedder) runs: BERT's encoder (with RoBERTa's
//! families and MPNet), ModernBERT's encoder or a Qwen3 decoder.

use std::path::Path;

use super::bert::Packing;
use super::head::Head;
use super::modernbert::ModernBertModel;
use super::qwen3::Qwen3Model;
use super::{BertModel, ModelError, Precision};
use crate::Result;

/// A text model of one of the supported families.
pub enum TextModel {
    /// BERT, RoBERTa's families (`roberta`, `xlm-roberta`, `camembert`) and MPNet.
    Bert(BertModel),
    /// ModernBERT (`modernbert`).
    ModernBert(ModernBertModel),
    /// Qwen3 (`qwen3`), a decoder run as an embedder.
    Qwen3(Qwen3Model),
}

impl TextModel {
    /// Loads the model folder `dir` (`config.json`, `model.safetensors`) as the family
    /// its `model_type` names, with the matrix weights in `precision`. An unknown
    /// `model_type` is refused by name.
    pub fn load_as(dir: &Path, precision: Precision) -> std::result::Result<TextModel, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|error| ModelError::Io {
            path: path.clone(),
            error,
        })?;
        let kind = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("model_type")?.as_str().map(str::to_string));
        match kind.as_deref() {
            Some("modernbert") => Ok(TextModel::ModernBert(ModernBertModel::load_as(
                dir, precision,
            )?)),
            Some("qwen3") => Ok(TextModel::Qwen3(Qwen3Model::load_as(dir, precision)?)),
            _ => Ok(TextModel::Bert(BertModel::load_as(dir, precision)?)),
        }
    }

    /// The architecture, as `config.json`'s `model_type` names it.
    pub fn model_type(&self) -> &str {
        match self {
            TextModel::Bert(m) => &m.config().model_type,
            TextModel::ModernBert(_) => "modernbert",
            TextModel::Qwen3(_) => "qwen3",
        }
    }

    /// The BERT-family model, if it is one.
    pub fn bert(&self) -> Option<&BertModel> {
        match self {
            TextModel::Bert(m) => Some(m),
            TextModel::ModernBert(_) | TextModel::Qwen3(_) => None,
        }
    }

    /// Width of the hidden states.
    pub fn dim(&self) -> usize {
        match self {
            TextModel::Bert(m) => m.dim(),
            TextModel::ModernBert(m) => m.dim(),
            TextModel::Qwen3(m) => m.dim(),
        }
    }

    /// Ids the model knows (token ids are below it).
    pub fn vocab_size(&self) -> usize {
        match self {
            TextModel::Bert(m) => m.config().vocab_size,
            TextModel::ModernBert(m) => m.config().vocab_size,
            TextModel::Qwen3(m) => m.config().vocab_size,
        }
    }

    /// The longest sequence the model takes.
    pub fn positions(&self) -> usize {
        match self {
            TextModel::Bert(m) => m.config().positions(),
            TextModel::ModernBert(m) => m.config().max_position_embeddings,
            TextModel::Qwen3(m) => m.config().max_position_embeddings,
        }
    }

    /// The precision of the matrix weights.
    pub fn precision(&self) -> Precision {
        match self {
            TextModel::Bert(m) => m.precision(),
            TextModel::ModernBert(m) => m.precision(),
            TextModel::Qwen3(m) => m.precision(),
        }
    }

    /// Vectors of `seqs` from one ragged forward pass and `head`, in input order
    /// (each family's `embed_packed_head`; BERT's at the batch's exact length, see
    /// [`Packing`]).
    pub fn embed_packed_head(
        &self,
        seqs: &[&[u32]],
        head: &Head,
        prompt: &[usize],
        normalize: &[bool],
    ) -> Result<Vec<Vec<f32>>> {
        match self {
            TextModel::Bert(m) => {
                m.embed_packed_head(seqs, head, Packing::Exact, prompt, normalize)
            }
            TextModel::ModernBert(m) => m.embed_packed_head(seqs, head, prompt, normalize),
            TextModel::Qwen3(m) => m.embed_packed_head(seqs, head, prompt, normalize),
        }
    }
}
