//! Dynamic batching: the queue of sequences waiting to be embedded, the worker threads
//! that take them in ragged batches up to a token budget, and the bookkeeping that
//! sends each request its answer when its last sequence is done.
//!
//! The unit of work is one text's token sequence, not a request: a request of eight
//! texts may be spread over several batches (and workers), and a batch holds
//! sequences of many requests. A worker takes sequences in arrival order while they
//! fit in `max_batch_tokens`, waits at most `max_wait` for more when the batch is not
//! full, runs the batch as one packed forward pass on its own stream, and hands each
//! vector to its request. If a batch fails, each of its sequences is run again alone,
//! so only the requests whose own sequences fail get an error. Panics in a forward
//! pass or in a caller's callback are caught: a worker never dies while the
//! [`Embedder`](super::Embedder) lives.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::{EmbedError, EmbedderSettings, Embeddings};
use crate::models::bert::{Packing, Pooling};
use crate::models::BertModel;

/// What a request's caller is called with, once.
pub(super) type Done = Box<dyn FnOnce(Result<Embeddings, EmbedError>) + Send>;

/// One request: its vectors as they come back, and its caller.
pub(super) struct Request {
    state: Mutex<RequestState>,
}

struct RequestState {
    vectors: Vec<Vec<f32>>,
    /// Sequences not back yet.
    left: usize,
    tokens: usize,
    error: Option<EmbedError>,
    done: Option<Done>,
}

impl Request {
    pub(super) fn new(texts: usize, tokens: usize, done: Done) -> Arc<Request> {
        Arc::new(Request {
            state: Mutex::new(RequestState {
                vectors: vec![Vec::new(); texts],
                left: texts,
                tokens,
                error: None,
                done: Some(done),
            }),
        })
    }

    /// Records sequence `index`'s result; the last one calls the caller (outside the
    /// lock, panics caught).
    fn finish(&self, index: usize, result: Result<Vec<f32>, EmbedError>) {
        let answer = {
            let mut st = self.state.lock();
            match result {
                Ok(v) => st.vectors[index] = v,
                Err(e) => {
                    st.error.get_or_insert(e);
                }
            }
            st.left -= 1;
            if st.left > 0 {
                return;
            }
            let done = st.done.take();
            let answer = match st.error.take() {
                Some(e) => Err(e),
                None => Ok(Embeddings {
                    vectors: std::mem::take(&mut st.vectors),
                    tokens: st.tokens,
                }),
            };
            done.map(|d| (d, answer))
        };
        if let Some((done, answer)) = answer {
            if catch_unwind(AssertUnwindSafe(|| done(answer))).is_err() {
                log::error!("an embedding request's callback panicked");
            }
        }
    }
}

/// One text's tokens and where its vector goes.
pub(super) struct Item {
    pub(super) ids: Vec<u32>,
    pub(super) request: Arc<Request>,
    pub(super) index: usize,
}

struct Queue {
    items: VecDeque<Item>,
    /// Tokens of the queued items.
    tokens: usize,
    shutdown: bool,
    /// Workers running a batch.
    busy: usize,
    /// Whether batches ran since the last trim.
    dirty: bool,
}

