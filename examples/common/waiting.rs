//! Handing a request to the embedder (or the reranker) and awaiting its answer, for
//! every route: the answer comes back through a oneshot channel from the worker that
//! ran its last batch; `--request-timeout` bounds the wait (then a 504); and when the
//! wait ends early (the timeout, or the client went away and hyper dropped the
//! handler's future) a guard withdraws the request from the queue
//! ([`Ticket::cancel`]), so that no worker computes what nobody will read.

use std::time::Duration;

use axum::http::StatusCode;
use streamfuse::embedder::{EmbedError, Ticket};

use super::metrics::Queue;
use super::App;

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The embedder refused it when it was submitted (bad input, a full queue).
    Refused(EmbedError),
    /// Its batch failed.
    Failed(EmbedError),
    /// It was not answered within `--request-timeout`.
    TimedOut(Duration),
    /// The worker dropped the answer (never expected).
    Lost,
}

impl Failure {
    /// The library's error, when there is one.
    pub(crate) fn embed_error(&self) -> Option<&EmbedError> {
        match self {
            Failure::Refused(e) | Failure::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the request itself was at fault.
    pub(crate) fn is_input_error(&self) -> bool {
        self.embed_error().is_some_and(EmbedError::is_input_error)
    }

    /// Whether the queue was full.
    pub(crate) fn is_overloaded(&self) -> bool {
        matches!(self.embed_error(), Some(EmbedError::Overloaded { .. }))
    }

    /// The status of OpenAI-shaped routes: 400 for bad input (the message names
    /// `field`), 503 for a full queue, 504 for a timeout, 500 otherwise.
    pub(crate) fn openai(&self, field: &str) -> (StatusCode, String) {
        let status = if self.is_input_error() {
            StatusCode::BAD_REQUEST
        } else if self.is_overloaded() {
            StatusCode::SERVICE_UNAVAILABLE
        } else if matches!(self, Failure::TimedOut(_)) {
            StatusCode::GATEWAY_TIMEOUT
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        let message = match self {
            f if f.is_input_error() => format!("`{field}`: {}", self.message()),
            _ => self.message(),
        };
        (status, message)
    }

    /// What went wrong, in words.
    pub(crate) fn message(&self) -> String {
        match self {
            Failure::Refused(e) | Failure::Failed(e) => e.to_string(),
            Failure::TimedOut(t) => format!(
                "the request was not answered within the server's --request-timeout of {} ms",
                t.as_millis()
            ),
            Failure::Lost => "the embedder dropped the request".into(),
        }
    }
}

/// What a submit function is handed: the callback that sends the answer back.
pub(crate) type Answer<T> = Box<dyn FnOnce(Result<T, EmbedError>) + Send>;

/// Withdraws its request when dropped before the answer came (counting what left the
/// queue in the metrics).
struct Withdraw<'a> {
    ticket: Option<Ticket>,
    app: &'a App,
    queue: Queue,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            let removed = ticket.cancel();
            self.app.metrics.cancelled(self.queue, removed);
        }
    }
}

/// Submits a request with `submit` (to the embedder or reranker behind `queue`) and
/// awaits its answer, at most the app's request timeout.
pub(crate) async fn wait<T: Send + 'static>(
    app: &App,
    queue: Queue,
    submit: impl FnOnce(Answer<T>) -> Result<Ticket, EmbedError>,
) -> Result<T, Failure> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let ticket = submit(Box::new(move |r| {
        let _ = tx.send(r);
    }))
    .map_err(Failure::Refused)?;
    let mut guard = Withdraw {
        ticket: Some(ticket),
        app,
        queue,
    };
    let answer = match app.request_timeout {
        Some(limit) => tokio::time::timeout(limit, rx)
            .await
            .map_err(|_| Failure::TimedOut(limit))?,
        None => rx.await,
    };
    guard.ticket = None;
    match answer {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failure::Failed(e)),
        Err(_) => Err(Failure::Lost),
    }
}
