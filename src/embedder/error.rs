//! What can go wrong with an [`Embedder`](super::Embedder) or a
//! [`Reranker`](super::Reranker), and how each failure names what was wrong.

use std::fmt;
use std::path::PathBuf;

/// Why an [`Embedder`](super::Embedder) could not be made or a request could not be answered. Each
/// names what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmbedError {
    /// The model folder or one of its files is missing or broken.
    Load {
        /// The folder or file.
        path: PathBuf,
        /// What was wrong with it.
        msg: String,
    },
    /// An [`EmbedderSettings`](super::EmbedderSettings) field is out of range.
    Settings(String),
    /// Text `index` of the request is empty or only whitespace.
    EmptyText {
        /// Its position in the request.
        index: usize,
    },
    /// Text `index` could not be tokenised, or its tokens do not fit the model.
    Tokenize {
        /// Its position in the request.
        index: usize,
        /// What the tokenizer or the check said.
        msg: String,
    },
    /// The forward pass failed (a kernel error, memory refused by the system).
    Model(crate::Error),
    /// The worker threads could not be started.
    Workers(String),
    /// A rerank request's query is empty or only whitespace.
    EmptyQuery,
    /// A rerank request has no documents.
    NoDocuments,
    /// A rerank request has more documents than [`Reranker::MAX_DOCUMENTS`](super::Reranker::MAX_DOCUMENTS).
    TooManyDocuments {
        /// Documents in the request.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// Pair `index` (query and document) is longer than the model takes and the
    /// request asked not to truncate ([`Truncation::Refuse`](super::Truncation::Refuse)).
    TooLong {
        /// Its position in the request.
        index: usize,
        /// Its tokens, special tokens included.
        tokens: usize,
        /// The most the model takes.
        max: usize,
    },
    /// A request named a prompt the model's `config_sentence_transformers.json` does
    /// not have.
    UnknownPrompt {
        /// The name asked for.
        name: String,
        /// The prompts the model has.
        known: Vec<String>,
    },
    /// The queue is full ([`EmbedderSettings::max_queue_tokens`](super::EmbedderSettings::max_queue_tokens)): try again later.
    Overloaded {
        /// Tokens waiting in the queue.
        queued: usize,
        /// Tokens of the refused request.
        requested: usize,
        /// The queue's bound.
        max: usize,
    },
}

impl EmbedError {
    /// Whether the request itself was at fault (empty or bad input, a 4xx for a
    /// server), rather than the model, the folder or the machine.
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            EmbedError::EmptyText { .. }
                | EmbedError::Tokenize { .. }
                | EmbedError::EmptyQuery
                | EmbedError::NoDocuments
                | EmbedError::TooManyDocuments { .. }
                | EmbedError::TooLong { .. }
                | EmbedError::UnknownPrompt { .. }
        )
    }
}

impl fmt::Display for EmbedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmbedError::Load { path, msg } => write!(f, "{}: {msg}", path.display()),
            EmbedError::Settings(msg) => write!(f, "embedder settings: {msg}"),
            EmbedError::EmptyText { index } => {
                write!(f, "text {index} is empty; every text needs some content")
            }
            EmbedError::Tokenize { index, msg } => write!(f, "text {index}: {msg}"),
            EmbedError::Model(e) => write!(f, "the forward pass failed: {e}"),
            EmbedError::Workers(msg) => write!(f, "embedder workers: {msg}"),
            EmbedError::EmptyQuery => {
                write!(f, "the query is empty; a query needs some content")
            }
            EmbedError::NoDocuments => write!(f, "no documents to rank; give at least one"),
            EmbedError::TooManyDocuments { count, max } => {
                write!(
                    f,
                    "{count} documents; at most {max} are ranked in one request"
                )
            }
            EmbedError::TooLong { index, tokens, max } => write!(
                f,
                "document {index}: the query and document make {tokens} tokens, more than \
                 the model's {max}; shorten them or allow truncation"
            ),
            EmbedError::UnknownPrompt { name, known } => write!(
                f,
                "`prompt_name` `{name}` is not one of the model's prompts ({})",
                if known.is_empty() {
                    "it has none".to_string()
                } else {
                    known.join(", ")
                }
            ),
            EmbedError::Overloaded {
                queued,
                requested,
                max,
            } => write!(
                f,
                "overloaded: {queued} tokens are waiting and this request's {requested} \
                 would pass the queue's bound of {max}; try again shortly"
            ),
        }
    }
}

impl std::error::Error for EmbedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EmbedError::Model(e) => Some(e),
            _ => None,
        }
    }
}
