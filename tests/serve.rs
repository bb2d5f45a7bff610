//! The embeddings server of `examples/serve.rs` (its router, `examples/common/server.rs`)
//! on a real socket, answered by a real HTTP client (hyper, `examples/common/http.rs`):
//! the OpenAI response shape and values, what OpenAI's official client sends (base64
//! by default, `dimensions`, token ids), `/v1/models`, `/health`, the 4xx paths with
//! their JSON error bodies, and a graceful shutdown; the rerank routes (Cohere's and
//! TEI's shapes) over the reranker fixture, against transformers' scores.
#![cfg(feature = "text")]

use std::sync::Arc;
use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use streamfuse::embedder::{Embedder, EmbedderSettings, Reranker};

#[path = "../examples/common/fetch.rs"]
mod fetch;
#[path = "../examples/common/http.rs"]
mod http;
#[path = "../examples/common/server.rs"]
mod server;
#[path = "support/serving.rs"]
mod serving;

use serving::{error_message, post_json, rerank_fixture, runtime, start};

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

async fn post(c: &mut http::Conn, body: Vec<u8>) -> (StatusCode, hyper::body::Bytes) {
    c.request(Method::POST, "/v1/embeddings", body)
        .await
        .unwrap()
}

#[test]
fn the_server_answers_a_real_http_client() {
    let dir = fetch::find_or_fetch_model(None).unwrap_or_else(|e| panic!("model: {e}"));
    let embedder = Arc::new(
        Embedder::load_with(
            &dir,
            EmbedderSettings {
                workers: 2,
                max_wait: Duration::ZERO,
                ..Default::default()
            },
        )
        .expect("load"),
    );
    let texts = ["The cat sits outside", "A man is playing guitar"];
    let want = embedder.embed_counted(&texts).unwrap();
    runtime().block_on(async {
        let router = server::router(Arc::clone(&embedder), "all-MiniLM-L6-v2");
        let serving::Running {
            host,
            stop,
            serving,
        } = start(router).await;
        let mut c = http::Conn::connect(&host).await.unwrap();

        // A list of texts: OpenAI's shape, the embedder's values.
        let body = json!({"input": texts, "model": "all-MiniLM-L6-v2"});
        let (status, resp) = post(&mut c, body.to_string().into_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        let v: Value = serde_json::from_slice(&resp).unwrap();
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], "all-MiniLM-L6-v2");
        assert_eq!(v["usage"]["prompt_tokens"], want.tokens);
        assert_eq!(v["usage"]["total_tokens"], want.tokens);
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        for (i, d) in data.iter().enumerate() {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            let e: Vec<f64> = d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(e.len(), 384);
            assert!(cosine(&want.vectors[i], &e) >= 0.99999);
        }
        // One string, no model.
        let (status, resp) = post(&mut c, br#"{"input": "The cat sits outside"}"#.to_vec()).await;
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_slice(&resp).unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 1);

        // What OpenAI's official Python client sends by default: base64, whose values
        // are the float route's to the last bit.
        let floats = |v: &Value| -> Vec<Vec<f32>> {
            let data = v["data"].as_array().unwrap();
            data.iter()
                .map(|d| {
                    let e = d["embedding"].as_array().expect("a float array");
                    e.iter().map(|x| x.as_f64().unwrap() as f32).collect()
                })
                .collect()
        };
        let body = json!({"input": texts, "model": "all-MiniLM-L6-v2", "encoding_format": "float"});
        let (_, resp) = post(&mut c, body.to_string().into_bytes()).await;
        let float = floats(&serde_json::from_slice(&resp).unwrap());
        let body = json!({"input": texts, "model": "all-MiniLM-L6-v2", "encoding_format": "base64", "user": "u-1"});
        let (status, resp) = post(&mut c, body.to_string().into_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        let v: Value = serde_json::from_slice(&resp).unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], want.tokens);
        for (i, d) in v["data"].as_array().unwrap().iter().enumerate() {
            assert_eq!(d["index"], i);
            let bytes = base64::decode(d["embedding"].as_str().expect("a base64 string")).unwrap();
            let e: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert_eq!(e.len(), 384);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&e), bits(&float[i]), "text {i}: base64 against float");
            assert_eq!(bits(&e), bits(&want.vectors[i]), "text {i}: base64 against the embedder");
        }

        // `dimensions`: the leading values, normalised again.
        let body = json!({"input": texts, "dimensions": 64});
        let (status, resp) = post(&mut c, body.to_string().into_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        for (i, e) in floats(&serde_json::from_slice(&resp).unwrap()).iter().enumerate() {
            assert_eq!(e.len(), 64);
            let full = &want.vectors[i][..64];
            let norm = full.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
            for (got, x) in e.iter().zip(full) {
                assert!((*got as f64 - *x as f64 / norm).abs() < 1e-6, "text {i}");
            }
        }
        let body = json!({"input": texts, "dimensions": 384, "encoding_format": "float"});
        let (_, resp) = post(&mut c, body.to_string().into_bytes()).await;
        assert_eq!(floats(&serde_json::from_slice(&resp).unwrap()), float);

        // Token ids of the model's own vocabulary: a list of lists, and one flat list.
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| embedder.tokenizer().encode(*t, true).unwrap().get_ids().to_vec())
            .collect();
        let (status, resp) = post(&mut c, json!({"input": ids}).to_string().into_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        let v: Value = serde_json::from_slice(&resp).unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], want.tokens);
        assert_eq!(floats(&v), float);
        let (status, resp) =
            post(&mut c, json!({"input": ids[1]}).to_string().into_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        assert_eq!(floats(&serde_json::from_slice(&resp).unwrap()), [float[1].clone()]);

        // 4xx paths, each with a JSON error body naming the problem.
        for (body, what) in [
            (&br#"{"input": ["a", "#[..], "not valid JSON"),
            (br#"[1, 2]"#, "JSON object"),
            (br#"{"model": "x"}"#, "missing field `input`"),
            (br#"{"input": 5}"#, "a list of strings"),
            (br#"{"input": ["ok", 7]}"#, "`input[1]` must be a string"),
            (br#"{"input": [101, "x"]}"#, "`input[1]` must be a token id"),
            (br#"{"input": [101, -3]}"#, "`input[1]` must be a token id"),
            (br#"{"input": [[101], [2.5]]}"#, "`input[1][0]` must be a token id"),
            (br#"{"input": [[101], 7]}"#, "`input[1]` must be a list of token ids"),
            (br#"{"input": [[101], []]}"#, "`input[1]` holds no token ids"),
            (br#"{"input": [[101, 99999999]]}"#, "outside the model's vocabulary"),
            (br#"{"input": [true]}"#, "`input[0]` must be"),
            (br#"{"input": "ok", "user": 5}"#, "`user` must be a string"),
            (br#"{"input": "ok", "dimensions": 0}"#, "from 1 to 384"),
            (br#"{"input": "ok", "dimensions": 385}"#, "from 1 to 384"),
            (br#"{"input": "ok", "dimensions": "64"}"#, "from 1 to 384"),
            (br#"{"input": []}"#, "at least one text"),
            (br#"{"input": ["ok", "  "]}"#, "text 1 is empty"),
            (
                br#"{"input": "ok", "model": 3}"#,
                "`model` must be a string",
            ),
            (
                br#"{"input": "ok", "encoding_format": "binary"}"#,
                "`encoding_format` must be \"float\" or \"base64\"",
            ),
        ] {
            let (status, resp) = post(&mut c, body.to_vec()).await;
            let m = error_message(status, &resp, StatusCode::BAD_REQUEST);
            assert!(m.contains(what), "{m} (wanted {what})");
        }
        let huge = format!(
            r#"{{"input": "{}"}}"#,
            "a ".repeat(server::MAX_BODY_BYTES / 2 + 10)
        );
        let (status, resp) = post(&mut c, huge.into_bytes()).await;
        let m = error_message(status, &resp, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(m.contains("length limit"), "{m}");

        // Other routes and methods, on a fresh connection.
        let mut c = http::Conn::connect(&host).await.unwrap();
        let (status, resp) = c.request(Method::GET, "/health", vec![]).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_slice::<Value>(&resp).unwrap()["status"],
            "ok"
        );
        let (status, resp) = c
            .request(Method::GET, "/v1/embeddings", vec![])
            .await
            .unwrap();
        error_message(status, &resp, StatusCode::METHOD_NOT_ALLOWED);
        let (status, resp) = c.request(Method::GET, "/nope", vec![]).await.unwrap();
        error_message(status, &resp, StatusCode::NOT_FOUND);
        let (status, resp) = c.request(Method::GET, "/v1/models", vec![]).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_slice(&resp).unwrap();
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][0]["id"], "all-MiniLM-L6-v2");
        assert_eq!(v["data"][0]["object"], "model");
        let (status, resp) = c
            .request(Method::GET, "/v1/models/all-MiniLM-L6-v2", vec![])
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_slice::<Value>(&resp).unwrap()["id"],
            "all-MiniLM-L6-v2"
        );
        let (status, resp) = c.request(Method::GET, "/v1/models/x", vec![]).await.unwrap();
        let m = error_message(status, &resp, StatusCode::NOT_FOUND);
        assert!(m.contains("serves `all-MiniLM-L6-v2`"), "{m}");

        // Graceful shutdown: the server returns once asked (connections closed).
        drop(c);
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(20), serving)
            .await
            .expect("the server stops")
            .unwrap()
            .unwrap();
    });
}

#[test]
fn the_rerank_routes_answer_in_cohere_and_tei_shapes() {
    let (dir, reference) = rerank_fixture();
    let settings = EmbedderSettings {
        workers: 1,
        max_wait: Duration::ZERO,
        ..Default::default()
    };
    // The cross-encoder's encoder serves embeddings too: no other model is needed.
    let embedder = Arc::new(Embedder::load_with(&dir, settings.clone()).unwrap());
    let reranker = Arc::new(Reranker::load_with(&dir, settings).unwrap());
    let group = &reference["queries"][0];
    let query = group["query"].as_str().unwrap();
    let pairs = group["pairs"].as_array().unwrap();
    let docs: Vec<&str> = pairs
        .iter()
        .map(|p| p["document"].as_str().unwrap())
        .collect();
    let logits: Vec<f64> = pairs.iter().map(|p| p["logit"].as_f64().unwrap()).collect();
    let scores: Vec<f64> = pairs.iter().map(|p| p["score"].as_f64().unwrap()).collect();
    let tokens: usize = pairs
        .iter()
        .map(|p| p["input_ids"].as_array().unwrap().len())
        .sum();
    let mut order: Vec<usize> = (0..docs.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));

    runtime().block_on(async {
        let router = server::router_with(
            Arc::clone(&embedder),
            "tiny-encoder",
            Some((Arc::clone(&reranker), "tiny-reranker")),
        );
        let serving::Running {
            host,
            stop,
            serving,
        } = start(router).await;
        let mut c = http::Conn::connect(&host).await.unwrap();

        // Cohere / Jina: every document, sorted, transformers' scores.
        let (status, resp) = post_json(
            &mut c,
            "/v1/rerank",
            json!({"query": query, "documents": docs, "model": "tiny-reranker"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        let v: Value = serde_json::from_slice(&resp).unwrap();
        assert_eq!(v["model"], "tiny-reranker");
        assert_eq!(v["usage"]["total_tokens"], tokens);
        let results = v["results"].as_array().unwrap();
        let got: Vec<usize> = results
            .iter()
            .map(|r| r["index"].as_u64().unwrap() as usize)
            .collect();
        assert_eq!(
            got, order,
            "sorted most relevant first, as transformers' logits are"
        );
        for r in results {
            let i = r["index"].as_u64().unwrap() as usize;
            let s = r["relevance_score"].as_f64().unwrap();
            assert!(
                (s - scores[i]).abs() <= 1e-5,
                "document {i}: {s} against {}",
                scores[i]
            );
            assert!(
                r.get("document").is_none(),
                "return_documents is false by default"
            );
        }
        // top_n, return_documents, documents as {"text"} objects.
        let objects: Vec<Value> = docs.iter().map(|d| json!({"text": d})).collect();
        let (status, resp) = post_json(
            &mut c,
            "/v1/rerank",
            json!({"query": query, "documents": objects, "top_n": 2, "return_documents": true}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        let v: Value = serde_json::from_slice(&resp).unwrap();
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        for (r, &i) in results.iter().zip(&order) {
            assert_eq!(r["index"], i);
            assert_eq!(r["document"]["text"], docs[i]);
        }
        let (_, resp) = post_json(
            &mut c,
            "/v1/rerank",
            json!({"query": query, "documents": docs, "top_n": 99}),
        )
        .await;
        let v: Value = serde_json::from_slice(&resp).unwrap();
        assert_eq!(v["results"].as_array().unwrap().len(), docs.len());

        // Text Embeddings Inference: a sorted array, the logit's sigmoid or the logit.
        let (status, resp) =
            post_json(&mut c, "/rerank", json!({"query": query, "texts": docs})).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        let ranks: Value = serde_json::from_slice(&resp).unwrap();
        let ranks = ranks.as_array().expect("an array");
        let got: Vec<usize> = ranks
            .iter()
            .map(|r| r["index"].as_u64().unwrap() as usize)
            .collect();
        assert_eq!(got, order);
        for r in ranks {
            let i = r["index"].as_u64().unwrap() as usize;
            assert!(
                (r["score"].as_f64().unwrap() - scores[i]).abs() <= 1e-5,
                "{r}"
            );
            assert!(r.get("text").is_none());
        }
        let (status, resp) = post_json(
            &mut c,
            "/rerank",
            json!({"query": query, "texts": docs, "raw_scores": true, "return_text": true,
                   "truncate": true, "truncation_direction": "Right"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        for r in serde_json::from_slice::<Value>(&resp)
            .unwrap()
            .as_array()
            .unwrap()
        {
            let i = r["index"].as_u64().unwrap() as usize;
            assert!(
                (r["score"].as_f64().unwrap() - logits[i]).abs() <= 1e-5,
                "{r}"
            );
            assert_eq!(r["text"], docs[i]);
        }
        // truncate: false refuses a pair over the model's length; left cuts it.
        let long_group = &reference["queries"][1];
        let long_query = long_group["query"].as_str().unwrap();
        let long_doc = long_group["pairs"][0]["document"].as_str().unwrap();
        let (status, resp) = post_json(
            &mut c,
            "/rerank",
            json!({"query": long_query, "texts": [long_doc], "truncate": false}),
        )
        .await;
        let m = error_message(status, &resp, StatusCode::BAD_REQUEST);
        assert!(
            m.contains("`texts`") && m.contains("more than the model's 64"),
            "{m}"
        );
        let (status, resp) = post_json(
            &mut c,
            "/rerank",
            json!({"query": long_query, "texts": [long_doc], "truncation_direction": "left"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));

        // Bad requests: 400 with OpenAI's error body naming the field.
        let many: Vec<&str> = vec!["d"; Reranker::MAX_DOCUMENTS + 1];
        for (path, body, what) in [
            (
                "/v1/rerank",
                json!({"documents": ["a"]}),
                "missing field `query`",
            ),
            (
                "/v1/rerank",
                json!({"query": "  ", "documents": ["a"]}),
                "`query`: the query is empty",
            ),
            (
                "/v1/rerank",
                json!({"query": 3, "documents": ["a"]}),
                "`query` must be a string",
            ),
            (
                "/v1/rerank",
                json!({"query": "q"}),
                "missing field `documents`",
            ),
            (
                "/v1/rerank",
                json!({"query": "q", "documents": []}),
                "no documents",
            ),
            (
                "/v1/rerank",
                json!({"query": "q", "documents": "a"}),
                "`documents` must be a list",
            ),
            (
                "/v1/rerank",
                json!({"query": "q", "documents": ["a", 5]}),
                "`documents[1]` must be a string",
            ),
            (
                "/v1/rerank",
                json!({"query": "q", "documents": [{"txt": "a"}]}),
                "`text` string",
            ),
            (
                "/v1/rerank",
                json!({"query": "q", "documents": many}),
                "at most 2048",
            ),
            (
                "/v1/rerank",
                json!({"query": "q", "documents": ["a"], "top_n": 0}),
                "`top_n` must be",
            ),
            (
                "/v1/rerank",
                json!({"query": "q", "documents": ["a"], "top_n": -1}),
                "`top_n` must be",
            ),
            (
                "/v1/rerank",
                json!({"query": "q", "documents": ["a"], "return_documents": "yes"}),
                "`return_documents` must be",
            ),
            (
                "/v1/rerank",
                json!({"query": "q", "documents": ["a"], "model": 1}),
                "`model` must be a string",
            ),
            ("/v1/rerank", json!(["q"]), "JSON object"),
            (
                "/rerank",
                json!({"query": "q", "documents": ["a"]}),
                "missing field `texts`",
            ),
            (
                "/rerank",
                json!({"query": "q", "texts": [{"text": "a"}]}),
                "`texts[0]` must be a string",
            ),
            (
                "/rerank",
                json!({"query": "q", "texts": ["a"], "raw_scores": 1}),
                "`raw_scores` must be",
            ),
            (
                "/rerank",
                json!({"query": "q", "texts": ["a"], "truncation_direction": "up"}),
                "`truncation_direction` must be",
            ),
            ("/rerank", json!({"query": "", "texts": ["a"]}), "`query`"),
        ] {
            let (status, resp) = post_json(&mut c, path, body.clone()).await;
            let m = error_message(status, &resp, StatusCode::BAD_REQUEST);
            assert!(m.contains(what), "{path} {body}: {m} (wanted {what})");
        }
        let (status, resp) = c
            .request(Method::POST, "/v1/rerank", b"{not json".to_vec())
            .await
            .unwrap();
        let m = error_message(status, &resp, StatusCode::BAD_REQUEST);
        assert!(m.contains("not valid JSON"), "{m}");
        let (status, resp) = c.request(Method::GET, "/v1/rerank", vec![]).await.unwrap();
        error_message(status, &resp, StatusCode::METHOD_NOT_ALLOWED);

        // Both models are listed.
        let (status, resp) = c.request(Method::GET, "/v1/models", vec![]).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_slice(&resp).unwrap();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["tiny-encoder", "tiny-reranker"]);
        let (status, _) = c
            .request(Method::GET, "/v1/models/tiny-reranker", vec![])
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        drop(c);
        stop.send(()).unwrap();
        serving.await.unwrap().unwrap();

        // Without a reranker the routes say how to load one.
        let serving::Running {
            host,
            stop,
            serving,
        } = start(server::router(Arc::clone(&embedder), "tiny-encoder")).await;
        let mut c = http::Conn::connect(&host).await.unwrap();
        for path in ["/v1/rerank", "/rerank"] {
            let body = json!({"query": "q", "documents": ["a"], "texts": ["a"]});
            let (status, resp) = c
                .request(Method::POST, path, body.to_string().into_bytes())
                .await
                .unwrap();
            let m = error_message(status, &resp, StatusCode::NOT_FOUND);
            assert!(
                m.contains("no reranker is loaded") && m.contains("--reranker"),
                "{m}"
            );
        }
        drop(c);
        stop.send(()).unwrap();
        serving.await.unwrap().unwrap();
    });
}
