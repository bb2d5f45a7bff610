//! The embeddings HTTP API over a shared [`Embedder`], in OpenAI's shapes, as an axum
//! router: `POST /v1/embeddings` and `GET /health`. Shared by `examples/serve.rs` (the
//! server) and `tests/serve.rs` (which answers it with a real HTTP client).
//!
//! Inference never runs on the async runtime's threads: a handler tokenises, hands the
//! texts to the embedder's queue with a callback that completes a oneshot channel,
//! and awaits it; the embedder's worker threads do the forward passes. Every error is
//! a 4xx or 5xx with OpenAI's JSON error body,
//! `{"error": {"message", "type", "param", "code"}}`.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use streamfuse::embedder::{EmbedError, Embedder};

/// The largest request body accepted (1 MiB); larger ones get 413.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// The most texts one request may hold (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// What the handlers share.
#[derive(Clone)]
struct App {
    embedder: Arc<Embedder>,
    /// The name answered in `model` (the model folder's name).
    model: Arc<str>,
}

/// The API's routes over `embedder`; `model` is the name given back in responses.
pub fn router(embedder: Arc<Embedder>, model: &str) -> Router {
    let app = App {
        embedder,
        model: model.into(),
    };
    Router::new()
        .route(
            "/v1/embeddings",
            post(embeddings).fallback(|| async {
                error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "/v1/embeddings takes POST".into(),
                )
            }),
        )
        .route(
            "/health",
            get(|| async { json_response(StatusCode::OK, &json!({"status": "ok"})) }),
        )
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such route; the API is POST /v1/embeddings and GET /health".into(),
            )
        })
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

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// OpenAI's error body: `type` is `invalid_request_error` for a 4xx, `server_error`
/// otherwise.
fn error(status: StatusCode, message: String) -> Response {
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "param": null, "code": null}}),
    )
}

fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, message.into())
}

/// The texts of a request body, or what is wrong with it (a 400).
fn parse_request(body: &[u8]) -> Result<Vec<String>, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or("the body must be a JSON object with an `input` field")?;
    let texts = match obj.get("input") {
        None => return Err("missing field `input`".into()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    format!(
                        "`input[{i}]` must be a string (token arrays are not supported), got {x}"
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(format!(
                "`input` must be a string or a list of strings, got {other}"
            ))
        }
    };
    if texts.is_empty() {
        return Err("`input` must hold at least one text".into());
    }
    if texts.len() > MAX_INPUTS {
        return Err(format!(
            "`input` holds {} texts; at most {MAX_INPUTS} are allowed",
            texts.len()
        ));
    }
    if let Some(m) = obj.get("model").filter(|m| !m.is_string()) {
        return Err(format!("`model` must be a string, got {m}"));
    }
    match obj.get("encoding_format") {
        None | Some(Value::Null) => Ok(texts),
        Some(Value::String(f)) if f == "float" => Ok(texts),
        Some(other) => Err(format!(
            "`encoding_format` {other} is not supported (only \"float\")"
        )),
    }
}

async fn embeddings(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rejection) => return error(rejection.status(), rejection.body_text()),
    };
    let texts = match parse_request(&body) {
        Ok(t) => t,
        Err(msg) => return bad_request(msg),
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    if let Err(e) = app.embedder.submit(&texts, move |r| {
        let _ = tx.send(r);
    }) {
        return bad_request(format!("`input`: {e}"));
    }
    match rx.await {
        Ok(Ok(emb)) => {
            let mut out = String::with_capacity(emb.vectors.len() * app.embedder.dim() * 12 + 200);
            out.push_str(r#"{"object":"list","data":["#);
            for (i, v) in emb.vectors.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(r#"{"object":"embedding","index":"#);
                out.push_str(&i.to_string());
                out.push_str(r#","embedding":["#);
                for (j, x) in v.iter().enumerate() {
                    if j > 0 {
                        out.push(',');
                    }
                    // f32's shortest form that reads back the same value.
                    if x.is_finite() {
                        out.push_str(&x.to_string());
                    } else {
                        out.push_str("null");
                    }
                }
                out.push_str("]}");
            }
            out.push_str(r#"],"model":"#);
            out.push_str(&Value::from(&*app.model).to_string());
            out.push_str(&format!(
                r#","usage":{{"prompt_tokens":{0},"total_tokens":{0}}}}}"#,
                emb.tokens
            ));
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                out,
            )
                .into_response()
        }
        Ok(Err(e @ (EmbedError::EmptyText { .. } | EmbedError::Tokenize { .. }))) => {
            bad_request(format!("`input`: {e}"))
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the embedder dropped the request".into(),
        ),
    }
}
