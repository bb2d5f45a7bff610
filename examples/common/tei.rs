//! Text Embeddings Inference's own routes, for users moving from it:
//!
//! - `POST /embed`: `{"inputs": str | [str] | [int] | [[int]], "normalize"?: bool
//!   (true; false gives the pooled states as they are), "truncate"?: bool (true: this
//!   server truncates as `--auto-truncate` does), "truncation_direction"?: "right" |
//!   "left" ("right"), "dimensions"?: int, "prompt_name"?: str}` → `[[f32]]`, one
//!   vector per input, with TEI's `x-compute-tokens` header. `dimensions` cuts each
//!   vector to its first values (normalised again when `normalize`). Token ids are used as given. With `truncate:
//!   false` an input longer than the model takes is refused; `"left"` keeps its end
//!   (the first and last special tokens kept, as the tokenizer's left truncation does
//!   for a one-text template such as BERT's `[CLS] ... [SEP]`). `prompt_name` names a
//!   prompt of the model's `config_sentence_transformers.json`, put before each text
//!   (absent or null: the model's default prompt, if any); a prompt is only put
//!   before texts truncated on the right (the default), and refused otherwise.
//! - `GET /info`: TEI's `Info` (`model_id`, `model_dtype`, `model_type` with the
//!   pooling, `max_input_length`, `max_batch_tokens`, `max_client_batch_size`,
//!   `auto_truncate`, `version`, ...), `max_concurrent_requests` null (this server
//!   bounds its queue in tokens instead), and what TEI does not report: `dimensions`,
//!   `max_queue_tokens`, `workers`, and the reranker when one is loaded.
//!
//! `/embed` answers errors in TEI's shape, `{"error": str, "error_type": str}`, with
//! TEI's statuses: 400 `Empty` (no inputs), 413 when the body is over 1 MiB, 422
//! `Validation` or `Tokenizer` (a bad field, an empty or too long input), 429
//! `Overloaded` with `Retry-After` (a full queue: TEI's status for it, where the
//! OpenAI routes answer 503), 424 `Backend` (the batch failed; OpenAI's routes say 500)
//! and 504 `Backend` past `--request-timeout`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use streamfuse::embedder::{EmbedError, TextOptions};
use streamfuse::models::bert::Pooling;

use super::metrics::Queue;
use super::openai::{
    dimensions, parse_input, prompt_name, truncated, write_vector, Encoding, Input,
};
use super::waiting::{self, Failure};
use super::{json_response, with_texts, App, MAX_INPUTS, RETRY_AFTER_SECS};

/// A refused request: its status, TEI's `error_type` and the message.
struct TeiError(StatusCode, &'static str, String);

impl TeiError {
    /// TEI's error body, `{"error", "error_type"}`; a 429 carries `Retry-After`.
    fn answer(self) -> Response {
        let TeiError(status, kind, message) = self;
        let mut r = json_response(status, &json!({"error": message, "error_type": kind}));
        if status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, RETRY_AFTER_SECS.into());
        }
        r
    }
}

/// A `status` answer of `kind`.
fn tei_error(status: StatusCode, kind: &'static str, message: impl Into<String>) -> TeiError {
    TeiError(status, kind, message.into())
}

/// A 422 `Validation`.
fn invalid(message: impl Into<String>) -> TeiError {
    tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation", message)
}

/// What an `/embed` request asks for.
struct Embed {
    input: Input,
    normalize: bool,
    truncate: bool,
    left: bool,
    dimensions: Option<usize>,
    /// The prompt asked for (`None`: the model's default, if any).
    prompt_name: Option<String>,
}

/// Field `name` of `obj` as a boolean, `default` when absent or null.
fn flag(obj: &Map<String, Value>, name: &str, default: bool) -> Result<bool, TeiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(invalid(format!("`{name}` must be true or false, got {v}"))),
    }
}

