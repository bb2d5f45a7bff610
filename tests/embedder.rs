//! `Embedder` (feature `text`) on all-MiniLM-L6-v2, found or fetched as the examples
//! do: its vectors equal `BertModel::embed`'s whatever the batching, ragged batches
//! equal padded ones, concurrent callers get their own answers, a malformed request
//! fails alone, long texts are truncated, and bad folders and settings are named
//! errors.
#![cfg(feature = "text")]

use std::path::PathBuf;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::Duration;

use streamfuse::embedder::{EmbedError, Embedder, EmbedderSettings};
use streamfuse::models::bert::{Packing, Pooling};
use streamfuse::models::EmbedOptions;

#[path = "../examples/common/fetch.rs"]
mod fetch;

fn model_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| fetch::find_or_fetch_model(None).unwrap_or_else(|e| panic!("model: {e}")))
}

/// Small batches, one worker waiting long for them to fill: many batches of mixed
/// requests.
fn small_batches() -> &'static Embedder {
    static E: OnceLock<Embedder> = OnceLock::new();
    E.get_or_init(|| {
        Embedder::load_with(
            model_dir(),
            EmbedderSettings {
                workers: 1,
                max_batch_tokens: 256,
                max_wait: Duration::from_millis(20),
                ..Default::default()
            },
        )
        .expect("load")
    })
}

/// Two workers, large batches, no waiting.
fn large_batches() -> &'static Arc<Embedder> {
    static E: OnceLock<Arc<Embedder>> = OnceLock::new();
    E.get_or_init(|| {
        Arc::new(
            Embedder::load_with(
                model_dir(),
                EmbedderSettings {
                    workers: 2,
                    max_batch_tokens: 4096,
                    max_wait: Duration::ZERO,
                    ..Default::default()
                },
            )
            .expect("load"),
        )
    })
}

fn sentences() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/data/sentences-512.txt");
    std::fs::read_to_string(path)
        .expect("sentences file")
        .lines()
        .take(48)
        .map(str::to_string)
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let norm: f64 = g.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!(
            (norm - 1.0).abs() < 1e-4,
            "{what}: vector {i} has norm {norm}"
        );
        let c = cosine(g, w);
        assert!(c >= 0.99999, "{what}: vector {i} cosine {c}");
    }
}

/// `texts` tokenised by the embedder's tokenizer.
fn token_ids(e: &Embedder, texts: &[String]) -> Vec<Vec<u32>> {
    texts
        .iter()
        .map(|t| {
            e.tokenizer()
                .encode(t.as_str(), true)
                .unwrap()
                .get_ids()
                .to_vec()
        })
        .collect()
}

/// `BertModel::embed`'s vectors for `texts`, tokenised by the embedder's tokenizer.
fn reference(e: &Embedder, texts: &[String]) -> Vec<Vec<f32>> {
    let seqs = token_ids(e, texts);
    e.model()
        .bert()
        .unwrap()
        .embed(
            &seqs,
            &EmbedOptions {
                batch: 8,
                threads: 1,
                kernel_threads: None,
            },
        )
        .expect("reference")
}

