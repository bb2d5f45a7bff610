//! The model's hyperparameters: [`BertConfig`], read from a Hugging Face
//! `config.json` and checked, and the feed-forward activation it names.

use std::path::Path;

use super::super::{json, ModelError};
use crate::{Result, Tensor};

/// The `model_type`s run as BERT with RoBERTa's position ids.
const ROBERTA_FAMILY: [&str; 3] = ["roberta", "xlm-roberta", "camembert"];

/// MPNet's padding id as Hugging Face's `MPNetEmbeddings` fixes it (whatever
/// `pad_token_id` says): its position ids count on from one past it.
const MPNET_PADDING_IDX: usize = 1;

/// The fields of a Hugging Face BERT `config.json` that the forward pass needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Rows of the token embedding table.
    pub vocab_size: usize,
    /// Width of every hidden state (384 for MiniLM-L6).
    pub hidden_size: usize,
    /// Number of transformer layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer; `hidden_size` must be a multiple of it.
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Rows of the position table (the longest sequence it covers is
    /// [`BertConfig::positions`], fewer for RoBERTa's families).
    pub max_position_embeddings: usize,
    /// Rows of the token type table (at least 1: every token has type 0 here).
    pub type_vocab_size: usize,
    /// Epsilon of every layer norm.
    pub layer_norm_eps: f64,
    /// Activation of the feed-forward layer: `gelu` (exact), `gelu_new` /
    /// `gelu_pytorch_tanh` (tanh approximation) or `relu`.
    pub hidden_act: String,
    /// Token id used to pad sequences in a batch.
    pub pad_token_id: u32,
    /// Outputs of a sequence-classification head ([`BertClassifier`](super::BertClassifier)):
    /// the length of `id2label`, else the `num_labels` field, else 2, as Hugging Face's
    /// `PretrainedConfig` has it (a cross-encoder reranker has 1). An encoder alone
    /// does not use it.
    pub num_labels: usize,
    /// The architecture (`model_type`): `bert` (also for a config without one),
    /// `roberta`, `xlm-roberta`, `camembert` or `mpnet`. RoBERTa's families are
    /// BERT's encoder with other position ids (see [`BertConfig::position_offset`]);
    /// MPNet is that too, without token types, plus a relative position bias on the
    /// attention scores ([`BertConfig::relative_attention_num_buckets`]).
    pub model_type: String,
    /// The row of the position table a sequence's first token takes: 0 for BERT;
    /// `pad_token_id + 1` for RoBERTa's families, whose position ids count on from
    /// past the padding id (Hugging Face's `create_position_ids_from_input_ids`), so
    /// their first `pad_token_id + 1` rows are never read; 2 for MPNet, whose padding
    /// id Hugging Face fixes at 1.
    pub position_offset: usize,
    /// MPNet's relative position buckets (its `relative_attention_num_buckets`, 32 by
    /// default): a learned bias per head and bucket of the distance from query to key,
    /// added to every layer's attention scores. 0 for the models without one.
    pub relative_attention_num_buckets: usize,
}