/// What the workers share with the [`Embedder`](super::Embedder).
pub(super) struct Batcher {
    model: BertModel,
    pooling: Pooling,
    settings: EmbedderSettings,
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Batcher {
    pub(super) fn new(model: BertModel, pooling: Pooling, settings: EmbedderSettings) -> Batcher {
        Batcher {
            model,
            pooling,
            settings,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                tokens: 0,
                shutdown: false,
                busy: 0,
                dirty: false,
            }),
            ready: Condvar::new(),
        }
    }

    pub(super) fn model(&self) -> &BertModel {
        &self.model
    }

    pub(super) fn settings(&self) -> &EmbedderSettings {
        &self.settings
    }

    pub(super) fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Queues a request's sequences (all at once, so they stay together in line).
    pub(super) fn push(&self, items: impl IntoIterator<Item = Item>) {
        let mut q = self.queue.lock();
        for item in items {
            q.tokens += item.ids.len();
            q.items.push_back(item);
        }
        drop(q);
        self.ready.notify_all();
    }

    /// Tells the workers to finish what is queued and stop.
    pub(super) fn shut_down(&self) {
        self.queue.lock().shutdown = true;
        self.ready.notify_all();
    }

    /// A worker's life: batches until shut down and the queue is empty.
    pub(super) fn work(&self, kernel_threads: usize) {
        crate::set_kernel_threads(kernel_threads);
        while let Some(batch) = self.next_batch() {
            self.run(batch);
            let mut q = self.queue.lock();
            q.busy -= 1;
            q.dirty = true;
            if q.busy == 0 && q.items.is_empty() {
                // An idle worker waiting to trim starts its wait now.
                self.ready.notify_all();
            }
        }
    }

    /// The next batch: waits for a first sequence (trimming memory after
    /// `idle_trim` without work), then takes sequences in order while they fit in
    /// its budget, waiting up to `max_wait` for more while the queue is empty. The
    /// budget is `max_batch_tokens`, or less when other workers are idle: the queued
    /// tokens shared evenly between the idle workers, so that a burst is spread over
    /// all of them instead of filling one batch while the others wait. `None` once
    /// shut down with nothing queued.
    fn next_batch(&self) -> Option<Vec<Item>> {
        let mut q = self.queue.lock();
        while q.items.is_empty() {
            if q.shutdown {
                return None;
            }
            match self.settings.idle_trim {
                Some(idle) if q.dirty && q.busy == 0 => {
                    let timed_out = self.ready.wait_for(&mut q, idle).timed_out();
                    if timed_out && q.dirty && q.busy == 0 && q.items.is_empty() {
                        q.dirty = false;
                        parking_lot::MutexGuard::unlocked(&mut q, trim_memory);
                    }
                }
                _ => self.ready.wait(&mut q),
            }
        }
        let max = self.settings.max_batch_tokens;
        let budget = match self.settings.workers.saturating_sub(q.busy) {
            0 | 1 => max,
            idle => q.tokens.div_ceil(idle).min(max),
        };
        let deadline = Instant::now() + self.settings.max_wait;
        let mut batch = Vec::new();
        let mut tokens = 0;
        loop {
            while let Some(next) = q.items.front() {
                if !batch.is_empty() && tokens + next.ids.len() > budget {
                    break;
                }
                let item = q.items.pop_front().expect("front exists");
                q.tokens -= item.ids.len();
                tokens += item.ids.len();
                batch.push(item);
            }
            // Wait for more only when this worker took everything and has room.
            let room = tokens < budget && q.items.is_empty();
            if !room || q.shutdown || self.ready.wait_until(&mut q, deadline).timed_out() {
                break;
            }
        }
        q.busy += 1;
        Some(batch)
    }

    /// Runs one batch and answers its sequences; on failure, runs each alone.
    fn run(&self, batch: Vec<Item>) {
        let seqs: Vec<&[u32]> = batch.iter().map(|i| i.ids.as_slice()).collect();
        match self.embed(&seqs) {
            Ok(vectors) => {
                for (item, v) in batch.iter().zip(vectors) {
                    item.request.finish(item.index, Ok(v));
                }
            }
            Err(e) if batch.len() == 1 => batch[0].request.finish(batch[0].index, Err(e)),
            Err(e) => {
                log::debug!(
                    "a batch of {} sequences failed ({e}); running each alone",
                    batch.len()
                );
                for item in &batch {
                    let one = self.embed(&[&item.ids]).map(|mut v| v.remove(0));
                    item.request.finish(item.index, one);
                }
            }
        }
    }

    /// One packed forward pass, its errors and panics as [`EmbedError::Model`].
    fn embed(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let run = || {
            self.model
                .embed_packed(seqs, self.pooling, Packing::Bucketed)
        };
        match catch_unwind(AssertUnwindSafe(run)) {
            Ok(Ok(v)) if v.len() == seqs.len() => Ok(v),
            Ok(Ok(v)) => Err(EmbedError::Model(crate::Error::Internal {
                msg: format!("embedder: {} vectors for {} sequences", v.len(), seqs.len()),
            })),
            Ok(Err(e)) => Err(EmbedError::Model(e)),
            Err(panic) => Err(EmbedError::Model(crate::Error::Kernel {
                op: "embedder",
                msg: format!("the forward pass panicked: {}", panic_message(&panic)),
            })),
        }
    }
}

/// Frees what the engine keeps for reuse: pooled buffers and arenas, and every cached
/// plan (they are rebuilt, in milliseconds, when work comes back).
fn trim_memory() {
    crate::trim_pools();
    let limit = crate::plan_cache_limit();
    crate::set_plan_cache_limit(0);
    crate::set_plan_cache_limit(limit);
    log::debug!("embedder idle: pools and plan cache trimmed");
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