/// The request of `body`, or TEI's error response.
fn parse(body: Result<Bytes, BytesRejection>, dim: usize) -> Result<Embed, TeiError> {
    let body = body.map_err(|r| tei_error(r.status(), "Validation", r.body_text()))?;
    let obj = match serde_json::from_slice(&body) {
        Ok(Value::Object(obj)) => obj,
        Ok(_) => {
            return Err(invalid(
                "the body must be a JSON object with an `inputs` field",
            ))
        }
        Err(e) => {
            return Err(tei_error(
                StatusCode::BAD_REQUEST,
                "Validation",
                format!("the body is not valid JSON: {e}"),
            ))
        }
    };
    let inputs = obj
        .get("inputs")
        .ok_or_else(|| invalid("missing field `inputs`"))?;
    if inputs.as_array().is_some_and(Vec::is_empty) {
        return Err(tei_error(
            StatusCode::BAD_REQUEST,
            "Empty",
            "`inputs` cannot be empty",
        ));
    }
    let input = parse_input(inputs, "inputs").map_err(invalid)?;
    let prompt_name = prompt_name(obj.get("prompt_name"), &input).map_err(invalid)?;
    let left = match obj.get("truncation_direction") {
        None | Some(Value::Null) => false,
        Some(Value::String(d)) if d.eq_ignore_ascii_case("right") => false,
        Some(Value::String(d)) if d.eq_ignore_ascii_case("left") => true,
        Some(v) => {
            return Err(invalid(format!(
                "`truncation_direction` must be \"right\" or \"left\", got {v}"
            )))
        }
    };
    let dimensions = dimensions(obj.get("dimensions"), dim).map_err(invalid)?;
    Ok(Embed {
        input,
        normalize: flag(&obj, "normalize", true)?,
        truncate: flag(&obj, "truncate", true)?,
        left,
        dimensions,
        prompt_name,
    })
}

/// The token ids of `texts`, untruncated, then cut as asked: refused past the model's
/// length without `truncate`, else cut keeping the first and last tokens and the
/// end of the text (`left`) or its start.
fn tokenize(app: &App, texts: &[String], ask: &Embed) -> Result<Vec<Vec<u32>>, TeiError> {
    let max = app.embedder.max_tokens();
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            if text.trim().is_empty() {
                return Err(invalid(format!("`inputs[{i}]` is empty")));
            }
            let enc = app.untruncated.encode(text.as_str(), true).map_err(|e| {
                tei_error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Tokenizer",
                    format!("`inputs[{i}]`: {e}"),
                )
            })?;
            let ids = enc.get_ids();
            if ids.len() <= max {
                return Ok(ids.to_vec());
            }
            if !ask.truncate {
                return Err(invalid(format!(
                    "`inputs` must have less than {max} tokens. Given: {}",
                    ids.len()
                )));
            }
            let (first, last) = (ids[0], ids[ids.len() - 1]);
            let inner = &ids[1..ids.len() - 1];
            let kept = if ask.left {
                &inner[inner.len() - (max - 2)..]
            } else {
                &inner[..max - 2]
            };
            Ok([&[first][..], kept, &[last]].concat())
        })
        .collect()
}

/// TEI's answer to a request that failed in the embedder.
fn failure(f: Failure) -> TeiError {
    let message = f.message();
    match f.embed_error() {
        Some(EmbedError::Tokenize { .. }) => {
            tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Tokenizer", message)
        }
        _ if f.is_input_error() => invalid(message),
        _ if f.is_overloaded() => tei_error(StatusCode::TOO_MANY_REQUESTS, "Overloaded", message),
        _ if matches!(f, Failure::TimedOut(_)) => {
            tei_error(StatusCode::GATEWAY_TIMEOUT, "Backend", message)
        }
        _ => tei_error(StatusCode::FAILED_DEPENDENCY, "Backend", message),
    }
}

