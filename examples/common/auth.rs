//! `--api-key KEY` (or `STREAMFUSE_API_KEY`): when set, every route but `/health`
//! needs `Authorization: Bearer KEY`, which is what OpenAI's official client sends
//! for its `api_key`, and what Text Embeddings Inference's `--api-key` takes. A
//! request without it, or with another key, gets a 401 in OpenAI's error shape (`code`
//! `invalid_api_key`) that never echoes what was sent.
//!
//! The key is compared in constant time ([`constant_time_eq`], written here: no crate
//! in the build graph offers one, `subtle` is not in it): the time taken depends only
//! on the key's length, never on where a guess first differs. [`ApiKey`]'s `Debug`
//! and `Display` print `<redacted>`, so the key never reaches a log line through the
//! server's options.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

use super::json_response;

/// The server's API key. Printing it (`{:?}` or `{}`) shows `<redacted>`.
#[derive(Clone)]
pub struct ApiKey {
    /// `Bearer KEY`: the whole expected header value.
    bearer: Vec<u8>,
}

impl ApiKey {
    /// `key`, or why it cannot be one: it must be 1 to 512 visible ASCII characters
    /// (what an HTTP header carries as it is).
    pub fn new(key: &str) -> Result<ApiKey, String> {
        if key.is_empty() || key.len() > 512 || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the API key must be 1 to 512 visible ASCII characters (no spaces)".into());
        }
        Ok(ApiKey {
            bearer: format!("Bearer {key}").into_bytes(),
        })
    }

    /// Whether the `Authorization` header value `given` carries this key (scheme
    /// `Bearer`, any case, one space, the key).
    pub fn admits(&self, given: &[u8]) -> bool {
        // The scheme is case-insensitive (RFC 9110): compare it lowercased; the
        // key itself exactly, in constant time.
        let scheme = b"bearer ".len();
        let lower_scheme =
            given.len() >= scheme && given[..scheme].eq_ignore_ascii_case(b"bearer ");
        let mut normalised = given.to_vec();
        if lower_scheme {
            normalised[..scheme].copy_from_slice(b"Bearer ");
        }
        constant_time_eq(&normalised, &self.bearer)
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl std::fmt::Display for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Whether `given` equals `expected`, in a time that depends only on `expected`'s
/// length (every byte of it is compared, whatever differs first; `given`'s length is
/// the sender's and not a secret).
pub fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, &e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= g ^ e;
    }
    // Keeps the compiler from turning the loop into an early exit.
    std::hint::black_box(diff) == 0
}

/// The middleware of the guarded routes: the request goes on when it carries the key,
/// else a 401.
pub async fn require_key(State(key): State<Arc<ApiKey>>, request: Request, next: Next) -> Response {
    let given = request.headers().get(header::AUTHORIZATION);
    if given.is_some_and(|v| key.admits(v.as_bytes())) {
        return next.run(request).await;
    }
    let message = match given {
        None => "no API key: send the header `Authorization: Bearer KEY` (the client's api_key)",
        Some(_) => "incorrect API key provided",
    };
    let mut response = json_response(
        StatusCode::UNAUTHORIZED,
        &json!({"error": {"message": message, "type": "invalid_request_error",
                          "param": null, "code": "invalid_api_key"}}),
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_only() {
        assert!(constant_time_eq(b"Bearer k1", b"Bearer k1"));
        assert!(!constant_time_eq(b"Bearer k2", b"Bearer k1"));
        assert!(!constant_time_eq(b"Bearer k", b"Bearer k1"));
        assert!(!constant_time_eq(b"Bearer k11", b"Bearer k1"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
        // A shorter `given` padded with the complement never matches by accident.
        assert!(!constant_time_eq(b"\xff", b"\x00\xff"));
    }
}
