//! What the server tests share (`tests/serve*.rs`, each of which also includes
//! `examples/common/server.rs` as `server` and `examples/common/http.rs` as `http`):
//! a runtime, starting a router on a loopback port, and reading OpenAI's error body.
#![allow(dead_code)]

use std::path::PathBuf;

use hyper::{Method, StatusCode};
use serde_json::Value;

use crate::{http, server};

/// A runtime of two threads for a test's server and client.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A running server: its `host:port`, what stops it, and its task.
pub struct Running {
    pub host: String,
    pub stop: tokio::sync::oneshot::Sender<()>,
    pub serving: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Stops the server and waits for it (at most 20 s).
    pub async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(20), self.serving)
            .await
            .expect("the server stops")
            .unwrap()
            .unwrap();
    }
}

/// Starts `router` on a loopback port.
pub async fn start(router: axum::Router) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server::serve(listener, router, async {
        let _ = stopped.await;
    }));
    Running {
        host,
        stop,
        serving,
    }
}

/// The message of OpenAI's error body, after checking the status (`want`) and the
/// body's shape.
pub fn error_message(status: StatusCode, body: &[u8], want: StatusCode) -> String {
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

/// POSTs `body` to `path` as JSON.
pub async fn post_json(
    c: &mut http::Conn,
    path: &str,
    body: Value,
) -> (StatusCode, hyper::body::Bytes) {
    c.request(Method::POST, path, body.to_string().into_bytes())
        .await
        .unwrap()
}

/// The reranker fixture (`scripts/gen-reranker-fixture.py`): a small random
/// `BertForSequenceClassification` CrossEncoder folder (its encoder also serves
/// embeddings: 64 tokens at most), and transformers' values.
pub fn rerank_fixture() -> (PathBuf, Value) {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let reference = std::fs::read_to_string(data.join("tiny-reranker-reference.json")).unwrap();
    (
        data.join("tiny-reranker"),
        serde_json::from_str(&reference).unwrap(),
    )
}
