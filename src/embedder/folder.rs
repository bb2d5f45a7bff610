//! Reading a sentence-transformers model folder: the encoder's weights and config
//! (any [`TextModel`] family), the
//! tokenizer set up as sentence-transformers runs it (no padding, truncation at the
//! model's `max_seq_length`), and the module list after the encoder (`pipeline.rs`). Every failure names the file and
//! what was wrong with it. The helpers a cross-encoder folder also needs (the JSON
//! files, the tokenizer, the model's errors) are here too.

use std::path::Path;

use tokenizers::{Tokenizer, TruncationDirection, TruncationParams};

use super::pipeline::Pipeline;
use super::EmbedError;
use crate::models::{ModelError, Precision, TextModel};

/// What [`Embedder`](super::Embedder) needs from a model folder.
pub(super) struct Folder {
    pub(super) model: TextModel,
    pub(super) tokenizer: Tokenizer,
    /// The modules after the encoder, the prompts.
    pub(super) pipeline: Pipeline,
    /// Tokens per text after truncation (special tokens included).
    pub(super) max_tokens: usize,
}

/// A [`EmbedError::Load`] naming `path`.
pub(super) fn load_error(path: &Path, msg: impl Into<String>) -> EmbedError {
    EmbedError::Load {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// A JSON file of the folder, or `None` when it does not exist.
pub(super) fn read_json(path: &Path) -> Result<Option<serde_json::Value>, EmbedError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(load_error(path, format!("cannot read it: {e}"))),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| load_error(path, format!("not valid JSON: {e}")))
}

impl Folder {
    pub(super) fn load(dir: &Path, precision: Precision) -> Result<Folder, EmbedError> {
        check_dir(dir, "a sentence-transformers model folder")?;
        // The hidden width the head is checked against, read from the encoder's
        // config before its weights are.
        let enc_config = encoder_dir(dir)?.join("config.json");
        let hidden = read_json(&enc_config)
            .ok()
            .flatten()
            .and_then(|v| v.get("hidden_size")?.as_u64());
        let Some(hidden) = hidden else {
            // A module the engine does not run is the first thing to say; then why
            // the config is unusable.
            super::pipeline::check_modules(dir)?;
            let e = TextModel::load_as(&encoder_dir(dir)?, precision).err();
            let msg = "no usable `hidden_size`";
            return Err(e.map_or_else(|| load_error(&enc_config, msg), |e| model_error(dir, e)));
        };
        let pipeline = Pipeline::load(dir, hidden as usize)?;
        let enc = pipeline.encoder.as_path();
        let model = TextModel::load_as(enc, precision).map_err(|e| model_error(enc, e))?;
        let max_tokens = max_seq_length(enc)?
            .or(max_seq_length(dir)?)
            .or(model_max_length(enc)?)
            .unwrap_or(model.positions())
            .min(model.positions());
        let mut tokenizer = load_tokenizer(enc, model.vocab_size())?;
        truncate(&mut tokenizer, enc, max_tokens, TruncationDirection::Right)?;
        Ok(Folder {
            pipeline,
            model,
            tokenizer,
            max_tokens,
        })
    }
}

/// An error unless `dir` is a folder (`what` says which kind is expected).
pub(super) fn check_dir(dir: &Path, what: &str) -> Result<(), EmbedError> {
    if dir.is_dir() {
        return Ok(());
    }
    Err(load_error(
        dir,
        format!(
            "not a folder; expected {what} with config.json, model.safetensors and tokenizer.json"
        ),
    ))
}

/// A model's loading error as [`EmbedError::Load`], naming the file.
pub(super) fn model_error(dir: &Path, e: ModelError) -> EmbedError {
    match e {
        ModelError::Io { path, error } => load_error(&path, format!("cannot read it: {error}")),
        ModelError::Format { path, msg } => load_error(&path, msg),
        ModelError::Tensor(e) => load_error(dir, format!("building a weight: {e}")),
    }
}

/// The folder's `tokenizer.json`, checked against the model's vocabulary of `vocab`
/// ids, without padding or truncation.
pub(super) fn load_tokenizer(dir: &Path, vocab: usize) -> Result<Tokenizer, EmbedError> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Err(load_error(&path, "missing"));
    }
    let mut tokenizer =
        Tokenizer::from_file(&path).map_err(|e| load_error(&path, format!("{e}")))?;
    let size = tokenizer.get_vocab_size(true);
    if size > vocab {
        return Err(load_error(
            &path,
            format!(
                "the tokenizer has {size} tokens but the model's vocabulary (config.json) \
                 has {vocab}: they are not from the same model"
            ),
        ));
    }
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| load_error(&path, format!("cannot turn truncation off: {e}")))?;
    Ok(tokenizer)
}

