//! `GET /metrics`: the server's Prometheus metrics in Prometheus' text format, kept in
//! a registry of the `prometheus` crate (one per router, so that several servers in
//! one process, as in the tests, keep apart) and written by its text encoder.
//!
//! | metric | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `streamfuse_requests_total` | counter | `route`, `status` | requests answered |
//! | `streamfuse_texts_total` | counter | `route`, `status` | texts (or documents) in them |
//! | `streamfuse_request_duration_seconds` | histogram | `route` | time to answer |
//! | `streamfuse_batch_size` | histogram | `queue` | sequences in each forward pass |
//! | `streamfuse_batch_tokens` | histogram | `queue` | tokens in each forward pass |
//! | `streamfuse_tokens_total` | counter | `queue` | tokens run through the model |
//! | `streamfuse_cancelled_sequences_total` | counter | `queue` | sequences withdrawn from the queue unrun (client gone, timeout) |
//! | `streamfuse_queue_sequences` | gauge | `queue` | sequences waiting for a worker |
//! | `streamfuse_queue_tokens` | gauge | `queue` | their tokens |
//! | `streamfuse_busy_workers` | gauge | `queue` | workers running a batch |
//! | `streamfuse_workers` | gauge | `queue` | worker threads |
//! | `streamfuse_kernel_threads` | gauge | | the engine's kernel threads |
//! | `streamfuse_kernel_threads_allowed` | gauge | | how many a flush may use now: fewer while other processes keep cores busy (`set_load_aware`) |
//!
//! `route` is the route's pattern (`/v1/embeddings`, `/v1/models/{id}`; `unmatched`
//! for any other path); `queue` is `embedder` or `reranker`. The batch metrics come
//! from the library's [`BatchObserver`] hook, the queue gauges from `queue_depth()`
//! and the kernel threads' from `streamfuse::stats()`, read at each scrape.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use streamfuse::embedder::{BatchObserver, Embedder, Reranker};

use super::{error, App, Texts};

/// Which batcher a metric is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// The embedding model's.
    Embedder,
    /// The cross-encoder's.
    Reranker,
}

impl Queue {
    /// The `queue` label.
    pub fn label(self) -> &'static str {
        match self {
            Queue::Embedder => "embedder",
            Queue::Reranker => "reranker",
        }
    }
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    texts: IntCounterVec,
    latency: HistogramVec,
    batch_size: HistogramVec,
    batch_tokens: HistogramVec,
    tokens: IntCounterVec,
    cancelled: IntCounterVec,
    queue_sequences: IntGaugeVec,
    queue_tokens: IntGaugeVec,
    busy_workers: IntGaugeVec,
    workers: IntGaugeVec,
    kernel_threads: IntGauge,
    kernel_threads_allowed: IntGauge,
}

/// Registers `collector` in `registry` and returns it. The names are fixed and
/// distinct, so registering cannot fail.
fn registered<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    collector: prometheus::Result<C>,
) -> C {
    let c = collector.expect("a well-formed metric");
    registry
        .register(Box::new(c.clone()))
        .expect("metric names are distinct");
    c
}

/// Batch sizes, powers of two from 1 to 1024.
fn size_buckets() -> Vec<f64> {
    exponential_buckets(1.0, 2.0, 11).expect("valid buckets")
}

