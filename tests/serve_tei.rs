//! Text Embeddings Inference's own routes of the embeddings server
//! (`examples/common/tei.rs`), on a loopback socket with a real HTTP client: `POST
//! /embed` (texts and token ids, `truncate`, `truncation_direction`, `dimensions`,
//! TEI's error shape and statuses) and `GET /info`. The model is the reranker
//! fixture's encoder (`tests/data/tiny-reranker`, 64 tokens at most), so that a long
//! text is easy to make.
#![cfg(feature = "text")]

use std::sync::Arc;
use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use streamfuse::embedder::{Embedder, EmbedderSettings};

#[path = "../examples/common/http.rs"]
mod http;
#[path = "../examples/common/server.rs"]
mod server;
#[path = "support/serving.rs"]
mod serving;

use serving::{rerank_fixture, runtime, start};

/// The bits of each vector.
fn bits(vectors: &[Vec<f32>]) -> Vec<Vec<u32>> {
    vectors
        .iter()
        .map(|v| v.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// `/embed`'s answer: `[[f32]]`.
fn vectors(body: &[u8]) -> Vec<Vec<f32>> {
    let v: Value = serde_json::from_slice(body).expect("JSON");
    v.as_array()
        .expect("an array of vectors")
        .iter()
        .map(|e| {
            e.as_array()
                .expect("a vector")
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

/// TEI's error body: checks the status and `error_type`, returns the message.
fn tei_error(status: StatusCode, body: &[u8], want: StatusCode, kind: &str) -> String {
    assert_eq!(status, want, "{}", String::from_utf8_lossy(body));
    let v: Value = serde_json::from_slice(body).expect("a JSON error body");
    assert_eq!(v["error_type"], kind, "{v}");
    v["error"].as_str().expect("a message").to_string()
}

#[test]
fn embed_and_info_answer_as_text_embeddings_inference_does() {
    let (dir, _) = rerank_fixture();
    let e = Arc::new(
        Embedder::load_with(
            &dir,
            EmbedderSettings {
                workers: 1,
                max_wait: Duration::ZERO,
                max_queue_tokens: Some(4096),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let texts = ["The cat sits outside", "A man is playing guitar"];
    let want = e.embed_counted(&texts).unwrap();
    let long: String = (0..80).map(|i| format!("word{i} ")).collect();
    let untruncated = {
        let mut t = e.tokenizer().clone();
        t.with_truncation(None).unwrap();
        t.encode(long.as_str(), true).unwrap().get_ids().to_vec()
    };
    assert!(
        untruncated.len() > 64,
        "the long text is longer than the model takes"
    );
    let n = untruncated.len();
    let left: Vec<u32> = [&[untruncated[0]][..], &untruncated[n - 63..]].concat();
    let want_left = {
        let (tx, rx) = std::sync::mpsc::channel();
        e.submit_tokens(vec![left], move |r| tx.send(r).unwrap())
            .unwrap();
        rx.recv().unwrap().unwrap().vectors
    };
    let want_long = e.embed(&[long.as_str()]).unwrap();

    runtime().block_on(async {
        let s = start(server::router(Arc::clone(&e), "tiny-encoder")).await;
        let mut c = http::Conn::connect(&s.host).await.unwrap();
        let mut post = async |body: Value| {
            c.send(Method::POST, "/embed", body.to_string().into_bytes(), &[])
                .await
                .unwrap()
        };

        // A list and one string: the embedder's vectors to the bit, TEI's header.
        let (status, h, body) = post(json!({"inputs": texts})).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        assert_eq!(bits(&vectors(&body)), bits(&want.vectors));
        assert_eq!(h["x-compute-tokens"], want.tokens.to_string());
        let (_, _, body) = post(json!({"inputs": texts[1], "normalize": true})).await;
        assert_eq!(bits(&vectors(&body)), bits(&want.vectors[1..]));
        // Token ids, used as given.
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| e.tokenizer().encode(*t, true).unwrap().get_ids().to_vec())
            .collect();
        let (_, _, body) = post(json!({ "inputs": ids })).await;
        assert_eq!(bits(&vectors(&body)), bits(&want.vectors));
        // `dimensions`: the leading values, normalised again.
        let (status, _, body) = post(json!({"inputs": texts, "dimensions": 8})).await;
        assert_eq!(status, StatusCode::OK);
        for (got, full) in vectors(&body).iter().zip(&want.vectors) {
            let norm = full[..8]
                .iter()
                .map(|&x| x as f64 * x as f64)
                .sum::<f64>()
                .sqrt();
            for (g, x) in got.iter().zip(&full[..8]) {
                assert!((*g as f64 - *x as f64 / norm).abs() < 1e-6);
            }
        }
        // `normalize: false`: the pooled states, whose direction is the vector's.
        let (status, _, body) = post(json!({"inputs": texts, "normalize": false})).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let raw = vectors(&body);
        for (r, unit) in raw.iter().zip(&want.vectors) {
            let norm = r.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
            assert!((norm - 1.0).abs() > 1e-3, "not normalised: norm {norm}");
            for (x, u) in r.iter().zip(unit) {
                assert!((*x as f64 / norm - *u as f64).abs() < 1e-6);
            }
        }
        let (_, _, body) =
            post(json!({"inputs": texts, "normalize": false, "dimensions": 5})).await;
        let cut = vectors(&body);
        for (c, r) in cut.iter().zip(&raw) {
            assert_eq!(c[..], r[..5], "the first values, not normalised again");
        }
        // A long text: cut at the end by default (as the OpenAI route does), refused
        // with `truncate: false`, cut at the start with `truncation_direction: left`.
        let (status, _, body) = post(json!({ "inputs": long })).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(bits(&vectors(&body)), bits(&want_long));
        let (status, _, body) = post(json!({"inputs": [long], "truncate": false})).await;
        let m = tei_error(
            status,
            &body,
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation",
        );
        assert_eq!(
            m,
            format!("`inputs` must have less than 64 tokens. Given: {n}")
        );
        let (status, _, body) =
            post(json!({"inputs": [long], "truncation_direction": "Left"})).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        assert_eq!(bits(&vectors(&body)), bits(&want_left));
        assert_ne!(bits(&want_left), bits(&want_long));

        // Errors in TEI's shape and statuses.
        let (status, _, body) = post(json!({"inputs": []})).await;
        tei_error(status, &body, StatusCode::BAD_REQUEST, "Empty");
        for (body, what) in [
            (json!({"text": "a"}), "missing field `inputs`"),
            (json!({"inputs": 5}), "`inputs` must be"),
            (json!({"inputs": ["a", 5]}), "`inputs[1]` must be a string"),
            (json!({"inputs": [""]}), "empty"),
            (
                json!({"inputs": [[2, 99999]]}),
                "outside the model's vocabulary",
            ),
            (
                json!({"inputs": "a", "normalize": 1}),
                "`normalize` must be true or false",
            ),
            (
                json!({"inputs": "a", "prompt_name": "query"}),
                "`prompt_name`",
            ),
            (json!({"inputs": "a", "dimensions": 0}), "from 1 to 32"),
            (
                json!({"inputs": "a", "truncation_direction": "up"}),
                "`truncation_direction`",
            ),
        ] {
            let (status, _, resp) = post(body.clone()).await;
            let kind = if what.contains("vocabulary") {
                "Tokenizer"
            } else {
                "Validation"
            };
            let m = tei_error(status, &resp, StatusCode::UNPROCESSABLE_ENTITY, kind);
            assert!(m.contains(what), "{body}: {m} (wanted {what})");
        }
        let (status, _, body) = c
            .send(Method::POST, "/embed", b"{nope".to_vec(), &[])
            .await
            .unwrap();
        let m = tei_error(status, &body, StatusCode::BAD_REQUEST, "Validation");
        assert!(m.contains("not valid JSON"), "{m}");
        let (status, _) = c.request(Method::GET, "/embed", vec![]).await.unwrap();
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

        // /info: TEI's fields, and the dimension.
        let (status, body) = c.request(Method::GET, "/info", vec![]).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        let info: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(info["model_id"], "tiny-encoder");
        assert_eq!(info["model_dtype"], "float32");
        assert_eq!(info["model_type"]["embedding"]["pooling"], "mean");
        assert_eq!(info["max_input_length"], 64);
        assert_eq!(info["max_batch_tokens"], e.settings().max_batch_tokens);
        assert_eq!(info["max_client_batch_size"], 2048);
        assert_eq!(info["auto_truncate"], true);
        assert_eq!(info["dimensions"], 32);
        assert_eq!(info["max_queue_tokens"], 4096);
        assert_eq!(info["workers"], 1);
        assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
        assert!(info["reranker"].is_null());
        drop(c);
        s.stop().await;
    });
}
