//! `Reranker` against transformers: `tests/data/tiny-reranker` is a
//! `BertForSequenceClassification` initialised at random from a small config, saved as
//! a sentence-transformers CrossEncoder folder, and `tests/data/tiny-reranker-reference.json`
//! holds the token ids, token types, logits and sigmoid scores transformers computed for
//! its (query, document) pairs (both made by `scripts/gen-reranker-fixture.py`). Scores
//! match within 1e-5 and the order is the same; the pairs batch with each other as any
//! mix of requests; bad input is an error naming it.
#![cfg(feature = "text")]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use streamfuse::embedder::{
    EmbedError, EmbedderSettings, Reranker, ScoreActivation, Scores, Truncation,
};

/// The fixture's folder.
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-reranker")
}

/// One query of the reference and its documents' expected values.
struct Group {
    query: String,
    documents: Vec<String>,
    ids: Vec<Vec<u32>>,
    types: Vec<Vec<u32>>,
    logits: Vec<f64>,
    scores: Vec<f64>,
}

fn reference() -> Vec<Group> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-reranker-reference.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(v["activation"], "sigmoid");
    let ints = |x: &Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect()
    };
    v["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let pairs = g["pairs"].as_array().unwrap();
            let each = |f: &dyn Fn(&Value) -> f64| pairs.iter().map(f).collect::<Vec<f64>>();
            Group {
                query: g["query"].as_str().unwrap().to_string(),
                documents: pairs
                    .iter()
                    .map(|p| p["document"].as_str().unwrap().to_string())
                    .collect(),
                ids: pairs.iter().map(|p| ints(&p["input_ids"])).collect(),
                types: pairs.iter().map(|p| ints(&p["token_type_ids"])).collect(),
                logits: each(&|p| p["logit"].as_f64().unwrap()),
                scores: each(&|p| p["score"].as_f64().unwrap()),
            }
        })
        .collect()
}

fn settings(workers: usize, max_wait: Duration) -> EmbedderSettings {
    EmbedderSettings {
        workers,
        kernel_threads: 1,
        max_wait,
        ..Default::default()
    }
}

fn load() -> Reranker {
    Reranker::load_with(fixture(), settings(1, Duration::ZERO)).expect("the fixture loads")
}

/// The reference's order: indices by logit, descending.
fn reference_order(logits: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    order
}

fn assert_matches(got: &Scores, want: &Group, what: &str) {
    assert_eq!(got.logits.len(), want.logits.len(), "{what}");
    for i in 0..want.logits.len() {
        let (l, s) = (got.logits[i] as f64, got.scores[i] as f64);
        assert!(
            (l - want.logits[i]).abs() <= 1e-5,
            "{what}, document {i}: logit {l} against transformers' {}",
            want.logits[i]
        );
        assert!(
            (s - want.scores[i]).abs() <= 1e-5,
            "{what}, document {i}: score {s} against transformers' {}",
            want.scores[i]
        );
    }
    assert_eq!(
        got.ranking(),
        reference_order(&want.logits),
        "{what}: the order"
    );
    let tokens: usize = want.ids.iter().map(Vec::len).sum();
    assert_eq!(got.tokens, tokens, "{what}: tokens");
}

#[test]
fn pairs_are_tokenised_as_transformers_tokenises_them() {
    let r = load();
    assert_eq!(
        r.max_tokens(),
        64,
        "tokenizer_config.json's model_max_length"
    );
    assert_eq!(r.activation(), ScoreActivation::Sigmoid);
    for g in reference() {
        for (i, doc) in g.documents.iter().enumerate() {
            let (ids, types) = r.encode(i, &g.query, doc, Truncation::Right).unwrap();
            assert_eq!(ids, g.ids[i], "{:?} / {doc:?}: ids", g.query);
            assert_eq!(types, g.types[i], "{:?} / {doc:?}: types", g.query);
        }
    }
}

#[test]
fn scores_match_transformers_and_the_order_is_identical() {
    let r = load();
    let groups = reference();
    assert!(
        groups
            .iter()
            .any(|g| g.ids.iter().any(|ids| ids.len() == 64)),
        "a pair is cut"
    );
    for g in &groups {
        let got = r.score(&g.query, &g.documents).unwrap();
        assert_matches(&got, g, &g.query);
        // Each pair alone: the same scores.
        for (i, doc) in g.documents.iter().enumerate() {
            let one = r.score(&g.query, &[doc]).unwrap();
            assert!(
                (one.logits[0] - got.logits[i]).abs() <= 1e-5,
                "{:?} / {doc:?}: alone {} against batched {}",
                g.query,
                one.logits[0],
                got.logits[i]
            );
        }
        // Its tokens, as given: the same scores.
        let pairs = g.ids.iter().cloned().zip(g.types.iter().cloned()).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        r.submit_tokens(pairs, move |a| tx.send(a).unwrap())
            .unwrap();
        assert_matches(&rx.recv().unwrap().unwrap(), g, "token ids");
    }
}

