//! The rerank routes of the server (`server.rs`), over a shared
//! [`Reranker`](streamfuse::embedder::Reranker):
//!
//! - `POST /v1/rerank`, Cohere's and Jina's shape: `{"query": str, "documents": [str |
//!   {"text": str}], "top_n"?: int, "return_documents"?: bool (false), "model"?: str}` →
//!   `{"model", "results": [{"index", "relevance_score", "document"?: {"text"}}],
//!   "usage": {"prompt_tokens", "total_tokens"}}`, most relevant first, the first
//!   `top_n` only when it is given. `relevance_score` is the CrossEncoder's score (its
//!   logit through the activation its config names: sigmoid by default). Pairs longer
//!   than the model takes are cut, as Cohere and Jina do.
//! - `POST /rerank`, Text Embeddings Inference's shape: `{"query": str, "texts": [str],
//!   "raw_scores"?: bool (false), "return_text"?: bool (false), "truncate"?: bool (true,
//!   TEI's `--auto-truncate` default), "truncation_direction"?: "right" | "left"}` →
//!   `[{"index", "score", "text"?}]`, most relevant first. As in TEI, `score` is the
//!   logit's sigmoid, or the logit itself with `raw_scores`; with `truncate: false` a
//!   pair longer than the model takes is a 400. The `x-compute-tokens` header counts
//!   the pairs' tokens, as TEI's does.
//!
//! Both are a 404 naming `--reranker` when the server has no reranker, and a 400 with
//! OpenAI's error body for a bad request (no query, no documents, too many, wrong
//! types).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use streamfuse::embedder::{EmbedError, Reranker, ScoreActivation, Scores, Truncation};

use super::metrics::Queue;
use super::{error, json_response, waiting, with_texts, App};

/// A request that cannot be answered (a 4xx, or a 500): its status and message, sent
/// as OpenAI's error body.
struct Refusal(StatusCode, String);

impl Refusal {
    /// A 400 saying `msg`.
    fn bad(msg: impl Into<String>) -> Refusal {
        Refusal(StatusCode::BAD_REQUEST, msg.into())
    }

    /// The error response.
    fn answer(self) -> Response {
        error(self.0, self.1)
    }
}

/// The reranker, or the 404 that says how to load one.
fn reranker(app: &App) -> Result<&Reranker, Refusal> {
    app.reranker.as_deref().ok_or_else(|| {
        Refusal(
            StatusCode::NOT_FOUND,
            "no reranker is loaded: start the server with --reranker DIR (a \
             sentence-transformers CrossEncoder folder)"
                .into(),
        )
    })
}

/// The body as a JSON object, or the 4xx saying why not.
fn object(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, Refusal> {
    let body = body.map_err(|rejection| Refusal(rejection.status(), rejection.body_text()))?;
    match serde_json::from_slice(&body) {
        Ok(Value::Object(obj)) => Ok(obj),
        Ok(_) => Err(Refusal::bad(
            "the body must be a JSON object with a `query` field",
        )),
        Err(e) => Err(Refusal::bad(format!("the body is not valid JSON: {e}"))),
    }
}

/// Field `name` of `obj` as `T`: its default when absent or null, else `get`'s
/// value, or a 400 saying it must be `what`.
fn field<'a, T>(
    obj: &'a Map<String, Value>,
    name: &str,
    what: &str,
    default: Option<T>,
    get: impl FnOnce(&'a Value) -> Option<T>,
) -> Result<T, Refusal> {
    match obj.get(name) {
        None | Some(Value::Null) => {
            default.ok_or_else(|| Refusal::bad(format!("missing field `{name}` ({what})")))
        }
        Some(v) => get(v).ok_or_else(|| Refusal::bad(format!("`{name}` must be {what}, got {v}"))),
    }
}

/// The documents of `list` (field `name`): strings, or (when `objects`) objects with a
/// `text` string.
fn documents(list: &[Value], name: &str, objects: bool) -> Result<Vec<String>, Refusal> {
    list.iter()
        .enumerate()
        .map(|(i, d)| match d {
            Value::String(s) => Ok(s.clone()),
            Value::Object(o) if objects => match o.get("text") {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(Refusal::bad(format!(
                    "`{name}[{i}]` must be a string or an object with a `text` string, got {d}"
                ))),
            },
            _ => Err(Refusal::bad(format!(
                "`{name}[{i}]` must be a string, got {d}"
            ))),
        })
        .collect()
}

/// What both routes take: the reranker, the body's fields, the query and the
/// documents.
struct Ask<'a> {
    reranker: &'a Reranker,
    obj: Map<String, Value>,
    query: String,
    docs: Vec<String>,
}

