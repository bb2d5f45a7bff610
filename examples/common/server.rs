//! The embeddings HTTP API over a shared [`Embedder`], in OpenAI's shapes, as an axum
//! router: `POST /v1/embeddings`, `GET /v1/models` and `GET /health`; with a
//! [`Reranker`], also `POST /v1/rerank` (Cohere's and Jina's shape) and `POST /rerank`
//! (Text Embeddings Inference's), in `rerank.rs`. Shared by `examples/serve.rs` (the
//! server) and `tests/serve.rs` (which answers it with a real HTTP client).
//!
//! `/v1/embeddings` takes what OpenAI's embeddings API takes: `input` as a string, a
//! list of strings, a list of token ids or a list of lists of them (ids of the served
//! model's own vocabulary, each sequence used as given, special tokens included, as
//! Text Embeddings Inference takes them); `encoding_format` `"float"` (the default) or
//! `"base64"` (each vector's f32 values as little-endian bytes, base64-encoded: what
//! the official Python client asks for unless told otherwise); `dimensions` (the
//! vector cut to its first `dimensions` values and L2-normalised again, as
//! sentence-transformers' `truncate_dim` then normalising does); `model` and `user`
//! (strings, not used).
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
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use streamfuse::embedder::{Embedder, Embeddings, Reranker};

#[path = "rerank.rs"]
mod rerank;

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
    /// The cross-encoder of the rerank routes, when one is loaded.
    reranker: Option<Arc<Reranker>>,
    /// Its name (its folder's), answered in `model` and listed by `/v1/models`.
    reranker_name: Arc<str>,
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
    let (reranker, reranker_name) = match reranker {
        Some((r, name)) => (Some(r), name.into()),
        None => (None, "".into()),
    };
    let app = App {
        embedder,
        model: model.into(),
        reranker,
        reranker_name,
    };
    let post_only = |path: &'static str| {
        move || async move { error(StatusCode::METHOD_NOT_ALLOWED, format!("{path} takes POST")) }
    };
    Router::new()
        .route(
            "/v1/embeddings",
            post(embeddings).fallback(post_only("/v1/embeddings")),
        )
        .route(
            "/v1/rerank",
            post(rerank::cohere).fallback(post_only("/v1/rerank")),
        )
        .route("/rerank", post(rerank::tei).fallback(post_only("/rerank")))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(one_model))
        .route(
            "/health",
            get(|| async { json_response(StatusCode::OK, &json!({"status": "ok"})) }),
        )
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such route; the API is POST /v1/embeddings, POST /v1/rerank, POST \
                 /rerank, GET /v1/models and GET /health"
                    .into(),
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

/// What one `/v1/embeddings` request asks for.
#[derive(Debug)]
struct Request {
    input: Input,
    encoding: Encoding,
    /// The leading values each vector is cut to (then normalised again).
    dimensions: Option<usize>,
}

/// A request's sequences: texts to tokenise, or token ids to use as given.
#[derive(Debug)]
enum Input {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

impl Input {
    fn len(&self) -> usize {
        match self {
            Input::Texts(t) => t.len(),
            Input::Ids(s) => s.len(),
        }
    }
}

/// How the vectors are written in the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    /// A JSON array of numbers (each f32's shortest form that reads back the same).
    Float,
    /// A string: the f32 values' little-endian bytes in base64 (standard alphabet,
    /// padded), as OpenAI sends them.
    Base64,
}

/// A token id of `input`, or what is wrong with it (`at` names where it is).
fn token_id(x: &Value, at: &str) -> Result<u32, String> {
    x.as_u64()
        .and_then(|id| u32::try_from(id).ok())
        .ok_or_else(|| format!("`{at}` must be a token id (an integer from 0), got {x}"))
}

