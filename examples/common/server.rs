//! The embeddings HTTP API over a shared [`Embedder`] as an axum router. Shared by
//! `examples/serve.rs` (the server) and the tests that answer it with a real HTTP
//! client (`tests/serve.rs`, `tests/serve_load.rs`). One file a job:
//!
//! - `openai.rs`: `POST /v1/embeddings` in OpenAI's shape (texts or token ids,
//!   `encoding_format` float or base64, `dimensions`), `GET /v1/models[/{id}]`;
//! - `rerank.rs`: with a [`Reranker`], `POST /v1/rerank` (Cohere's and Jina's shape)
//!   and `POST /rerank` (Text Embeddings Inference's);
//! - `tei.rs`: Text Embeddings Inference's own `POST /embed` and `GET /info`;
//! - `metrics.rs`: `GET /metrics` in Prometheus' text format, and the layer that counts
//!   every request;
//! - `auth.rs`: `--api-key`, checked on every route but `/health`;
//! - `waiting.rs`: handing a request to the embedder and awaiting its answer, bounded
//!   by `--request-timeout`, withdrawing it from the queue when the client goes away.
//!
//! This file owns the router, what the handlers share ([`App`]), the server's options
//! ([`Options`]) and OpenAI's error body, `{"error": {"message", "type", "param",
//! "code"}}`, which every route but TEI's `/embed` answers errors with. Inference
//! never runs on the async runtime's threads: the embedder's worker threads do the
//! forward passes.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use streamfuse::embedder::{Embedder, Reranker};

#[path = "auth.rs"]
pub mod auth;
#[path = "metrics.rs"]
pub mod metrics;
#[path = "openai.rs"]
mod openai;
#[path = "rerank.rs"]
mod rerank;
#[path = "tei.rs"]
mod tei;
#[path = "waiting.rs"]
mod waiting;

pub use auth::ApiKey;

/// The largest request body accepted (1 MiB); larger ones get 413.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// The most texts one request may hold (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;
/// The `Retry-After` (seconds) of a 503 or 429 for a full queue.
pub const RETRY_AFTER_SECS: u64 = 1;

/// How the server treats requests, beside the embedder's own settings. Its `Debug`
/// never shows the API key.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// When set, every route but `/health` needs `Authorization: Bearer KEY`.
    pub api_key: Option<ApiKey>,
    /// A request not answered within this long gets a 504 and leaves the queue.
    pub request_timeout: Option<Duration>,
}

/// The startup line naming the options (`max_queue_tokens` is the embedder's): the
/// API key shows as `<redacted>`, never as itself.
pub fn describe(options: &Options, max_queue_tokens: Option<usize>) -> String {
    let limit = |v: Option<String>| v.unwrap_or_else(|| "none".into());
    format!(
        "api key: {}; request timeout: {}; max queue tokens: {}",
        limit(options.api_key.as_ref().map(ApiKey::to_string)),
        limit(
            options
                .request_timeout
                .map(|t| format!("{} ms", t.as_millis()))
        ),
        limit(max_queue_tokens.map(|n| n.to_string())),
    )
}

/// What the router serves: the embedder and its name, the reranker and its name
/// when one is loaded, and the options.
pub struct Config {
    /// The embedding model.
    pub embedder: Arc<Embedder>,
    /// The name answered in `model` (the model folder's name).
    pub model: String,
    /// The cross-encoder of the rerank routes and its name, when one is loaded.
    pub reranker: Option<(Arc<Reranker>, String)>,
    /// How requests are treated.
    pub options: Options,
}

/// What the handlers share.
#[derive(Clone)]
pub struct App {
    embedder: Arc<Embedder>,
    /// The name answered in `model` (the model folder's name).
    model: Arc<str>,
    /// The cross-encoder of the rerank routes, when one is loaded.
    reranker: Option<Arc<Reranker>>,
    /// Its name (its folder's), answered in `model` and listed by `/v1/models`.
    reranker_name: Arc<str>,
    /// The Prometheus registry behind `/metrics`.
    metrics: Arc<metrics::Metrics>,
    /// `Options::request_timeout`.
    request_timeout: Option<Duration>,
    /// The embedder's tokenizer without truncation (TEI's `truncate: false`).
    untruncated: Arc<tokenizers::Tokenizer>,
}