/// The reranker and the request of `body`, its documents in field `list` (strings,
/// or also `{"text"}` objects when `objects`), or the 4xx saying what is wrong.
fn ask<'a>(
    app: &'a App,
    body: Result<Bytes, BytesRejection>,
    list: &str,
    objects: bool,
) -> Result<Ask<'a>, Refusal> {
    let reranker = reranker(app)?;
    let obj = object(body)?;
    let query = field(&obj, "query", "a string", None, Value::as_str)?.to_string();
    let what = if objects {
        "a list of documents"
    } else {
        "a list of strings"
    };
    let docs = documents(
        field(&obj, list, what, None, Value::as_array)?,
        list,
        objects,
    )?;
    Ok(Ask {
        reranker,
        obj,
        query,
        docs,
    })
}

/// Scores `documents` for `query`, awaiting the reranker's workers; a library error
/// is a 400 when the request was at fault (naming `field`), a 503 for a full queue, a
/// 504 past the request timeout, else a 500.
async fn run(
    app: &App,
    reranker: &Reranker,
    query: &str,
    documents: &[String],
    truncation: Truncation,
    field: &str,
) -> Result<Scores, Refusal> {
    waiting::wait(app, Queue::Reranker, |done| {
        reranker.submit(query, documents, truncation, done)
    })
    .await
    .map_err(|f| match f.embed_error() {
        Some(e @ EmbedError::EmptyQuery) => Refusal::bad(format!("`query`: {e}")),
        _ => {
            let (status, message) = f.openai(field);
            Refusal(status, message)
        }
    })
}

/// `POST /v1/rerank`: Cohere's and Jina's rerank API.
pub(super) async fn cohere(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let mut count = 0;
    let answer = async {
        let Ask {
            reranker,
            obj,
            query,
            docs,
        } = ask(&app, body, "documents", true)?;
        count = docs.len();
        let top_n = field(
            &obj,
            "top_n",
            "a whole number of at least 1",
            Some(docs.len()),
            |v| v.as_u64().filter(|&n| n >= 1).map(|n| n as usize),
        )?;
        let return_documents = field(
            &obj,
            "return_documents",
            "true or false",
            Some(false),
            Value::as_bool,
        )?;
        field(&obj, "model", "a string", Some(""), Value::as_str)?;
        let scores = run(
            &app,
            reranker,
            &query,
            &docs,
            Truncation::Right,
            "documents",
        )
        .await?;
        let results: Vec<Value> = scores
            .ranking()
            .into_iter()
            .take(top_n)
            .map(|i| {
                let mut r = json!({"index": i, "relevance_score": scores.scores[i]});
                if return_documents {
                    r["document"] = json!({"text": docs[i]});
                }
                r
            })
            .collect();
        let usage = json!({"prompt_tokens": scores.tokens, "total_tokens": scores.tokens});
        Ok::<_, Refusal>(json_response(
            StatusCode::OK,
            &json!({"model": &*app.reranker_name, "results": results, "usage": usage}),
        ))
    };
    let response = answer.await.unwrap_or_else(Refusal::answer);
    with_texts(response, count)
}

/// `POST /rerank`: Text Embeddings Inference's rerank API.
pub(super) async fn tei(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    let mut count = 0;
    let answer = async {
        let ask = ask(&app, body, "texts", false)?;
        let (reranker, obj, query, texts) = (ask.reranker, ask.obj, ask.query, ask.docs);
        count = texts.len();
        let raw = field(
            &obj,
            "raw_scores",
            "true or false",
            Some(false),
            Value::as_bool,
        )?;
        let return_text = field(
            &obj,
            "return_text",
            "true or false",
            Some(false),
            Value::as_bool,
        )?;
        let truncate = field(
            &obj,
            "truncate",
            "true or false",
            Some(true),
            Value::as_bool,
        )?;
        let direction = field(
            &obj,
            "truncation_direction",
            "\"right\" or \"left\"",
            Some(Truncation::Right),
            |v| match v.as_str()? {
                "right" | "Right" => Some(Truncation::Right),
                "left" | "Left" => Some(Truncation::Left),
                _ => None,
            },
        )?;
        let truncation = if truncate {
            direction
        } else {
            Truncation::Refuse
        };
        let scores = run(&app, reranker, &query, &texts, truncation, "texts").await?;
        let ranks: Vec<Value> = scores
            .ranking()
            .into_iter()
            .map(|i| {
                let logit = scores.logits[i];
                let score = if raw {
                    logit
                } else {
                    ScoreActivation::Sigmoid.apply(logit)
                };
                let mut r = json!({"index": i, "score": score});
                if return_text {
                    r["text"] = json!(texts[i]);
                }
                r
            })
            .collect();
        Ok::<_, Refusal>(
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/json".to_string()),
                    (
                        header::HeaderName::from_static("x-compute-tokens"),
                        scores.tokens.to_string(),
                    ),
                ],
                Value::from(ranks).to_string(),
            )
                .into_response(),
        )
    };
    let response = answer.await.unwrap_or_else(Refusal::answer);
    with_texts(response, count)
}
