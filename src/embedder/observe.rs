//! What a server may watch of the batcher without the library knowing how it is
//! reported: [`BatchObserver`], called by each worker with the sequences of each batch
//! it is about to run, and [`QueueDepth`], a snapshot of the queue. The library
//! depends on no metrics crate; the server example turns these into Prometheus
//! metrics.

/// Watches the batches an [`Embedder`](super::Embedder) or
/// [`Reranker`](super::Reranker) runs (set with their `observe`).
///
/// [`BatchObserver::batch`] is called on the worker thread just before each forward
/// pass, with that pass's sequences (their token ids): once per batch, and once per
/// sequence when a failed batch is run again sequence by sequence. It runs inside the
/// forward pass's panic guard, so a panicking observer fails that batch as a failing
/// forward pass does (its requests get [`EmbedError::Model`](super::EmbedError::Model);
/// other requests and later batches go on). It should be quick: the batch waits for it.
pub trait BatchObserver: Send + Sync {
    /// Called with the token ids of each sequence of the batch about to run.
    fn batch(&self, sequences: &[&[u32]]);
}

/// The queue of an [`Embedder`](super::Embedder) or [`Reranker`](super::Reranker)
/// at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// Sequences waiting for a worker (not yet in a batch).
    pub sequences: usize,
    /// Their tokens (what [`EmbedderSettings::max_queue_tokens`](super::EmbedderSettings::max_queue_tokens) bounds).
    pub tokens: usize,
    /// Workers running a batch now.
    pub busy_workers: usize,
}
