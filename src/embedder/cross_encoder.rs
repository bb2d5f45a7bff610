//! Reading a sentence-transformers CrossEncoder folder: the `BertForSequenceClassification`
//! weights and config, the activation that turns its logit into a score, the longest
//! pair it takes, and its tokenizer set up for pairs. Every failure names the file.
//!
//! **The activation rule** is sentence-transformers' own (`CrossEncoder`'s default
//! activation, v4 and earlier): config.json's `sentence_transformers.activation_fn`
//! (what v4 and later save), else its `sbert_ce_default_activation_function` (what
//! earlier versions saved), else sigmoid when the model has one label and identity
//! otherwise. The names are torch's (`torch.nn.modules.activation.Sigmoid`,
//! `torch.nn.modules.linear.Identity`, `torch.nn.modules.activation.Tanh`); any other
//! is refused by name. A reranker has one label (its logit is the relevance): a
//! folder with more is refused.
//!
//! **The longest pair** (special tokens included) is the smallest of the model's
//! positions (`BertConfig::positions`), `sentence_bert_config.json`'s `max_seq_length` and
//! `tokenizer_config.json`'s `model_max_length` (the length Hugging Face's tokenizer
//! truncates to when the CrossEncoder is given none; a value that is not a positive
//! whole number, such as the `1e30` written when it is unknown, is ignored).

use std::path::Path;

use tokenizers::{Tokenizer, TruncationDirection};

use super::folder::{
    check_dir, load_error, load_tokenizer, max_seq_length, model_error, read_json, truncate,
};
use super::EmbedError;
use crate::models::{BertClassifier, Precision};

/// How a cross-encoder's logit becomes the score it reports (sentence-transformers'
/// `CrossEncoder.predict`). Each is increasing, so the order of documents is the
/// logits' order whatever the activation.
///
/// It is read from the folder's config.json by sentence-transformers' own rule:
/// `sentence_transformers.activation_fn` (what v4 and later save), else
/// `sbert_ce_default_activation_function` (what earlier versions saved), else sigmoid
/// for a model with one label (identity for more). The names are torch's
/// (`torch.nn.modules.activation.Sigmoid`, `torch.nn.modules.linear.Identity`,
/// `torch.nn.modules.activation.Tanh`); a folder naming another is refused by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreActivation {
    /// `1 / (1 + e^-x)`: scores in (0, 1); the default for one label.
    Sigmoid,
    /// The logit itself (`torch.nn.modules.linear.Identity`, as the MS MARCO
    /// cross-encoders ship).
    Identity,
    /// `tanh x`: scores in (-1, 1).
    Tanh,
}

impl ScoreActivation {
    /// The score of `logit` (computed in f64, rounded once to f32).
    pub fn apply(self, logit: f32) -> f32 {
        let x = f64::from(logit);
        match self {
            ScoreActivation::Sigmoid => (1.0 / (1.0 + (-x).exp())) as f32,
            ScoreActivation::Identity => logit,
            ScoreActivation::Tanh => x.tanh() as f32,
        }
    }

    /// The activation config.json (`config`) names, else the default for `labels`.
    fn from_config(config: &serde_json::Value, labels: usize) -> Result<ScoreActivation, String> {
        let named = config
            .get("sentence_transformers")
            .and_then(|st| st.get("activation_fn"))
            .map(|name| ("sentence_transformers.activation_fn", name))
            .or_else(|| {
                config
                    .get("sbert_ce_default_activation_function")
                    .filter(|name| !name.is_null())
                    .map(|name| ("sbert_ce_default_activation_function", name))
            });
        let Some((field, name)) = named else {
            return Ok(if labels == 1 {
                ScoreActivation::Sigmoid
            } else {
                ScoreActivation::Identity
            });
        };
        match name.as_str() {
            Some("torch.nn.modules.activation.Sigmoid") => Ok(ScoreActivation::Sigmoid),
            Some("torch.nn.modules.linear.Identity") => Ok(ScoreActivation::Identity),
            Some("torch.nn.modules.activation.Tanh") => Ok(ScoreActivation::Tanh),
            _ => Err(format!(
                "`{field}` is {name}; supported are torch.nn.modules.activation.Sigmoid, \
                 torch.nn.modules.linear.Identity and torch.nn.modules.activation.Tanh"
            )),
        }
    }
}

/// What [`Reranker`](super::Reranker) needs from a cross-encoder folder.
pub(super) struct CrossEncoderFolder {
    pub(super) classifier: BertClassifier,
    /// Pairs cut to `max_tokens` at their ends (longer sequence first).
    pub(super) right: Tokenizer,
    /// Pairs cut to `max_tokens` at their starts.
    pub(super) left: Tokenizer,
    /// Pairs as they are.
    pub(super) whole: Tokenizer,
    /// The longest pair, special tokens included.
    pub(super) max_tokens: usize,
    pub(super) activation: ScoreActivation,
}

