//! The embeddings server of `examples/serve.rs` (its router, `examples/common/server.rs`)
//! on a real socket, answered by a real HTTP client (hyper, `examples/common/http.rs`):
//! the OpenAI response shape and values, `/health`, the 4xx paths with their JSON
//! error bodies, and a graceful shutdown.
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

        // 4xx paths, each with a JSON error body naming the problem.
        for (body, what) in [
            (&br#"{"input": ["a", "#[..], "not valid JSON"),
            (br#"[1, 2]"#, "JSON object"),
            (br#"{"model": "x"}"#, "missing field `input`"),
            (br#"{"input": 5}"#, "string or a list of strings"),
            (br#"{"input": ["ok", 7]}"#, "`input[1]` must be a string"),
            (br#"{"input": []}"#, "at least one text"),
            (br#"{"input": ["ok", "  "]}"#, "text 1 is empty"),
            (
                br#"{"input": "ok", "model": 3}"#,
                "`model` must be a string",
            ),
            (
                br#"{"input": "ok", "encoding_format": "base64"}"#,
                "encoding_format",
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
