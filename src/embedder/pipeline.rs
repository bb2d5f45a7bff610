//! Reading a sentence-transformers folder's module list (`modules.json`) into what
//! the embedder runs: the encoder's folder, the [`Head`] (pooling modes with
//! `include_prompt`, `Dense` layers with their activation), whether the list ends
//! with `Normalize`, and the prompts of `config_sentence_transformers.json`.
//!
//! Both ways of naming modules are read: the classic `sentence_transformers.models.X`
//! of sentence-transformers up to 5 and the module paths of sentence-transformers 6
//! (`sentence_transformers.base.modules.transformer.Transformer`, ...). A module the
//! engine does not run exactly is refused with an error naming it, so that a folder
//! never loads and gives different embeddings. A folder without `modules.json` runs
//! as it always did: the pooling config of `1_Pooling` when present (else mean
//! pooling), and L2 normalisation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use super::folder::{load_error, read_json};
use super::EmbedError;
use crate::models::head::{Dense, DenseActivation, Head};
use crate::models::pooling::Pooling;

/// The modules the engine runs, by every `type` name sentence-transformers writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Transformer,
    Pooling,
    Dense,
    Normalize,
}

/// `type` strings of `modules.json`: the classic names, then sentence-transformers 6's.
const KINDS: [(&str, Kind); 12] = [
    (
        "sentence_transformers.models.Transformer",
        Kind::Transformer,
    ),
    ("sentence_transformers.models.Pooling", Kind::Pooling),
    ("sentence_transformers.models.Dense", Kind::Dense),
    ("sentence_transformers.models.Normalize", Kind::Normalize),
    (
        "sentence_transformers.base.modules.transformer.Transformer",
        Kind::Transformer,
    ),
    (
        "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
        Kind::Pooling,
    ),
    (
        "sentence_transformers.base.modules.dense.Dense",
        Kind::Dense,
    ),
    (
        "sentence_transformers.base.modules.normalize.Normalize",
        Kind::Normalize,
    ),
    // The package-level names sentence-transformers 6 also exports.
    (
        "sentence_transformers.base.modules.Transformer",
        Kind::Transformer,
    ),
    (
        "sentence_transformers.sentence_transformer.modules.Pooling",
        Kind::Pooling,
    ),
    ("sentence_transformers.base.modules.Dense", Kind::Dense),
    (
        "sentence_transformers.base.modules.Normalize",
        Kind::Normalize,
    ),
];

/// What the module list says to run.
pub(super) struct Pipeline {
    /// The folder of the encoder (the Transformer module's path).
    pub(super) encoder: PathBuf,
    /// The pooling modes, `include_prompt` and the `Dense` layers, for an encoder of
    /// `hidden` features.
    pub(super) head: Head,
    /// Whether the list ends with `Normalize` (always, for a folder without a list).
    pub(super) normalize: bool,
    /// Prompts by name (`config_sentence_transformers.json`).
    pub(super) prompts: BTreeMap<String, String>,
    /// The prompt used when a request names none.
    pub(super) default_prompt: Option<String>,
}

impl Pipeline {
    /// Reads the module list of folder `dir` for an encoder `hidden` features wide.
    pub(super) fn load(dir: &Path, hidden: usize) -> Result<Pipeline, EmbedError> {
        let (prompts, default_prompt) = prompts(dir)?;
        let list_path = dir.join("modules.json");
        let Some(list) = read_json(&list_path)? else {
            let pool = pooling(&dir.join("1_Pooling").join("config.json"), hidden)?;
            return Ok(Pipeline {
                encoder: dir.to_path_buf(),
                head: head(&list_path, hidden, pool, Vec::new())?,
                normalize: true,
                prompts,
                default_prompt,
            });
        };
        let modules = modules(&list_path, &list)?;
        let bad = |msg: String| load_error(&list_path, msg);
        let mut it = modules.iter().peekable();
        let encoder = match it.next() {
            Some((Kind::Transformer, p)) => dir.join(p),
            _ => return Err(bad("the first module must be a Transformer".into())),
        };
        let pool = match it.next() {
            Some((Kind::Pooling, p)) => pooling(&dir.join(p).join("config.json"), hidden)?,
            _ => {
                return Err(bad(
                    "a Pooling module must follow the Transformer (token embeddings \
                     are not served)"
                        .into(),
                ))
            }
        };
        let mut dense = Vec::new();
        while let Some((Kind::Dense, p)) = it.peek() {
            dense.push(load_dense(&dir.join(p))?);
            it.next();
        }
        let normalize = it.next_if(|(k, _)| *k == Kind::Normalize).is_some();
        if let Some((kind, _)) = it.next() {
            return Err(bad(format!(
                "a {kind:?} module after the pooling, Dense and Normalize modules is not \
                 supported"
            )));
        }
        Ok(Pipeline {
            encoder,
            head: head(&list_path, hidden, pool, dense)?,
            normalize,
            prompts,
            default_prompt,
        })
    }
}