#[test]
fn vectors_equal_bert_model_embed_whatever_the_batching() {
    let texts = sentences();
    let want = reference(small_batches(), &texts);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    // One request of everything, requests of 1..5 texts in a row, and the same from
    // four threads at once (sequences of several requests share batches).
    for (name, e) in [
        ("small batches", small_batches()),
        ("large batches", &**large_batches()),
    ] {
        assert_close(&e.embed(&refs).unwrap(), &want, name);
        let mut got = Vec::new();
        for chunk in refs.chunks(5) {
            got.extend(e.embed(chunk).unwrap());
        }
        assert_close(&got, &want, name);
        let parts: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = refs
                .chunks(12)
                .map(|chunk| s.spawn(move || e.embed(chunk).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_close(&parts.concat(), &want, name);
    }
}

#[test]
fn ragged_batches_equal_padded_ones() {
    let e = small_batches();
    let texts = sentences();
    let seqs = token_ids(e, &texts[..13]);
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let padded = e.model().bert().unwrap().embed_batch(&refs).unwrap();
    for packing in [Packing::Exact, Packing::Bucketed] {
        let packed = e
            .model()
            .bert()
            .unwrap()
            .embed_packed(&refs, Pooling::Mean, packing)
            .unwrap();
        assert_close(&packed, &padded, &format!("{packing:?}"));
    }
    // One sequence, and lengths 1 and 2.
    let tiny: [&[u32]; 3] = [&[101, 102], &[101], refs[3]];
    let padded = e.model().bert().unwrap().embed_batch(&tiny).unwrap();
    let packed = e
        .model()
        .bert()
        .unwrap()
        .embed_packed(&tiny, Pooling::Mean, Packing::Exact)
        .unwrap();
    assert_close(&packed, &padded, "tiny");
}

#[test]
fn sixteen_threads_at_once_get_their_own_answers() {
    let e = large_batches();
    let texts = sentences();
    let want = reference(e, &texts);
    let barrier = Arc::new(Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|t| {
            let (e, barrier) = (Arc::clone(e), Arc::clone(&barrier));
            // Thread t asks for 1 + t % 3 texts starting at 3t.
            let mine: Vec<String> = texts[3 * t..3 * t + 1 + t % 3].to_vec();
            std::thread::spawn(move || {
                barrier.wait();
                e.embed_counted(&mine).unwrap()
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        let got = h.join().unwrap();
        assert!(got.tokens >= 3 * got.vectors.len(), "thread {t}: {got:?}");
        assert_close(
            &got.vectors,
            &want[3 * t..3 * t + 1 + t % 3],
            &format!("thread {t}"),
        );
    }
}

#[test]
fn a_malformed_request_fails_alone() {
    let e = large_batches();
    let texts = sentences();
    let want = reference(e, &texts[..8]);
    let vocab = e.model().vocab_size() as u32;
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let (e, barrier) = (Arc::clone(e), Arc::clone(&barrier));
            let good = texts[t].clone();
            std::thread::spawn(move || {
                barrier.wait();
                match t {
                    1 => Err(e.embed(&[good.as_str(), "  "]).unwrap_err()),
                    3 => {
                        let (tx, rx) = std::sync::mpsc::channel();
                        let bad = vec![vec![101, 2000, 102], vec![101, vocab + 5, 102]];
                        let r = e.submit_tokens(bad, move |r| tx.send(r).unwrap());
                        assert!(rx.try_recv().is_err(), "no callback after a refusal");
                        Err(r.unwrap_err())
                    }
                    5 => {
                        let r = e.submit_tokens(vec![vec![101; 300]], |_| {});
                        Err(r.unwrap_err())
                    }
                    _ => Ok(e.embed(&[good.as_str()]).unwrap()),
                }
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        match (t, h.join().unwrap()) {
            (1, Err(err)) => {
                assert_eq!(err, EmbedError::EmptyText { index: 1 });
                assert!(err.to_string().contains("text 1 is empty"), "{err}");
            }
            (3, Err(err)) => {
                let m = err.to_string();
                assert!(m.contains("text 1") && m.contains("vocabulary"), "{m}");
            }
            (5, Err(err)) => assert!(err.to_string().contains("300 tokens"), "{err}"),
            (_, Ok(got)) => assert_close(&got, &want[t..t + 1], &format!("thread {t}")),
            (t, other) => panic!("thread {t}: {other:?}"),
        }
    }
    // The embedder is fine afterwards.
    assert_close(&e.embed(&[texts[0].as_str()]).unwrap(), &want[..1], "after");
}

#[test]
fn long_texts_are_truncated_to_the_models_maximum() {
    let e = small_batches();
    assert_eq!(
        e.max_tokens(),
        256,
        "sentence_bert_config.json's max_seq_length"
    );
    let long = sentences().join(" ");
    let got = e.embed_counted(&[long.as_str()]).unwrap();
    assert_eq!(got.tokens, 256);
    let ids = e
        .tokenizer()
        .encode(long.as_str(), true)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids.len(), 256);
    assert_eq!(*ids.last().unwrap(), 102, "[SEP] kept at the end");
    let want = e.model().bert().unwrap().embed_batch(&[&ids]).unwrap();
    assert_close(&got.vectors, &want, "truncated");
}

#[test]
fn empty_requests_and_callbacks() {
    let e = small_batches();
    assert!(e.embed(&[]).unwrap().is_empty());
    // A panicking callback does not take a worker down.
    e.submit(&["The cat sits outside"], |_| panic!("caller's bug"))
        .unwrap();
    assert_eq!(e.embed(&["The cat sits outside"]).unwrap().len(), 1);
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Embedder>();
}

#[test]
fn bad_folders_and_settings_are_named_errors() {
    let missing = std::env::temp_dir().join("streamfuse-no-model-folder");
    let e = Embedder::load(&missing).err().unwrap().to_string();
    assert!(
        e.contains("streamfuse-no-model-folder") && e.contains("not a folder"),
        "{e}"
    );
    // A folder with a config but no weights names the weights file.
    let dir = std::env::temp_dir().join(format!("streamfuse-half-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(model_dir().join("config.json"), dir.join("config.json")).unwrap();
    let e = Embedder::load(&dir).err().unwrap().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
    std::fs::write(dir.join("config.json"), "{ broken").unwrap();
    let e = Embedder::load(&dir).err().unwrap().to_string();
    assert!(e.contains("config.json") && e.contains("JSON"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
    for (settings, what) in [
        (
            EmbedderSettings {
                workers: 0,
                ..Default::default()
            },
            "workers",
        ),
        (
            EmbedderSettings {
                max_batch_tokens: 100,
                ..Default::default()
            },
            "max_batch_tokens 100",
        ),
    ] {
        let e = Embedder::load_with(model_dir(), settings).err().unwrap();
        assert!(e.to_string().contains(what), "{e}");
    }
}

/// An embedder with its weights in reduced precision answers within its precision's
/// contract of the f32 one (`models::Precision`), on the same texts.
#[test]
fn reduced_precision_embedders_stay_within_their_contract() {
    use streamfuse::models::{agreement, Precision};
    let texts = [
        "The cat sits outside",
        "A man is playing guitar",
        "The new movie is awesome",
        "Each sentence is converted into a vector of numbers",
        "Rust makes systems programming safer",
    ];
    let want = large_batches().embed(&texts).expect("f32");
    for (precision, min_cosine) in [(Precision::Bf16, 0.9999), (Precision::Int8, 0.99)] {
        let e = Embedder::load_with(
            model_dir(),
            EmbedderSettings {
                workers: 1,
                precision,
                ..Default::default()
            },
        )
        .expect("load");
        assert_eq!(e.model().precision(), precision);
        let got = e.embed(&texts).expect("embed");
        let a = agreement(&got, &want, 2);
        assert!(a.cosine.min >= min_cosine, "{precision}: {}", a.cosine);
    }
}

#[test]
fn token_ids_are_the_tokenizers_in_order_and_embed_as_submit_does() {
    // Two workers: 48 texts are tokenised in two parts, on two threads.
    let e = large_batches();
    let mut texts = sentences();
    texts[5] = String::new();
    texts[30] = "   ".into();
    let ids = e.token_ids(&texts).unwrap();
    assert_eq!(ids.len(), texts.len());
    for (got, text) in ids.iter().zip(&texts) {
        let want = e.tokenizer().encode(text.as_str(), true).unwrap();
        assert_eq!(got, want.get_ids(), "{text:?}");
    }
    // An empty text is its special tokens alone (what sentence-transformers embeds).
    assert_eq!(ids[5], [101, 102]);
    // The rest embed as `embed` embeds them.
    let (tx, rx) = std::sync::mpsc::channel();
    let kept: Vec<Vec<u32>> = [0, 1, 40].map(|i| ids[i].clone()).to_vec();
    e.submit_tokens(kept, move |r| tx.send(r).unwrap()).unwrap();
    let got = rx.recv().unwrap().unwrap().vectors;
    let want = e
        .embed(&[&texts[0], &texts[1], &texts[40]].map(String::as_str))
        .unwrap();
    assert_close(&got, &want, "token_ids then submit_tokens");
}