impl CrossEncoderFolder {
    pub(super) fn load(dir: &Path, precision: Precision) -> Result<CrossEncoderFolder, EmbedError> {
        check_dir(dir, "a sentence-transformers CrossEncoder folder")?;
        let classifier =
            BertClassifier::load_as(dir, precision).map_err(|e| model_error(dir, e))?;
        let cfg = classifier.model().config();
        let config_path = dir.join("config.json");
        if classifier.labels() != 1 {
            return Err(load_error(
                &config_path,
                format!(
                    "the model has {} labels; a reranker has one (its relevance logit)",
                    classifier.labels()
                ),
            ));
        }
        let config = read_json(&config_path)?.unwrap_or_default();
        let activation = ScoreActivation::from_config(&config, classifier.labels())
            .map_err(|msg| load_error(&config_path, msg))?;
        let max_tokens = [max_seq_length(dir)?, model_max_length(dir)?]
            .into_iter()
            .flatten()
            .fold(cfg.positions(), usize::min);
        let whole = load_tokenizer(dir, cfg.vocab_size)?;
        let (mut right, mut left) = (whole.clone(), whole.clone());
        truncate(&mut right, dir, max_tokens, TruncationDirection::Right)?;
        truncate(&mut left, dir, max_tokens, TruncationDirection::Left)?;
        Ok(CrossEncoderFolder {
            classifier,
            right,
            left,
            whole,
            max_tokens,
            activation,
        })
    }
}

/// `model_max_length` of `tokenizer_config.json`, when it is a positive whole number.
fn model_max_length(dir: &Path) -> Result<Option<usize>, EmbedError> {
    let Some(v) = read_json(&dir.join("tokenizer_config.json"))? else {
        return Ok(None);
    };
    Ok(v.get("model_max_length")
        .and_then(serde_json::Value::as_u64)
        .filter(|&n| n >= 1)
        .and_then(|n| usize::try_from(n).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_activation_follows_sentence_transformers_rule() {
        let sigmoid = "torch.nn.modules.activation.Sigmoid";
        let identity = "torch.nn.modules.linear.Identity";
        let get = |c: serde_json::Value, labels| ScoreActivation::from_config(&c, labels);
        // Nothing named: sigmoid for one label, identity for more.
        assert_eq!(get(json!({}), 1), Ok(ScoreActivation::Sigmoid));
        assert_eq!(get(json!({}), 3), Ok(ScoreActivation::Identity));
        // v4's field wins over the older one.
        let both = json!({
            "sentence_transformers": {"activation_fn": identity, "version": "4.1.0"},
            "sbert_ce_default_activation_function": sigmoid,
        });
        assert_eq!(get(both, 1), Ok(ScoreActivation::Identity));
        let old = json!({"sbert_ce_default_activation_function": identity});
        assert_eq!(get(old, 1), Ok(ScoreActivation::Identity));
        let null = json!({"sbert_ce_default_activation_function": null});
        assert_eq!(get(null, 1), Ok(ScoreActivation::Sigmoid));
        let tanh =
            json!({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}});
        assert_eq!(get(tanh, 1), Ok(ScoreActivation::Tanh));
        let other = json!({"sentence_transformers": {"activation_fn": "my.Module"}});
        let e = get(other, 1).unwrap_err();
        assert!(
            e.contains("my.Module") && e.contains("activation_fn"),
            "{e}"
        );
    }

    #[test]
    fn activations_compute_their_functions() {
        assert_eq!(ScoreActivation::Identity.apply(-3.5), -3.5);
        assert_eq!(ScoreActivation::Sigmoid.apply(0.0), 0.5);
        assert!((ScoreActivation::Sigmoid.apply(2.0) - 0.880_797_1).abs() < 1e-7);
        assert!((ScoreActivation::Tanh.apply(0.5) - 0.462_117_2).abs() < 1e-7);
        // Saturated, not NaN, far out.
        assert_eq!(ScoreActivation::Sigmoid.apply(-1e4), 0.0);
        assert_eq!(ScoreActivation::Sigmoid.apply(1e4), 1.0);
    }

    #[test]
    fn model_max_length_ignores_the_unknown_sentinel() {
        let dir = std::env::temp_dir().join(format!("streamfuse-ce-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |text: &str| std::fs::write(dir.join("tokenizer_config.json"), text).unwrap();
        assert_eq!(model_max_length(&dir).unwrap(), None);
        write(r#"{"model_max_length": 128}"#);
        assert_eq!(model_max_length(&dir).unwrap(), Some(128));
        write(r#"{"model_max_length": 1000000000000000019884624838656}"#);
        assert_eq!(model_max_length(&dir).unwrap(), None);
        write(r#"{"model_max_length": 0}"#);
        assert_eq!(model_max_length(&dir).unwrap(), None);
        write("{broken");
        let e = model_max_length(&dir).unwrap_err().to_string();
        assert!(
            e.contains("tokenizer_config.json") && e.contains("JSON"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