/// The API's routes over `embedder`; `model` is the name given back in responses. The
/// rerank routes answer 404 (no reranker loaded).
pub fn router(embedder: Arc<Embedder>, model: &str) -> Router {
    router_with(embedder, model, None)
}

/// [`router`], with the rerank routes served by `reranker` (the reranker and its
/// model name) when given.
pub fn router_with(
    embedder: Arc<Embedder>,
    model: &str,
    reranker: Option<(Arc<Reranker>, &str)>,
) -> Router {
    build(Config {
        embedder,
        model: model.into(),
        reranker: reranker.map(|(r, n)| (r, n.to_string())),
        options: Options::default(),
    })
}

/// The router of `config`. Its metrics observe the embedder's and the reranker's
/// batches (replacing any observer they had).
pub fn build(config: Config) -> Router {
    let (reranker, reranker_name) = match config.reranker {
        Some((r, name)) => (Some(r), name.into()),
        None => (None, "".into()),
    };
    let metrics = Arc::new(metrics::Metrics::new(&config.embedder, reranker.as_ref()));
    let mut untruncated = config.embedder.tokenizer().clone();
    untruncated
        .with_truncation(None)
        .expect("turning truncation off cannot fail");
    let app = App {
        embedder: config.embedder,
        model: config.model.into(),
        reranker,
        reranker_name,
        metrics: Arc::clone(&metrics),
        request_timeout: config.options.request_timeout,
        untruncated: Arc::new(untruncated),
    };
    let post_only = |path: &'static str| {
        move || async move { error(StatusCode::METHOD_NOT_ALLOWED, format!("{path} takes POST")) }
    };
    let mut guarded = Router::new()
        .route(
            "/v1/embeddings",
            post(openai::embeddings).fallback(post_only("/v1/embeddings")),
        )
        .route(
            "/v1/rerank",
            post(rerank::cohere).fallback(post_only("/v1/rerank")),
        )
        .route("/rerank", post(rerank::tei).fallback(post_only("/rerank")))
        .route("/embed", post(tei::embed).fallback(post_only("/embed")))
        .route("/info", get(tei::info))
        .route("/metrics", get(metrics::scrape))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::one_model));
    if let Some(key) = config.options.api_key {
        guarded = guarded.route_layer(axum::middleware::from_fn_with_state(
            Arc::new(key),
            auth::require_key,
        ));
    }
    guarded
        .route(
            "/health",
            get(|| async { json_response(StatusCode::OK, &json!({"status": "ok"})) }),
        )
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such route; the API is POST /v1/embeddings, POST /v1/rerank, POST \
                 /rerank, POST /embed, GET /info, GET /v1/models, GET /metrics and GET \
                 /health"
                    .into(),
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            metrics,
            metrics::count_request,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

/// Serves `router` on `listener` until `shutdown` completes, then finishes the
/// requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// `body` as a JSON response with `status`.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// OpenAI's error body: `type` is `invalid_request_error` for a 4xx, `server_error`
/// otherwise. A 503 (a full queue) carries `Retry-After`.
pub(crate) fn error(status: StatusCode, message: String) -> Response {
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    let mut response = json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "param": null, "code": null}}),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, RETRY_AFTER_SECS.into());
    }
    response
}

/// A 400 in OpenAI's shape.
fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, message.into())
}

/// The number of texts (or documents) a handler answered, for the request counter:
/// handlers put it in their response's extensions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Texts(pub usize);

/// `response` with its [`Texts`] count.
pub(crate) fn with_texts(mut response: Response, texts: usize) -> Response {
    response.extensions_mut().insert(Texts(texts));
    response
}
