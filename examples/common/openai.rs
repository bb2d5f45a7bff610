//! OpenAI's embeddings API over the server's [`Embedder`](streamfuse::embedder::Embedder):
//! `POST /v1/embeddings` and `GET /v1/models` (and `/v1/models/{id}`).
//!
//! `/v1/embeddings` takes what OpenAI's embeddings API takes: `input` as a string, a
//! list of strings, a list of token ids or a list of lists of them (ids of the served
//! model's own vocabulary, each sequence used as given, special tokens included, as
//! Text Embeddings Inference takes them); `encoding_format` `"float"` (the default) or
//! `"base64"` (each vector's f32 values as little-endian bytes, base64-encoded: what
//! the official Python client asks for unless told otherwise); `dimensions` (the
//! vector cut to its first `dimensions` values and L2-normalised again, as
//! sentence-transformers' `truncate_dim` then normalising does); `prompt_name` (a
//! prompt of the model's `config_sentence_transformers.json`, put before each text
//! as sentence-transformers' `prompt_name` does; absent or null: the model's default
//! prompt, if any; not with token ids); `model` and `user` (strings, not used). Errors are OpenAI's error body: 400 for a bad request, 503
//! with `Retry-After` when the queue is full, 504 past `--request-timeout`, 500 when
//! the batch failed.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use streamfuse::embedder::{Embeddings, TextOptions};

use super::metrics::Queue;
use super::{bad_request, error, json_response, waiting, with_texts, App, MAX_INPUTS};

/// What one `/v1/embeddings` request asks for.
#[derive(Debug)]
struct Request {
    input: Input,
    encoding: Encoding,
    /// The leading values each vector is cut to (then normalised again).
    dimensions: Option<usize>,
    /// The prompt put before each text (`None`: the model's default).
    prompt_name: Option<String>,
}

/// A request's sequences: texts to tokenise, or token ids to use as given.
#[derive(Debug)]
pub(crate) enum Input {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

impl Input {
    /// How many sequences.
    pub(crate) fn len(&self) -> usize {
        match self {
            Input::Texts(t) => t.len(),
            Input::Ids(s) => s.len(),
        }
    }
}

/// How the vectors are written in the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
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

/// The sequences of a request field (`field`, such as `input`): a string, a list of strings, a list of token ids (one
/// sequence) or a list of lists of token ids. A list is all strings or all token
/// ids, as OpenAI's API has it.
pub(crate) fn parse_input(input: &Value, field: &str) -> Result<Input, String> {
    let items = match input {
        Value::String(s) => return Ok(Input::Texts(vec![s.clone()])),
        Value::Array(items) => items,
        other => {
            return Err(format!(
                "`{field}` must be a string, a list of strings, a list of token ids or a \
                 list of lists of token ids, got {other}"
            ))
        }
    };
    let input = match items.first() {
        None => return Err(format!("`{field}` must hold at least one text")),
        Some(Value::String(_)) => Input::Texts(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_str().map(str::to_string).ok_or_else(|| {
                        format!("`{field}[{i}]` must be a string like `{field}[0]`, got {x}")
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(Value::Number(_)) => Input::Ids(vec![items
            .iter()
            .enumerate()
            .map(|(i, x)| token_id(x, &format!("{field}[{i}]")))
            .collect::<Result<_, _>>()?]),
        Some(Value::Array(_)) => Input::Ids(
            items
                .iter()
                .enumerate()
                .map(|(i, seq)| {
                    let seq = seq.as_array().ok_or_else(|| {
                        format!(
                            "`{field}[{i}]` must be a list of token ids like `{field}[0]`, got {seq}"
                        )
                    })?;
                    if seq.is_empty() {
                        return Err(format!("`{field}[{i}]` holds no token ids"));
                    }
                    seq.iter()
                        .enumerate()
                        .map(|(j, x)| token_id(x, &format!("{field}[{i}][{j}]")))
                        .collect()
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(other) => {
            return Err(format!(
                "`{field}[0]` must be a string, a token id or a list of token ids, got {other}"
            ))
        }
    };
    if input.len() > MAX_INPUTS {
        return Err(format!(
            "`{field}` holds {} sequences; at most {MAX_INPUTS} are allowed",
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
    let input = parse_input(obj.get("input").ok_or("missing field `input`")?, "input")?;
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
    let dimensions = dimensions(obj.get("dimensions"), dim)?;
    let prompt_name = prompt_name(obj.get("prompt_name"), &input)?;
    Ok(Request {
        input,
        encoding,
        dimensions,
        prompt_name,
    })
}

/// The `prompt_name` field `p` (absent or null: none), or why it cannot be used: not
/// a string, or given with token ids (whose prompt, if any, is already in them).
pub(crate) fn prompt_name(p: Option<&Value>, input: &Input) -> Result<Option<String>, String> {
    match p {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) => match input {
            Input::Texts(_) => Ok(Some(name.clone())),
            Input::Ids(_) => Err(format!(
                "`prompt_name` \"{name}\" applies to texts; token ids are used as given"
            )),
        },
        Some(other) => Err(format!("`prompt_name` must be a string, got {other}")),
    }
}

/// The `dimensions` field `d` (absent or null: none), or why it is not an integer
/// from 1 to the model's dimension `dim`.
pub(crate) fn dimensions(d: Option<&Value>, dim: usize) -> Result<Option<usize>, String> {
    match d {
        None | Some(Value::Null) => Ok(None),
        Some(d) => match d.as_u64() {
            Some(n) if (1..=dim as u64).contains(&n) => Ok(Some(n as usize)),
            _ => Err(format!(
                "`dimensions` must be an integer from 1 to {dim} (the model's dimension), \
                 got {d}"
            )),
        },
    }
}

/// `v` cut to its first `dimensions` values and L2-normalised (a zero vector stays
/// zero), or `v` itself when no cut is asked for.
pub(crate) fn truncated(v: &[f32], dimensions: Option<usize>) -> std::borrow::Cow<'_, [f32]> {
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
pub(crate) fn write_vector(out: &mut String, v: &[f32], encoding: Encoding) {
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

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rejection) => return error(rejection.status(), rejection.body_text()),
    };
    let request = match parse_request(&body, app.embedder.dim()) {
        Ok(r) => r,
        Err(msg) => return bad_request(msg),
    };
    let texts = request.input.len();
    let answer = waiting::wait(&app, Queue::Embedder, |done| match &request.input {
        Input::Texts(texts) => {
            let options = TextOptions {
                prompt_name: request.prompt_name.clone(),
                normalize: None,
            };
            app.embedder.submit_with(texts, &options, done)
        }
        Input::Ids(seqs) => app.embedder.submit_tokens(seqs.clone(), done),
    })
    .await;
    let response = match answer {
        Ok(emb) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            embeddings_body(&app, &request, &emb),
        )
            .into_response(),
        Err(f) => {
            let (status, message) = f.openai("input");
            error(status, message)
        }
    };
    with_texts(response, texts)
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
pub(super) async fn models(State(app): State<App>) -> Response {
    let data: Vec<Value> = served(&app).into_iter().map(model_object).collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: a served model, or a 404 naming what is served.
pub(super) async fn one_model(State(app): State<App>, Path(id): Path<String>) -> Response {
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