#[test]
fn requests_from_many_threads_share_batches_and_keep_their_scores() {
    // Two workers that wait for batches to fill: requests of different callers mix.
    let r =
        Arc::new(Reranker::load_with(fixture(), settings(2, Duration::from_millis(20))).unwrap());
    let groups = Arc::new(reference());
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let (r, groups) = (Arc::clone(&r), Arc::clone(&groups));
            std::thread::spawn(move || {
                let g = &groups[t % groups.len()];
                let got = r.score(&g.query, &g.documents).unwrap();
                assert_matches(&got, g, &format!("thread {t}"));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn truncation_is_as_asked() {
    let r = load();
    let groups = reference();
    // The long document of the second query and the long query of the third.
    for g in &groups[1..] {
        let (i, _) = g
            .ids
            .iter()
            .enumerate()
            .find(|(_, ids)| ids.len() == 64)
            .unwrap();
        let doc = &g.documents[i];
        let e = r.encode(i, &g.query, doc, Truncation::Refuse).unwrap_err();
        assert!(
            matches!(e, EmbedError::TooLong { index, max: 64, tokens } if index == i && tokens > 64),
            "{e}"
        );
        assert!(e.is_input_error());
        let e = r
            .submit(&g.query, &g.documents, Truncation::Refuse, |_| {})
            .unwrap_err();
        assert!(e.to_string().contains("more than the model's 64"), "{e}");
        let (left, types) = r.encode(i, &g.query, doc, Truncation::Left).unwrap();
        assert_eq!(left.len(), 64);
        assert_eq!(types.len(), 64);
        assert_ne!(left, g.ids[i], "cut at the other end");
        assert_eq!(
            (left[0], left[63]),
            (g.ids[i][0], g.ids[i][63]),
            "[CLS] ... [SEP]"
        );
        let scored = r.score(&g.query, &[doc]).unwrap();
        assert!(scored.logits[0].is_finite());
    }
    // Short pairs are the same whatever the truncation.
    let g = &groups[0];
    for t in [Truncation::Left, Truncation::Refuse] {
        assert_eq!(
            r.encode(0, &g.query, &g.documents[0], t).unwrap().0,
            g.ids[0]
        );
    }
}

#[test]
fn bad_requests_are_errors_that_name_what_is_wrong() {
    let r = load();
    let docs = ["a document"];
    let err = |query: &str, documents: &[&str]| {
        r.submit(query, documents, Truncation::Right, |_| panic!("answered"))
            .unwrap_err()
    };
    assert_eq!(err("", &docs), EmbedError::EmptyQuery);
    assert_eq!(err(" \n\t", &docs), EmbedError::EmptyQuery);
    assert_eq!(err("query", &[]), EmbedError::NoDocuments);
    let many = vec!["d"; Reranker::MAX_DOCUMENTS + 1];
    let e = err("query", &many);
    assert_eq!(
        e,
        EmbedError::TooManyDocuments {
            count: Reranker::MAX_DOCUMENTS + 1,
            max: Reranker::MAX_DOCUMENTS
        }
    );
    for e in [EmbedError::EmptyQuery, EmbedError::NoDocuments, e] {
        assert!(e.is_input_error() && !e.to_string().is_empty());
    }
    // An empty document is scored, as transformers scores it.
    assert!(r.score("query", &[""]).unwrap().logits[0].is_finite());

    let tokens = |pairs: Vec<(Vec<u32>, Vec<u32>)>| {
        r.submit_tokens(pairs, |_| panic!("answered"))
            .unwrap_err()
            .to_string()
    };
    let vocab = r.model().config().vocab_size as u32;
    let e = tokens(vec![
        (vec![2, 5, 3], vec![0, 0, 0]),
        (vec![2, 5, 3], vec![0, 2, 1]),
    ]);
    assert!(
        e.contains("text 1") && e.contains("token type 2 at position 1"),
        "{e}"
    );
    let e = tokens(vec![(vec![2, 5, 3], vec![0, 1])]);
    assert!(e.contains("3 tokens but 2 token types"), "{e}");
    let e = tokens(vec![(vec![2, vocab, 3], vec![0, 0, 1])]);
    assert!(e.contains(&format!("token id {vocab}")), "{e}");
    let e = tokens(vec![(vec![], vec![])]);
    assert!(e.contains("0 tokens"), "{e}");
    let e = tokens(vec![(vec![2; 65], vec![0; 65])]);
    assert!(e.contains("65 tokens") && e.contains("1 to 64"), "{e}");
    let e = tokens(vec![]);
    assert!(e.contains("no documents"), "{e}");
}

/// A copy of the fixture in a temporary folder, with `config.json` changed by `edit`.
fn edited_copy(name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("streamfuse-rerank-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(fixture()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    dir
}

#[test]
fn folders_that_are_not_one_label_cross_encoders_are_refused_by_name() {
    let load_err = |dir: &Path| match Reranker::load_with(dir, settings(1, Duration::ZERO)) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    };
    let e = load_err(Path::new("/no/such/folder"));
    assert!(
        e.contains("not a folder") && e.contains("CrossEncoder"),
        "{e}"
    );

    let two = edited_copy("labels", |c| {
        c["id2label"] = serde_json::json!({"0": "no", "1": "yes"});
    });
    let e = load_err(&two);
    assert!(
        e.contains("classifier.weight") && e.contains("[1, 32]"),
        "{e}"
    );

    let unknown = edited_copy("activation", |c| {
        c["sentence_transformers"]["activation_fn"] = "torch.nn.modules.activation.Softmax".into();
    });
    let e = load_err(&unknown);
    assert!(e.contains("config.json") && e.contains("Softmax"), "{e}");

    // The older field names the activation when the newer one is absent.
    let identity = edited_copy("identity", |c| {
        c.as_object_mut().unwrap().remove("sentence_transformers");
        c["sbert_ce_default_activation_function"] = "torch.nn.modules.linear.Identity".into();
    });
    let r = Reranker::load_with(&identity, settings(1, Duration::ZERO)).unwrap();
    assert_eq!(r.activation(), ScoreActivation::Identity);
    let g = &reference()[0];
    let s = r.score(&g.query, &g.documents).unwrap();
    assert_eq!(s.scores, s.logits, "identity: the logits themselves");
    for d in [two, unknown, identity] {
        std::fs::remove_dir_all(d).unwrap();
    }
}