/// The sequences of `input`: a string, a list of strings, a list of token ids (one
/// sequence) or a list of lists of token ids. A list is all strings or all token
/// ids, as OpenAI's API has it.
fn parse_input(input: &Value) -> Result<Input, String> {
    let items = match input {
        Value::String(s) => return Ok(Input::Texts(vec![s.clone()])),
        Value::Array(items) => items,
        other => {
            return Err(format!(
                "`input` must be a string, a list of strings, a list of token ids or a \
                 list of lists of token ids, got {other}"
            ))
        }
    };
    let input = match items.first() {
        None => return Err("`input` must hold at least one text".into()),
        Some(Value::String(_)) => Input::Texts(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_str().map(str::to_string).ok_or_else(|| {
                        format!("`input[{i}]` must be a string like `input[0]`, got {x}")
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(Value::Number(_)) => Input::Ids(vec![items
            .iter()
            .enumerate()
            .map(|(i, x)| token_id(x, &format!("input[{i}]")))
            .collect::<Result<_, _>>()?]),
        Some(Value::Array(_)) => Input::Ids(
            items
                .iter()
                .enumerate()
                .map(|(i, seq)| {
                    let seq = seq.as_array().ok_or_else(|| {
                        format!(
                            "`input[{i}]` must be a list of token ids like `input[0]`, got {seq}"
                        )
                    })?;
                    if seq.is_empty() {
                        return Err(format!("`input[{i}]` holds no token ids"));
                    }
                    seq.iter()
                        .enumerate()
                        .map(|(j, x)| token_id(x, &format!("input[{i}][{j}]")))
                        .collect()
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(other) => {
            return Err(format!(
                "`input[0]` must be a string, a token id or a list of token ids, got {other}"
            ))
        }
    };
    if input.len() > MAX_INPUTS {
        return Err(format!(
            "`input` holds {} sequences; at most {MAX_INPUTS} are allowed",
            input.len()
        ));
    }
    Ok(input)
}

/// A request body, or what is wrong with it (a 400). `dim` is the model's vector
/// width, which `dimensions` may not exceed.
fn parse_request(body: &[u8], dim: usize) -> Result<Request, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or("the body must be a JSON object with an `input` field")?;
    let input = parse_input(obj.get("input").ok_or("missing field `input`")?)?;
    for field in ["model", "user"] {
        if let Some(m) = obj.get(field).filter(|m| !m.is_string() && !m.is_null()) {
            return Err(format!("`{field}` must be a string, got {m}"));
        }
    }
    let encoding = match obj.get("encoding_format") {
        None | Some(Value::Null) => Encoding::Float,
        Some(Value::String(f)) if f == "float" => Encoding::Float,
        Some(Value::String(f)) if f == "base64" => Encoding::Base64,
        Some(other) => {
            return Err(format!(
                "`encoding_format` must be \"float\" or \"base64\", got {other}"
            ))
        }
    };
    let dimensions = match obj.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(d) => match d.as_u64() {
            Some(n) if (1..=dim as u64).contains(&n) => Some(n as usize),
            _ => {
                return Err(format!(
                    "`dimensions` must be an integer from 1 to {dim} (the model's \
                     dimension), got {d}"
                ))
            }
        },
    };
    Ok(Request {
        input,
        encoding,
        dimensions,
    })
}

/// `v` cut to its first `dimensions` values and L2-normalised (a zero vector stays
/// zero), or `v` itself when no cut is asked for.
fn truncated(v: &[f32], dimensions: Option<usize>) -> std::borrow::Cow<'_, [f32]> {
    let Some(d) = dimensions.filter(|&d| d < v.len()) else {
        return v.into();
    };
    let cut = &v[..d];
    let norm = cut.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        cut.iter().map(|&x| (x as f64 / norm) as f32).collect()
    } else {
        cut.into()
    }
}

/// Appends `v` to `out` as `encoding` writes it.
fn write_vector(out: &mut String, v: &[f32], encoding: Encoding) {
    match encoding {
        Encoding::Float => {
            out.push('[');
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
            out.push(']');
        }
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            out.push('"');
            out.push_str(&base64::encode(bytes));
            out.push('"');
        }
    }
}

/// The answer to `request`, OpenAI's list of embeddings.
fn embeddings_body(app: &App, request: &Request, emb: &Embeddings) -> String {
    let width = request.dimensions.unwrap_or(app.embedder.dim());
    let mut out = String::with_capacity(emb.vectors.len() * (width * 12 + 60) + 200);
    out.push_str(r#"{"object":"list","data":["#);
    for (i, v) in emb.vectors.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(r#"{"object":"embedding","index":"#);
        out.push_str(&i.to_string());
        out.push_str(r#","embedding":"#);
        write_vector(
            &mut out,
            &truncated(v, request.dimensions),
            request.encoding,
        );
        out.push('}');
    }
    out.push_str(r#"],"model":"#);
    out.push_str(&Value::from(&*app.model).to_string());
    out.push_str(&format!(
        r#","usage":{{"prompt_tokens":{0},"total_tokens":{0}}}}}"#,
        emb.tokens
    ));
    out
}

async fn embeddings(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rejection) => return error(rejection.status(), rejection.body_text()),
    };
    let request = match parse_request(&body, app.embedder.dim()) {
        Ok(r) => r,
        Err(msg) => return bad_request(msg),
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = move |r| {
        let _ = tx.send(r);
    };
    let queued = match &request.input {
        Input::Texts(texts) => app.embedder.submit(texts, done),
        Input::Ids(seqs) => app.embedder.submit_tokens(seqs.clone(), done),
    };
    if let Err(e) = queued {
        return bad_request(format!("`input`: {e}"));
    }
    match rx.await {
        Ok(Ok(emb)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            embeddings_body(&app, &request, &emb),
        )
            .into_response(),
        Ok(Err(e)) if e.is_input_error() => bad_request(format!("`input`: {e}")),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the embedder dropped the request".into(),
        ),
    }
}

/// A served model as OpenAI's model object.
fn model_object(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "streamfuse"})
}

/// The names of the served models: the embedder's, then the reranker's when loaded.
fn served(app: &App) -> Vec<&str> {
    let mut names = vec![&*app.model];
    if app.reranker.is_some() {
        names.push(&*app.reranker_name);
    }
    names
}

/// `GET /v1/models`: the models served.
async fn models(State(app): State<App>) -> Response {
    let data: Vec<Value> = served(&app).into_iter().map(model_object).collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: a served model, or a 404 naming what is served.
async fn one_model(State(app): State<App>, Path(id): Path<String>) -> Response {
    let names = served(&app);
    if names.contains(&id.as_str()) {
        json_response(StatusCode::OK, &model_object(&id))
    } else {
        error(
            StatusCode::NOT_FOUND,
            format!(
                "no model `{id}`; this server serves `{}`",
                names.join("` and `")
            ),
        )
    }
}