/// `POST /embed`.
pub(super) async fn embed(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    let ask = match parse(body, app.embedder.dim()) {
        Ok(a) => a,
        Err(r) => return r.answer(),
    };
    let texts = ask.input.len();
    if texts > MAX_INPUTS {
        return invalid(format!(
            "batch size {texts} > maximum allowed batch size {MAX_INPUTS}"
        ))
        .answer();
    }
    let prompted = ask.prompt_name.is_some() || app.embedder.default_prompt_name().is_some();
    if prompted && matches!(ask.input, Input::Texts(_)) && (!ask.truncate || ask.left) {
        return with_texts(
            invalid(
                "a prompt is only put before texts truncated on the right: \
                 `truncate: false` and `truncation_direction: \"left\"` are not supported \
                 with one",
            )
            .answer(),
            texts,
        );
    }
    let seqs = match &ask.input {
        Input::Texts(_) if ask.truncate && !ask.left => None,
        Input::Texts(t) => match tokenize(&app, t, &ask) {
            Ok(s) => Some(s),
            Err(r) => return with_texts(r.answer(), texts),
        },
        Input::Ids(s) => Some(s.clone()),
    };
    let answer = waiting::wait(&app, Queue::Embedder, |done| match (seqs, &ask.input) {
        (Some(seqs), _) => app
            .embedder
            .submit_tokens_normalizing(seqs, ask.normalize, done),
        (None, Input::Texts(t)) => {
            let options = TextOptions {
                prompt_name: ask.prompt_name.clone(),
                normalize: Some(ask.normalize),
            };
            app.embedder.submit_with(t, &options, done)
        }
        (None, Input::Ids(s)) => app.embedder.submit_tokens(s.clone(), done),
    })
    .await;
    let response = match answer {
        Ok(emb) => {
            let mut out = String::with_capacity(emb.vectors.len() * app.embedder.dim() * 12);
            out.push('[');
            for (i, v) in emb.vectors.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let v = match (ask.normalize, ask.dimensions) {
                    (true, d) => truncated(v, d),
                    (false, Some(d)) => v[..d].into(),
                    (false, None) => v.into(),
                };
                write_vector(&mut out, &v, Encoding::Float);
            }
            out.push(']');
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/json".to_string()),
                    (
                        HeaderName::from_static("x-compute-tokens"),
                        emb.tokens.to_string(),
                    ),
                ],
                out,
            )
                .into_response()
        }
        Err(f) => failure(f).answer(),
    };
    with_texts(response, texts)
}

/// The pooling modes as TEI names one (several joined with `+`).
fn pooling_name(modes: &[Pooling]) -> String {
    let names: Vec<&str> = modes.iter().map(|p| p.name()).collect();
    names.join("+")
}

/// `GET /info`.
pub(super) async fn info(State(app): State<App>) -> Response {
    let e = &app.embedder;
    let s = e.settings();
    let dtype = match s.precision.as_str() {
        "f32" => "float32",
        "bf16" => "bfloat16",
        other => other,
    };
    let reranker = app.reranker.as_ref().map(|r| {
        json!({"model_id": &*app.reranker_name, "max_input_length": r.max_tokens(),
               "activation": format!("{:?}", r.activation()).to_lowercase()})
    });
    json_response(
        StatusCode::OK,
        &json!({
            "model_id": &*app.model,
            "model_sha": null,
            "model_dtype": dtype,
            "served_model_name": &*app.model,
            "model_type": {"embedding": {"pooling": pooling_name(e.pooling())}},
            "max_concurrent_requests": null,
            "max_input_length": e.max_tokens(),
            "max_batch_tokens": s.max_batch_tokens,
            "max_batch_requests": null,
            "max_client_batch_size": MAX_INPUTS,
            "auto_truncate": true,
            "tokenization_workers": 2,
            "version": env!("CARGO_PKG_VERSION"),
            "sha": null,
            "docker_label": null,
            "dimensions": e.dim(),
            "max_queue_tokens": s.max_queue_tokens,
            "workers": s.workers,
            "reranker": reranker,
        }),
    )
}