/// Sets `tokenizer` to cut what it encodes to `max_tokens` (special tokens included)
/// from `direction`'s end; a pair loses tokens from its longer sequence first, as
/// Hugging Face's `truncation=True` does.
pub(super) fn truncate(
    tokenizer: &mut Tokenizer,
    dir: &Path,
    max_tokens: usize,
    direction: TruncationDirection,
) -> Result<(), EmbedError> {
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: max_tokens,
            direction,
            ..Default::default()
        }))
        .map(|_| ())
        .map_err(|e| {
            load_error(
                &dir.join("tokenizer.json"),
                format!("cannot set truncation: {e}"),
            )
        })
}

/// `max_seq_length` of `sentence_bert_config.json`, when the folder has one.
pub(super) fn max_seq_length(dir: &Path) -> Result<Option<usize>, EmbedError> {
    let path = dir.join("sentence_bert_config.json");
    let Some(v) = read_json(&path)? else {
        return Ok(None);
    };
    match v.get("max_seq_length") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(n) => match n.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n as usize)),
            _ => Err(load_error(
                &path,
                format!("max_seq_length must be a positive integer, got {n}"),
            )),
        },
    }
}

/// `model_max_length` of `tokenizer_config.json`, when the folder has one: where
/// sentence-transformers 6 keeps `max_seq_length` (it writes no
/// `sentence_bert_config.json` field). Tokenizers without a limit write a huge
/// number (1e30); the model's positions then bound it.
pub(super) fn model_max_length(dir: &Path) -> Result<Option<usize>, EmbedError> {
    let path = dir.join("tokenizer_config.json");
    let Some(v) = read_json(&path)? else {
        return Ok(None);
    };
    match v.get("model_max_length") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(n) => match n.as_f64() {
            Some(x) if x >= 1.0 => Ok(Some(if x >= usize::MAX as f64 {
                usize::MAX
            } else {
                x as usize
            })),
            _ => Err(load_error(
                &path,
                format!("model_max_length must be a positive number, got {n}"),
            )),
        },
    }
}

/// The folder of the encoder: the `path` of the Transformer module, the first of
/// `modules.json` (the folder itself when it has no list or an empty path).
fn encoder_dir(dir: &Path) -> Result<std::path::PathBuf, EmbedError> {
    let first = read_json(&dir.join("modules.json"))?
        .and_then(|v| v.get(0).and_then(|m| m.get("path")).cloned());
    match first.as_ref().and_then(|p| p.as_str()) {
        Some(p) if !p.is_empty() && !p.contains("..") && !Path::new(p).is_absolute() => {
            Ok(dir.join(p))
        }
        _ => Ok(dir.to_path_buf()),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A temporary folder holding `files` (path, text).
    pub(crate) fn folder(files: &[(&str, &str)]) -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "streamfuse-folder-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        for (name, text) in files {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn unsupported_or_broken_configs_name_the_file() {
        let d = folder(&[("sentence_bert_config.json", "{not json")]);
        let e = max_seq_length(&d).unwrap_err().to_string();
        assert!(
            e.contains("sentence_bert_config.json") && e.contains("JSON"),
            "{e}"
        );
        let d = folder(&[("sentence_bert_config.json", r#"{"max_seq_length": 0}"#)]);
        assert!(max_seq_length(&d).is_err());
        let d = folder(&[("sentence_bert_config.json", r#"{"max_seq_length": 128}"#)]);
        assert_eq!(max_seq_length(&d).unwrap(), Some(128));
        // sentence-transformers 6 keeps it as the tokenizer's model_max_length.
        let d = folder(&[("tokenizer_config.json", r#"{"model_max_length": 256}"#)]);
        assert_eq!(model_max_length(&d).unwrap(), Some(256));
        let d = folder(&[(
            "tokenizer_config.json",
            r#"{"model_max_length": 1000000000000000019884624838656}"#,
        )]);
        assert_eq!(model_max_length(&d).unwrap(), Some(usize::MAX));
        let d = folder(&[("tokenizer_config.json", r#"{"model_max_length": 0}"#)]);
        assert!(model_max_length(&d).is_err());
    }

    #[test]
    fn a_missing_folder_or_file_is_named() {
        let e = Folder::load(Path::new("/no/such/folder"), Precision::F32)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("/no/such/folder") && e.contains("not a folder"),
            "{e}"
        );
        let d = folder(&[("config.json", "{}")]);
        let e = Folder::load(&d, Precision::F32).err().unwrap().to_string();
        assert!(
            e.contains("config.json") && e.contains("missing field"),
            "{e}"
        );
    }
}