/// An error naming the first module of `dir`'s `modules.json` that the engine does
/// not run, if any: what to say first when the encoder itself does not load either.
pub(super) fn check_modules(dir: &Path) -> Result<(), EmbedError> {
    let path = dir.join("modules.json");
    match read_json(&path)? {
        Some(list) => modules(&path, &list).map(|_| ()),
        None => Ok(()),
    }
}

fn head(
    path: &Path,
    hidden: usize,
    (modes, include_prompt): (Vec<Pooling>, bool),
    dense: Vec<Dense>,
) -> Result<Head, EmbedError> {
    Head::new(hidden, modes, include_prompt, dense).map_err(|m| load_error(path, m))
}

/// Each module's kind and path, in order; an error names a module of another type.
fn modules(path: &Path, list: &serde_json::Value) -> Result<Vec<(Kind, String)>, EmbedError> {
    let bad = |msg: String| load_error(path, msg);
    let list = list
        .as_array()
        .ok_or_else(|| bad("expected a list of modules".into()))?;
    list.iter()
        .map(|m| {
            let ty = m
                .get("type")
                .and_then(|t| t.as_str())
                .ok_or_else(|| bad(format!("module {m} has no `type`")))?;
            let kind = KINDS
                .iter()
                .find(|(name, _)| *name == ty)
                .map(|&(_, k)| k)
                .ok_or_else(|| {
                    bad(format!(
                        "module type `{ty}` is not supported (Transformer, Pooling, Dense \
                         and Normalize are)"
                    ))
                })?;
            let p = m.get("path").and_then(|p| p.as_str()).unwrap_or("");
            if Path::new(p).is_absolute() || p.split(['/', '\\']).any(|c| c == "..") {
                return Err(bad(format!("module path `{p}` leaves the folder")));
            }
            Ok((kind, p.to_string()))
        })
        .collect()
}

/// The pooling modes (in sentence-transformers' concatenation order) and
/// `include_prompt` of a pooling config; mean pooling when there is none. Reads the
/// `pooling_mode` of sentence-transformers 6 (a name or a list) or the classic
/// `pooling_mode_*` booleans.
pub(super) fn pooling(path: &Path, hidden: usize) -> Result<(Vec<Pooling>, bool), EmbedError> {
    let Some(v) = read_json(path)? else {
        return Ok((vec![Pooling::Mean], true));
    };
    let bad = |msg: String| load_error(path, msg);
    for key in ["embedding_dimension", "word_embedding_dimension"] {
        if let Some(d) = v.get(key).and_then(|d| d.as_u64()) {
            if d as usize != hidden {
                return Err(bad(format!(
                    "{key} is {d} but the encoder's states are {hidden} wide"
                )));
            }
        }
    }
    let include_prompt = match v.get("include_prompt") {
        None | Some(serde_json::Value::Null) => true,
        Some(b) => b
            .as_bool()
            .ok_or_else(|| bad(format!("include_prompt must be true or false, got {b}")))?,
    };
    let by_name = |name: &str| {
        Pooling::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                bad(format!(
                    "pooling mode `{name}` is not supported (cls, max, mean, \
                     mean_sqrt_len_tokens, weightedmean, lasttoken)"
                ))
            })
    };
    let modes = match v.get("pooling_mode") {
        Some(serde_json::Value::String(name)) => vec![by_name(name)?],
        Some(serde_json::Value::Array(names)) => names
            .iter()
            .map(|n| by_name(n.as_str().unwrap_or("")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(bad(format!(
                "pooling_mode must be a name or a list, got {other}"
            )))
        }
        None => {
            let on = |key: &str| v.get(key).and_then(|x| x.as_bool()).unwrap_or(false);
            if let Some(obj) = v.as_object() {
                let known: Vec<&str> = Pooling::ALL.iter().map(|p| p.config_key()).collect();
                if let Some(k) = obj.keys().find(|k| {
                    k.starts_with("pooling_mode_") && !known.contains(&k.as_str()) && on(k)
                }) {
                    return Err(bad(format!("pooling mode `{k}` is not supported")));
                }
            }
            Pooling::ALL
                .into_iter()
                .filter(|p| on(p.config_key()))
                .collect()
        }
    };
    if modes.is_empty() {
        return Ok((vec![Pooling::Mean], include_prompt));
    }
    Ok((modes, include_prompt))
}

