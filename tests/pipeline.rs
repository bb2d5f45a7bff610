//! The sentence-transformers pipeline against sentence-transformers itself: each
//! folder of `tests/data/st-pipeline/` is a small random BERT (one an XLM-RoBERTa, one an MPNet) with a module list
//! (pooling in max, weightedmean, lasttoken, cls and concatenated modes, a `Dense`
//! layer with Tanh, `Normalize`, prompts with `include_prompt: false`; classic and
//! sentence-transformers 6 names), and its `reference.json` holds the embeddings
//! sentence-transformers 6.2 computed in float64 for a few texts, per prompt name
//! (both made by `scripts/make-fixtures.py`). The Embedder's vectors match them at
//! cosine ≥ 0.99999 with every element within 1e-5 (measured: cosine ≥ 0.9999999999997,
//! max abs error ≤ 9e-7; the states are f32, the reference
//! f64). Folders the engine cannot run exactly are refused with an error naming what.
#![cfg(feature = "text")]

use std::path::{Path, PathBuf};

use serde_json::Value;
use streamfuse::embedder::{EmbedError, Embedder, EmbedderSettings, TextOptions};
use streamfuse::models::bert::Pooling;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/st-pipeline")
        .join(name)
}

fn load(dir: &Path) -> Result<Embedder, EmbedError> {
    let settings = EmbedderSettings {
        workers: 1,
        idle_trim: None,
        ..EmbedderSettings::default()
    };
    Embedder::load_with(dir, settings)
}

/// The largest element error allowed (f32 states against float64).
const MAX_ABS: f64 = 1e-5;
/// The smallest cosine allowed.
const MIN_COS: f64 = 0.99999;

/// Embeds the fixture's texts for each reference case and checks them; returns the
/// embedder.
fn check(name: &str) -> Embedder {
    let dir = fixture(name);
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    assert_eq!(v["dtype"], "torch.float64");
    let texts: Vec<String> = v["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let e = load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    for case in v["cases"].as_array().unwrap() {
        let prompt_name = case["prompt_name"].as_str().map(str::to_string);
        let want: Vec<Vec<f64>> = case["embeddings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect()
            })
            .collect();
        // The reference is what sentence-transformers' encode gives without
        // normalize_embeddings: the module list's own output.
        let got = e
            .embed_with(
                &texts,
                &TextOptions {
                    prompt_name: prompt_name.clone(),
                    normalize: None,
                },
            )
            .unwrap()
            .vectors;
        assert_eq!(got.len(), want.len());
        let (mut min_cos, mut max_abs) = (1.0f64, 0.0f64);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len(), "{name}: width");
            assert_eq!(g.len(), e.dim(), "{name}: dim()");
            let dot: f64 = g.iter().zip(w).map(|(&a, &b)| f64::from(a) * b).sum();
            let ng = g.iter().map(|&a| f64::from(a).powi(2)).sum::<f64>().sqrt();
            let nw = w.iter().map(|b| b * b).sum::<f64>().sqrt();
            min_cos = min_cos.min(dot / (ng * nw));
            for (&a, &b) in g.iter().zip(w) {
                max_abs = max_abs.max((f64::from(a) - b).abs());
            }
        }
        eprintln!(
            "{name}, prompt {prompt_name:?}: min cosine {min_cos}, max abs error {max_abs:e}"
        );
        assert!(
            min_cos >= MIN_COS && max_abs <= MAX_ABS,
            "{name}, prompt {prompt_name:?}: min cosine {min_cos}, max abs error {max_abs}"
        );
    }
    e
}

#[test]
fn max_pooling_from_a_classic_module_list() {
    let e = check("max");
    assert_eq!(e.pooling(), [Pooling::Max]);
    assert!(!e.normalizes(), "no Normalize module");
}

#[test]
fn an_xlm_roberta_encoder_counts_positions_past_the_padding_id() {
    let e = check("xlm-roberta");
    assert_eq!(e.model().model_type(), "xlm-roberta");
    assert_eq!(
        e.model().bert().unwrap().config().position_offset,
        1,
        "pad_token_id 0, plus one"
    );
    assert!(e.normalizes());
}

#[test]
fn weighted_mean_pooling() {
    assert_eq!(check("weightedmean").pooling(), [Pooling::WeightedMean]);
}