impl Metrics {
    /// Metrics for a server of `embedder` and `reranker`; each of their batches is
    /// observed from now on (replacing any observer they had).
    pub fn new(embedder: &Embedder, reranker: Option<&Arc<Reranker>>) -> Metrics {
        let r = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            registered(&r, IntCounterVec::new(Opts::new(name, help), labels))
        };
        let gauge = |name: &str, help: &str| {
            registered(&r, IntGaugeVec::new(Opts::new(name, help), &["queue"]))
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: Vec<f64>| {
            registered(
                &r,
                HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels),
            )
        };
        let m = Metrics {
            requests: counter(
                "streamfuse_requests_total",
                "Requests answered, by route and status.",
                &["route", "status"],
            ),
            texts: counter(
                "streamfuse_texts_total",
                "Texts (or documents) in the requests answered, by route and status.",
                &["route", "status"],
            ),
            latency: histogram(
                "streamfuse_request_duration_seconds",
                "Time from a request's arrival to its answer, by route.",
                &["route"],
                exponential_buckets(0.001, 2.0, 16).expect("valid buckets"),
            ),
            batch_size: histogram(
                "streamfuse_batch_size",
                "Sequences in each forward pass.",
                &["queue"],
                size_buckets(),
            ),
            batch_tokens: histogram(
                "streamfuse_batch_tokens",
                "Tokens in each forward pass.",
                &["queue"],
                exponential_buckets(16.0, 2.0, 11).expect("valid buckets"),
            ),
            tokens: counter(
                "streamfuse_tokens_total",
                "Tokens run through the model.",
                &["queue"],
            ),
            cancelled: counter(
                "streamfuse_cancelled_sequences_total",
                "Sequences withdrawn from the queue before they ran (client gone, timeout).",
                &["queue"],
            ),
            queue_sequences: gauge(
                "streamfuse_queue_sequences",
                "Sequences waiting for a worker.",
            ),
            queue_tokens: gauge(
                "streamfuse_queue_tokens",
                "Tokens of the sequences waiting for a worker.",
            ),
            busy_workers: gauge("streamfuse_busy_workers", "Workers running a batch."),
            workers: gauge("streamfuse_workers", "Worker threads."),
            kernel_threads: registered(
                &r,
                IntGauge::new("streamfuse_kernel_threads", "The engine's kernel threads."),
            ),
            kernel_threads_allowed: registered(
                &r,
                IntGauge::new(
                    "streamfuse_kernel_threads_allowed",
                    "Kernel threads a flush may use now: fewer while other processes keep cores busy.",
                ),
            ),
            registry: r,
        };
        m.watch(Queue::Embedder, embedder.settings().workers, |o| {
            embedder.observe(Some(o))
        });
        if let Some(reranker) = reranker {
            m.watch(Queue::Reranker, reranker.settings().workers, |o| {
                reranker.observe(Some(o))
            });
        }
        m
    }

    /// Sets the worker gauge of `queue` and hands `install` the observer that records
    /// its batches.
    fn watch(&self, queue: Queue, workers: usize, install: impl FnOnce(Arc<dyn BatchObserver>)) {
        let q = queue.label();
        self.workers.with_label_values(&[q]).set(workers as i64);
        install(Arc::new(BatchMetrics {
            size: self.batch_size.with_label_values(&[q]),
            tokens: self.batch_tokens.with_label_values(&[q]),
            total: self.tokens.with_label_values(&[q]),
        }));
    }

    /// Counts `n` sequences withdrawn from `queue`.
    pub fn cancelled(&self, queue: Queue, n: usize) {
        self.cancelled
            .with_label_values(&[queue.label()])
            .inc_by(n as u64);
    }

    /// The metrics in Prometheus' text format, the queue and kernel thread gauges read
    /// now.
    pub fn render(&self, app: &App) -> Result<String, String> {
        let mut depths = vec![(Queue::Embedder, app.embedder.queue_depth())];
        if let Some(r) = &app.reranker {
            depths.push((Queue::Reranker, r.queue_depth()));
        }
        for (queue, d) in depths {
            let q = [queue.label()];
            self.queue_sequences
                .with_label_values(&q)
                .set(d.sequences as i64);
            self.queue_tokens.with_label_values(&q).set(d.tokens as i64);
            self.busy_workers
                .with_label_values(&q)
                .set(d.busy_workers as i64);
        }
        let engine = streamfuse::stats();
        self.kernel_threads.set(engine.kernel_threads as i64);
        self.kernel_threads_allowed
            .set(engine.kernel_threads_allowed as i64);
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .map_err(|e| e.to_string())
    }
}

/// The [`BatchObserver`] of one queue.
struct BatchMetrics {
    size: Histogram,
    tokens: Histogram,
    total: IntCounter,
}

impl BatchObserver for BatchMetrics {
    fn batch(&self, sequences: &[&[u32]]) {
        let tokens: usize = sequences.iter().map(|s| s.len()).sum();
        self.size.observe(sequences.len() as f64);
        self.tokens.observe(tokens as f64);
        self.total.inc_by(tokens as u64);
    }
}

/// `GET /metrics`.
pub(super) async fn scrape(State(app): State<App>) -> Response {
    match app.metrics.render(&app) {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
            text,
        )
            .into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// The layer around every route: counts each request by route and status, its texts
/// (the [`Texts`] its handler put in the response) and its time.
pub async fn count_request(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let labels = [route.as_str(), status.as_str()];
    metrics.requests.with_label_values(&labels).inc();
    if let Some(Texts(n)) = response.extensions().get::<Texts>() {
        metrics.texts.with_label_values(&labels).inc_by(*n as u64);
    }
    metrics
        .latency
        .with_label_values(&[route.as_str()])
        .observe(start.elapsed().as_secs_f64());
    response
}