impl BertConfig {
    /// Parses the text of a `config.json`. Missing or ill-typed fields are named in
    /// the error.
    pub fn from_json(text: &str) -> std::result::Result<BertConfig, String> {
        let obj = json::object(text)?;
        let usize_field = |name: &str| json::usize_field(&obj, name);
        // The architecture comes from `model_type`; a config without one (older
        // exports) is taken as BERT.
        let model_type = match obj.get("model_type") {
            None | Some(serde_json::Value::Null) => "bert".to_string(),
            Some(serde_json::Value::String(t))
                if ROBERTA_FAMILY.contains(&t.as_str()) || t == "bert" || t == "mpnet" =>
            {
                t.clone()
            }
            Some(other) if other == "modernbert" || other == "qwen3" => {
                return Err(format!(
                    "model_type {other} is not a BERT-family encoder: load the folder as a \
                     `TextModel` (the Embedder does)"
                ))
            }
            Some(other) => {
                return Err(format!(
                    "model_type {other} is not supported (only `bert`, `roberta`, \
                     `xlm-roberta`, `camembert` and `mpnet`, and through `TextModel` \
                     `modernbert` and `qwen3`); the folder's architecture cannot be run"
                ))
            }
        };
        let pad_token_id = obj
            .get("pad_token_id")
            .and_then(|x| x.as_u64())
            .unwrap_or(if model_type == "bert" { 0 } else { 1 });
        let mpnet = model_type == "mpnet";
        let position_offset = if model_type == "bert" {
            0
        } else if mpnet {
            MPNET_PADDING_IDX + 1
        } else {
            usize::try_from(pad_token_id)
                .ok()
                .and_then(|p| p.checked_add(1))
                .ok_or_else(|| format!("pad_token_id {pad_token_id} is too large"))?
        };
        let cfg = BertConfig {
            vocab_size: usize_field("vocab_size")?,
            hidden_size: usize_field("hidden_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads: usize_field("num_attention_heads")?,
            intermediate_size: usize_field("intermediate_size")?,
            max_position_embeddings: usize_field("max_position_embeddings")?,
            // MPNet has no token types (no table in its weights): one type, all zero.
            type_vocab_size: match obj.get("type_vocab_size") {
                _ if mpnet => 1,
                Some(_) => usize_field("type_vocab_size")?,
                None => 2,
            },
            layer_norm_eps: match obj.get("layer_norm_eps") {
                None => 1e-12,
                Some(x) => x
                    .as_f64()
                    .ok_or_else(|| "field `layer_norm_eps` must be a number".to_string())?,
            },
            hidden_act: match obj.get("hidden_act") {
                None => "gelu".to_string(),
                Some(x) => x
                    .as_str()
                    .ok_or_else(|| "field `hidden_act` must be a string".to_string())?
                    .to_string(),
            },
            pad_token_id: u32::try_from(pad_token_id)
                .map_err(|_| format!("pad_token_id {pad_token_id} is too large"))?,
            num_labels: match (obj.get("id2label"), obj.get("num_labels")) {
                (Some(labels), _) => labels
                    .as_object()
                    .ok_or_else(|| "field `id2label` must be an object".to_string())?
                    .len(),
                (None, Some(_)) => usize_field("num_labels")?,
                (None, None) => 2,
            },
            relative_attention_num_buckets: match obj.get("relative_attention_num_buckets") {
                _ if !mpnet => 0,
                Some(_) => usize_field("relative_attention_num_buckets")?,
                None => 32,
            },
            model_type,
            position_offset,
        };
        if let Some(kind) = obj.get("position_embedding_type").and_then(|x| x.as_str()) {
            if kind != "absolute" {
                return Err(format!(
                    "position_embedding_type `{kind}` is not supported (only `absolute`)"
                ));
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a `config.json` file.
    pub fn load(path: &Path) -> std::result::Result<BertConfig, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|error| ModelError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        BertConfig::from_json(&text).map_err(|msg| ModelError::Format {
            path: path.to_path_buf(),
            msg,
        })
    }

    /// The longest sequence the position table covers: its rows past
    /// [`BertConfig::position_offset`] (512 for BERT's and XLM-RoBERTa's usual 512 and
    /// 514 rows).
    pub fn positions(&self) -> usize {
        self.max_position_embeddings
            .saturating_sub(self.position_offset)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    pub(super) fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ];
        json::all_positive(&positive)?;
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.layer_norm_eps.is_nan() || self.layer_norm_eps < 0.0 {
            return Err("layer_norm_eps must be a non-negative number".into());
        }
        if self.positions() == 0 {
            return Err(format!(
                "max_position_embeddings {} leaves no position past the {} a {} sequence starts at \
                 (pad_token_id + 1)",
                self.max_position_embeddings, self.position_offset, self.model_type
            ));
        }
        if self.model_type == "mpnet" && self.relative_attention_num_buckets < 4 {
            return Err(format!(
                "relative_attention_num_buckets {} is too few for MPNet's bucketing (at least 4)",
                self.relative_attention_num_buckets
            ));
        }
        Activation::parse(&self.hidden_act)?;
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Activation {
    Gelu,
    GeluTanh,
    Relu,
}

impl Activation {
    pub(super) fn parse(name: &str) -> std::result::Result<Activation, String> {
        match name {
            "gelu" => Ok(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            "relu" => Ok(Activation::Relu),
            other => Err(format!(
                "hidden_act `{other}` is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu)"
            )),
        }
    }

    pub(super) fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Relu => x.relu(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_minilm_fields() {
        let cfg = BertConfig::from_json(
            r#"{"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
                "num_attention_heads": 12, "intermediate_size": 1536,
                "max_position_embeddings": 512, "type_vocab_size": 2,
                "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}"#,
        )
        .unwrap();
        assert_eq!(cfg.head_dim(), 32);
        assert_eq!(cfg.layer_norm_eps, 1e-12);
        assert_eq!(cfg.num_labels, 2, "Hugging Face's default");
    }

    #[test]
    fn roberta_families_start_their_positions_past_the_padding_id() {
        let cfg = |extra: &str| tiny_with(extra);
        let bert = cfg("").unwrap();
        assert_eq!(
            (
                bert.model_type.as_str(),
                bert.position_offset,
                bert.positions()
            ),
            ("bert", 0, 8)
        );
        for t in ["roberta", "xlm-roberta", "camembert"] {
            let c = cfg(&format!(r#", "model_type": "{t}", "pad_token_id": 1"#)).unwrap();
            assert_eq!(
                (c.position_offset, c.positions(), c.pad_token_id),
                (2, 6, 1),
                "{t}"
            );
        }
        // RoBERTa's default padding id is 1.
        let c = cfg(r#", "model_type": "xlm-roberta""#).unwrap();
        assert_eq!((c.pad_token_id, c.position_offset), (1, 2));
        let e = cfg(r#", "model_type": "roberta", "pad_token_id": 7"#).unwrap_err();
        assert!(
            e.contains("no position") && e.contains("max_position_embeddings 8"),
            "{e}"
        );
    }

    /// A small valid config with the fields `extra` (`, "key": value, ...`) added.
    fn tiny_with(extra: &str) -> std::result::Result<BertConfig, String> {
        let base = r#""vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 1,
                "num_attention_heads": 2, "intermediate_size": 8,
                "max_position_embeddings": 8"#;
        BertConfig::from_json(&format!("{{{base}{extra}}}"))
    }

    #[test]
    fn labels_come_from_id2label_then_num_labels() {
        let cfg = tiny_with;
        assert_eq!(
            cfg(r#", "id2label": {"0": "LABEL_0"}"#).unwrap().num_labels,
            1
        );
        assert_eq!(
            cfg(r#", "id2label": {"0": "a", "1": "b", "2": "c"}, "num_labels": 1"#)
                .unwrap()
                .num_labels,
            3
        );
        assert_eq!(cfg(r#", "num_labels": 1"#).unwrap().num_labels, 1);
        let e = cfg(r#", "id2label": []"#).unwrap_err();
        assert!(e.contains("id2label"), "{e}");
        // No labels is the classifier's error, not the encoder's.
        assert_eq!(cfg(r#", "id2label": {}"#).unwrap().num_labels, 0);
    }

    #[test]
    fn an_unknown_model_type_or_activation_is_named() {
        let cfg = tiny_with;
        assert!(cfg(r#", "model_type": "bert""#).is_ok());
        let e = cfg(r#", "model_type": "modernbert""#).unwrap_err();
        assert!(e.contains("modernbert") && e.contains("TextModel"), "{e}");
        let e = cfg(r#", "model_type": "deberta-v2""#).unwrap_err();
        assert!(e.contains("deberta-v2") && e.contains("model_type"), "{e}");
        let e = cfg(r#", "hidden_act": "silu""#).unwrap_err();
        assert!(e.contains("silu") && e.contains("hidden_act"), "{e}");
    }

    #[test]
    fn config_errors_name_the_field() {
        let e = BertConfig::from_json(r#"{"vocab_size": 10}"#).unwrap_err();
        assert!(e.contains("hidden_size"), "{e}");
        let e = BertConfig::from_json("not json").unwrap_err();
        assert!(e.contains("JSON"), "{e}");
        let e = BertConfig::from_json(
            r#"{"vocab_size": 1, "hidden_size": 10, "num_hidden_layers": 1,
                "num_attention_heads": 3, "intermediate_size": 4,
                "max_position_embeddings": 8}"#,
        )
        .unwrap_err();
        assert!(e.contains("multiple"), "{e}");
    }
}