/// A `Dense` module from its folder: `config.json` and `model.safetensors`
/// (`linear.weight`, `linear.bias`).
fn load_dense(dir: &Path) -> Result<Dense, EmbedError> {
    let cfg_path = dir.join("config.json");
    let cfg = read_json(&cfg_path)?.ok_or_else(|| load_error(&cfg_path, "missing"))?;
    let bad = |msg: String| load_error(&cfg_path, msg);
    let dim = |key: &str| {
        cfg.get(key)
            .and_then(|x| x.as_u64())
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| bad(format!("`{key}` must be a positive integer")))
    };
    let (inp, out) = (dim("in_features")?, dim("out_features")?);
    let has_bias = cfg.get("bias").and_then(|b| b.as_bool()).unwrap_or(true);
    // sentence-transformers' default activation is Tanh.
    let act = match cfg.get("activation_function").and_then(|a| a.as_str()) {
        None => DenseActivation::Tanh,
        Some(name) => DenseActivation::parse(name).map_err(bad)?,
    };
    let path = dir.join("model.safetensors");
    if !path.is_file() {
        let pickle = dir.join("pytorch_model.bin");
        if pickle.is_file() {
            return Err(load_error(
                &pickle,
                "Dense weights saved as a PyTorch pickle cannot be read; save the model \
                 again with sentence-transformers (which writes model.safetensors) or \
                 convert the file to safetensors",
            ));
        }
        return Err(load_error(&path, "missing"));
    }
    let bytes =
        std::fs::read(&path).map_err(|e| load_error(&path, format!("cannot read it: {e}")))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| load_error(&path, format!("not a valid safetensors file: {e:?}")))?;
    let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>, EmbedError> {
        let t = st
            .tensor(name)
            .map_err(|_| load_error(&path, format!("weight `{name}` is missing")))?;
        if t.shape() != shape {
            return Err(load_error(
                &path,
                format!(
                    "weight `{name}` has shape {:?}, expected {shape:?}",
                    t.shape()
                ),
            ));
        }
        if t.dtype() != Dtype::F32 {
            return Err(load_error(
                &path,
                format!("weight `{name}` is {:?}; only F32 is supported", t.dtype()),
            ));
        }
        Ok(t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let w = read("linear.weight", &[out, inp])?;
    let b = if has_bias {
        Some(read("linear.bias", &[out])?)
    } else {
        None
    };
    Dense::new(w, out, inp, b, act).map_err(|e| load_error(&path, e.to_string()))
}

/// The prompts and default prompt name of `config_sentence_transformers.json`.
type Prompts = (BTreeMap<String, String>, Option<String>);

fn prompts(dir: &Path) -> Result<Prompts, EmbedError> {
    let path = dir.join("config_sentence_transformers.json");
    let Some(v) = read_json(&path)? else {
        return Ok((BTreeMap::new(), None));
    };
    let bad = |msg: String| load_error(&path, msg);
    let mut prompts = BTreeMap::new();
    match v.get("prompts") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(map)) => {
            for (name, p) in map {
                let p = p
                    .as_str()
                    .ok_or_else(|| bad(format!("prompt `{name}` must be a string")))?;
                prompts.insert(name.clone(), p.to_string());
            }
        }
        Some(other) => return Err(bad(format!("`prompts` must be an object, got {other}"))),
    }
    let default = match v.get("default_prompt_name") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(name)) if prompts.contains_key(name) => Some(name.clone()),
        Some(other) => {
            return Err(bad(format!(
                "default_prompt_name {other} is not one of the prompts"
            )))
        }
    };
    Ok((prompts, default))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedder::folder::tests::folder;

    #[test]
    fn pooling_is_read_in_both_forms_or_defaults_to_mean() {
        let d = folder(&[]);
        let p = |d: &Path| pooling(&d.join("1_Pooling/config.json"), 4).unwrap();
        assert_eq!(p(&d), (vec![Pooling::Mean], true));
        let d = folder(&[(
            "1_Pooling/config.json",
            r#"{"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true,
                "pooling_mode_lasttoken": false}"#,
        )]);
        assert_eq!(p(&d), (vec![Pooling::Cls, Pooling::Mean], true));
        let d = folder(&[(
            "1_Pooling/config.json",
            r#"{"embedding_dimension": 4, "pooling_mode": ["max", "weightedmean"],
                "include_prompt": false}"#,
        )]);
        assert_eq!(p(&d), (vec![Pooling::Max, Pooling::WeightedMean], false));
        let d = folder(&[("1_Pooling/config.json", r#"{"pooling_mode": "lasttoken"}"#)]);
        assert_eq!(p(&d), (vec![Pooling::LastToken], true));
    }

    #[test]
    fn unknown_pooling_modes_and_widths_are_named() {
        let e = |text: &str| {
            let d = folder(&[("1_Pooling/config.json", text)]);
            pooling(&d.join("1_Pooling/config.json"), 4)
                .unwrap_err()
                .to_string()
        };
        let m = e(r#"{"pooling_mode": "attention"}"#);
        assert!(
            m.contains("`attention`") && m.contains("config.json"),
            "{m}"
        );
        let m = e(r#"{"pooling_mode_attention_tokens": true}"#);
        assert!(m.contains("pooling_mode_attention_tokens"), "{m}");
        let m = e(r#"{"word_embedding_dimension": 8}"#);
        assert!(m.contains("word_embedding_dimension"), "{m}");
    }

    #[test]
    fn unknown_modules_are_named_and_order_is_checked() {
        let tr = r#"{"type": "sentence_transformers.models.Transformer", "path": ""}"#;
        let load = |list: &str| {
            let d = folder(&[("modules.json", list)]);
            Pipeline::load(&d, 4).err().map(|e| e.to_string())
        };
        let m = load(&format!(
            r#"[{tr}, {{"type": "sentence_transformers.models.LSTM", "path": "1"}}]"#
        ))
        .unwrap();
        assert!(m.contains("sentence_transformers.models.LSTM"), "{m}");
        let m = load(&format!("[{tr}]")).unwrap();
        assert!(m.contains("Pooling"), "{m}");
        let m = load(r#"[{"type": "sentence_transformers.models.Transformer", "path": "../x"}]"#)
            .unwrap();
        assert!(m.contains("leaves the folder"), "{m}");
        let ok = load(&format!(
            r#"[{tr}, {{"type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
                "path": "1_Pooling"}}]"#
        ));
        assert_eq!(ok, None);
    }

    #[test]
    fn an_unknown_module_is_named_before_a_missing_encoder() {
        let d = folder(&[(
            "modules.json",
            r#"[{"type": "sentence_transformers.models.WordEmbeddings", "path": "0_Words"}]"#,
        )]);
        let load = crate::embedder::folder::Folder::load(&d, crate::models::Precision::F32);
        let m = load.err().unwrap().to_string();
        assert!(
            m.contains("sentence_transformers.models.WordEmbeddings"),
            "{m}"
        );
    }

    #[test]
    fn dense_refuses_pickles_and_unknown_activations_by_name() {
        let d = folder(&[
            (
                "config.json",
                r#"{"in_features": 4, "out_features": 2,
                    "activation_function": "torch.nn.modules.activation.Softsign"}"#,
            ),
            ("model.safetensors", ""),
        ]);
        let m = load_dense(&d).err().unwrap().to_string();
        assert!(m.contains("Softsign"), "{m}");
        let d = folder(&[
            ("config.json", r#"{"in_features": 4, "out_features": 2}"#),
            ("pytorch_model.bin", "pickle"),
        ]);
        let m = load_dense(&d).err().unwrap().to_string();
        assert!(
            m.contains("pytorch_model.bin") && m.contains("pickle"),
            "{m}"
        );
    }

    #[test]
    fn prompts_and_their_default_are_read_and_checked() {
        let d = folder(&[(
            "config_sentence_transformers.json",
            r#"{"prompts": {"query": "query: ", "document": ""}, "default_prompt_name": "query"}"#,
        )]);
        let (p, def) = prompts(&d).unwrap();
        assert_eq!(p["query"], "query: ");
        assert_eq!(def.as_deref(), Some("query"));
        let d = folder(&[(
            "config_sentence_transformers.json",
            r#"{"prompts": {}, "default_prompt_name": "query"}"#,
        )]);
        let m = prompts(&d).unwrap_err().to_string();
        assert!(m.contains("query"), "{m}");
    }
}