#[test]
fn last_token_pooling() {
    assert_eq!(check("lasttoken").pooling(), [Pooling::LastToken]);
}

#[test]
fn a_dense_module_with_tanh() {
    let e = check("dense-tanh");
    assert_eq!(e.dim(), 16, "the Dense layer's width");
}

#[test]
fn cls_pooling_then_normalize() {
    let e = check("cls-normalize");
    assert!(e.normalizes());
    let v = e.embed(&["hello there"]).unwrap();
    let norm: f32 = v[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    // The caller's choice wins over the folder's.
    let raw = e
        .embed_with(
            &["hello there"],
            &TextOptions {
                normalize: Some(false),
                ..TextOptions::default()
            },
        )
        .unwrap();
    let n: f32 = raw.vectors[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((n - 1.0).abs() > 1e-3, "not normalised: {n}");
}

#[test]
fn several_pooling_modes_concatenated() {
    let e = check("concat");
    assert_eq!(e.pooling(), [Pooling::Cls, Pooling::Max, Pooling::Mean]);
    assert_eq!(e.dim(), 96);
}

#[test]
fn prompts_with_include_prompt_false() {
    let e = check("prompt");
    assert_eq!(e.prompts()["query"], "query: ");
    assert_eq!(e.default_prompt_name(), None);
    let err = e
        .embed_with(
            &["hello"],
            &TextOptions {
                prompt_name: Some("question".into()),
                ..TextOptions::default()
            },
        )
        .unwrap_err();
    assert!(err.is_input_error());
    let msg = err.to_string();
    assert!(msg.contains("`question`") && msg.contains("query"), "{msg}");
}

/// A copy of fixture `name` in a fresh temporary folder, with `edit` applied.
fn edited(name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let to = std::env::temp_dir().join(format!(
        "streamfuse-pipeline-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let dest = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &dest);
            } else {
                std::fs::copy(entry.path(), dest).unwrap();
            }
        }
    }
    copy(&fixture(name), &to);
    edit(&to);
    to
}

fn refusal(dir: &Path) -> String {
    match load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Replaces `from` with `to` in the file `path`.
fn replace(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{}: no {from}", path.display());
    std::fs::write(path, text.replace(from, to)).unwrap();
}

#[test]
fn an_unknown_module_is_refused_by_name() {
    let d = edited("cls-normalize", |d| {
        replace(
            &d.join("modules.json"),
            "sentence_transformers.base.modules.normalize.Normalize",
            "sentence_transformers.sentence_transformer.modules.layer_norm.LayerNorm",
        )
    });
    let m = refusal(&d);
    assert!(
        m.contains("layer_norm.LayerNorm") && m.contains("modules.json"),
        "{m}"
    );
}

#[test]
fn an_unknown_pooling_mode_is_refused_by_name() {
    let d = edited("weightedmean", |d| {
        replace(
            &d.join("1_Pooling/config.json"),
            "\"weightedmean\"",
            "\"attention\"",
        )
    });
    let m = refusal(&d);
    assert!(m.contains("attention") && m.contains("1_Pooling"), "{m}");
}

#[test]
fn an_unknown_activation_is_refused_by_name() {
    let d = edited("dense-tanh", |d| {
        replace(
            &d.join("2_Dense/config.json"),
            "torch.nn.modules.activation.Tanh",
            "torch.nn.modules.activation.Hardswish",
        )
    });
    let m = refusal(&d);
    assert!(m.contains("Hardswish") && m.contains("2_Dense"), "{m}");
}

#[test]
fn dense_weights_only_as_a_pickle_are_refused() {
    let d = edited("dense-tanh", |d| {
        std::fs::rename(
            d.join("2_Dense/model.safetensors"),
            d.join("2_Dense/pytorch_model.bin"),
        )
        .unwrap()
    });
    let m = refusal(&d);
    assert!(
        m.contains("pytorch_model.bin") && m.contains("pickle"),
        "{m}"
    );
}

#[test]
fn an_unknown_model_type_or_hidden_act_is_refused_by_name() {
    let d = edited("max", |d| {
        replace(
            &d.join("config.json"),
            "\"model_type\": \"bert\"",
            "\"model_type\": \"deberta-v2\"",
        )
    });
    let m = refusal(&d);
    assert!(m.contains("deberta-v2") && m.contains("model_type"), "{m}");
    let d = edited("max", |d| {
        replace(
            &d.join("config.json"),
            "\"hidden_act\": \"gelu\"",
            "\"hidden_act\": \"silu\"",
        )
    });
    let m = refusal(&d);
    assert!(m.contains("silu") && m.contains("hidden_act"), "{m}");
}

/// A vector's bits do not depend on the batch it ran in: every pooling mode gives
/// each text, embedded alone, the bits it gets among the others (the mean modes are
/// summed per sequence; a product over the whole batch's rows gave other bits).
#[test]
fn every_mode_gives_a_text_the_same_bits_alone_as_in_a_batch() {
    for name in [
        "max",
        "weightedmean",
        "lasttoken",
        "concat",
        "cls-normalize",
    ] {
        let dir = fixture(name);
        let e = load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Enough texts of enough lengths that the batch's rows run to the hundreds.
        let words = "the quick brown fox jumps over a lazy dog while it rains on the hills";
        let texts: Vec<String> = (0..48)
            .map(|i| {
                let n = 1 + (i * 7) % 15;
                words
                    .split(' ')
                    .cycle()
                    .skip(i)
                    .take(n)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let together = e.embed(&texts).unwrap();
        for (i, t) in texts.iter().enumerate() {
            let alone = e.embed(&[*t]).unwrap();
            let same = alone[0]
                .iter()
                .zip(&together[i])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{name}: text {i} alone differs from text {i} in a batch"
            );
        }
    }
}

#[test]
fn an_mpnet_encoder_adds_its_relative_position_bias() {
    // Its texts include one of 160 tokens, whose far keys share the last bucket.
    let e = check("mpnet");
    let cfg = e.model().bert().unwrap().config();
    assert_eq!(cfg.model_type, "mpnet");
    assert_eq!(cfg.relative_attention_num_buckets, 32);
    assert_eq!(
        cfg.position_offset, 2,
        "Hugging Face's padding id 1, plus one"
    );
    assert!(e.normalizes());
}

#[test]
fn a_modernbert_encoder_alternates_global_and_local_attention() {
    // Layers 0 and 2 global (rotary theta 160000), layer 1 within +-8 tokens (theta
    // 10000), GeGLU, norms without biases; its texts include one of 140 tokens.
    let e = check("modernbert");
    assert_eq!(e.model().model_type(), "modernbert");
    assert_eq!(e.pooling(), [Pooling::Mean]);
    assert!(e.normalizes());
}

#[test]
fn a_qwen3_decoder_pools_its_last_token_with_the_instruction_prompt() {
    // Causal attention, 4 query heads on 2 key/value heads, q/k norms, rotary
    // positions, SwiGLU; with and without the `query` prompt.
    let e = check("qwen3");
    assert_eq!(e.model().model_type(), "qwen3");
    assert_eq!(e.pooling(), [Pooling::LastToken]);
    assert!(e.prompts().contains_key("query"));
    assert!(e.normalizes());
}

#[test]
fn reduced_precisions_keep_their_contracts_on_every_family() {
    use streamfuse::models::Precision;
    // Precision's contracts: minimum cosine to the f32 embeddings.
    for name in [
        "cls-normalize",
        "xlm-roberta",
        "mpnet",
        "modernbert",
        "qwen3",
    ] {
        let dir = fixture(name);
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let texts: Vec<&str> = v["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        let at = |precision| {
            let settings = EmbedderSettings {
                workers: 1,
                idle_trim: None,
                precision,
                ..EmbedderSettings::default()
            };
            Embedder::load_with(&dir, settings)
                .unwrap()
                .embed(&texts)
                .unwrap()
        };
        let f32s = at(Precision::F32);
        for (precision, bound) in [
            (Precision::Bf16, 0.9999),
            (Precision::Int8, 0.99),
            (Precision::Bf16x3, 0.99999),
        ] {
            let got = at(precision);
            let min_cos = got
                .iter()
                .zip(&f32s)
                .map(|(a, b)| {
                    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x * y)).sum();
                    let n = |v: &[f32]| v.iter().map(|&x| f64::from(x * x)).sum::<f64>().sqrt();
                    dot / (n(a) * n(b))
                })
                .fold(1.0f64, f64::min);
            eprintln!("{name} {precision}: min cosine to f32 {min_cos}");
            assert!(min_cos >= bound, "{name} {precision}: {min_cos} < {bound}");
        }
    }
}
