//! The embeddings server of `examples/serve.rs` (its router, `examples/common/server.rs`)
//! on a real socket, answered by a real HTTP client (hyper, `examples/common/http.rs`):
//! the OpenAI response shape and values, what OpenAI's official client sends (base64
//! by default, `dimensions`, token ids), `/v1/models`, `/health`, the 4xx paths with
//! their JSON error bodies, and a graceful shutdown.
#![cfg(feature = "text")]

use std::sync::Arc;
use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use streamfuse::embedder::{Embedder, EmbedderSettings};

#[path = "../examples/common/fetch.rs"]
mod fetch;
#[path = "../examples/common/http.rs"]
mod http;
#[path = "../examples/common/server.rs"]
mod server;

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The error body's message, after checking its shape.
fn error_message(status: StatusCode, body: &[u8], want: StatusCode) -> String {
    assert_eq!(status, want, "{}", String::from_utf8_lossy(body));
    let v: Value = serde_json::from_slice(body).expect("a JSON error body");
    let err = &v["error"];
    let kind = if want.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    assert_eq!(err["type"], kind, "{v}");
    err["message"].as_str().expect("a message").to_string()
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let router = server::router(Arc::clone(&embedder), "all-MiniLM-L6-v2");
        let serving = tokio::spawn(server::serve(listener, router, async {
            let _ = stopped.await;
        }));
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
