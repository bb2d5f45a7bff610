//! Dynamic batching: the queue of sequences waiting for the model, the worker threads
//! that take them in ragged batches up to a token budget, and the bookkeeping that
//! sends each request its answer when its last sequence is done. The same batcher
//! serves the [`Embedder`](super::Embedder) (a sequence is a text, its answer a
//! pooled vector) and the [`Reranker`](super::Reranker) (a sequence is a query and
//! document pair with its token types, its answer the classifier's logits): [`Net`]
//! is the forward pass a batch runs.
//!
//! The unit of work is one text's token sequence, not a request: a request of eight
//! texts may be spread over several batches (and workers), and a batch holds
//! sequences of many requests. A worker takes sequences in arrival order while they
//! fit in its budget (`max_batch_tokens`, or an even share of the queued tokens when
//! other workers are idle too), keeping each request's texts in one batch unless the
//! request alone is over `max_batch_tokens` or idle workers share the queue (then a
//! request's texts are spread over them in even shares of tokens, topped up out of
//! order where that evens them out, so a lone request of 32 texts runs on every worker
//! at once rather than on one, and they end together), waits at most `max_wait` for more when it emptied the
//! queue and has room (unless its batch holds the rest of a request already running, or
//! no batch has held several requests for a while: a lone caller never waits), runs the batch as one packed forward pass on its own stream,
//! and hands each vector to its request. If a batch fails, each of its sequences is run again alone,
//! so only the requests whose own sequences fail get an error. Panics in a forward
//! pass or in a caller's callback are caught: a worker never dies while the
//! [`Embedder`](super::Embedder) lives.
//!
//! The queue may be bounded (`max_queue_tokens`): a request that would take it past
//! its bound is refused at once ([`EmbedError::Overloaded`]) instead of waiting
//! longer and longer. A withdrawn request ([`Ticket::cancel`], `request.rs`) leaves
//! the queue at once, and a batch formed before it was withdrawn skips it. An
//! observer ([`BatchObserver`]) sees each batch's sequences before it runs.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, RwLock};

use super::observe::{BatchObserver, QueueDepth};
use super::request::{Request, Ticket};
use super::{EmbedError, EmbedderSettings, Embeddings};
use crate::models::bert::Packing;
use crate::models::head::Head;
use crate::models::{BertClassifier, TextModel};

/// How many kernel threads a worker's batch runs on: `shared` while other workers run
/// too (the cores shared between the workers: the default, or `kernel_threads` when
/// set), `alone` when it is the only batch running and nothing else is queued (all the
/// cores by default: a lone request of one text comes back about as much sooner as
/// the product splits well, instead of leaving the other cores idle). A worker that
/// starts a batch while another runs alone takes its share; the one alone keeps its
/// threads until its batch ends.
#[derive(Clone, Copy, Debug)]
struct Threads {
    shared: usize,
    alone: usize,
}

impl Threads {
    /// `n` threads for every batch.
    fn fixed(n: usize) -> Threads {
        Threads {
            shared: n,
            alone: n,
        }
    }
}

/// The forward pass the workers run on a batch.
pub(super) enum Net {
    /// Sentence embeddings: the encoder, then the head (pooling, `Dense` layers) and
    /// L2 normalisation where asked.
    Embed(Arc<TextModel>, Head),
    /// A classifier's logits for each sequence, with its token types.
    Classify(Arc<BertClassifier>),
}

impl Net {
    /// One ragged forward pass: a vector (or the logits) per sequence, in order;
    /// embeddings L2-normalised where `normalize` says and with each sequence's
    /// first `prompt` tokens its prompt (one entry per sequence).
    fn run(
        &self,
        seqs: &[&[u32]],
        types: &[&[u32]],
        prompt: &[usize],
        normalize: &[bool],
    ) -> crate::Result<Vec<Vec<f32>>> {
        match self {
            Net::Embed(model, head) => model.embed_packed_head(seqs, head, prompt, normalize),
            Net::Classify(c) => c.classify_packed(seqs, types, Packing::Exact),
        }
    }
}

/// What a request's caller is called with, once.
pub(super) type Done = Box<dyn FnOnce(Result<Embeddings, EmbedError>) + Send>;

/// One text's tokens and where its vector goes.
struct Item {
    ids: Vec<u32>,
    /// The tokens' types; empty when all are 0 (a text to embed).
    types: Vec<u32>,
    request: Arc<Request>,
    index: usize,
    /// Tokens of the whole request (the same for each of its items).
    request_tokens: usize,
    /// Whether its embedding is L2-normalised (the request's choice).
    normalize: bool,
    /// Its leading prompt tokens (0 without a prompt).
    prompt: usize,
}

/// How long after a batch of several requests the workers still wait for batches to
/// fill (at least; ten times `max_wait` when that is longer).
const COMPANY: std::time::Duration = std::time::Duration::from_millis(100);

struct Queue {
    items: VecDeque<Item>,
    /// Tokens of the queued items.
    tokens: usize,
    shutdown: bool,
    /// Workers running a batch.
    busy: usize,
    /// Whether batches ran since the last trim.
    dirty: bool,
    /// When a batch last took sequences of more than one request: requests come from
    /// several callers at once, and waiting for more fills batches.
    company: Option<Instant>,
}

/// What the workers share with the [`Embedder`](super::Embedder) or
/// [`Reranker`](super::Reranker) that owns them.
pub(super) struct Batcher {
    net: Net,
    settings: EmbedderSettings,
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Told of each batch before it runs, when set.
    observer: RwLock<Option<Arc<dyn BatchObserver>>>,
}

/// A [`Batcher`] and its worker threads: dropping it lets the workers finish what is
/// queued and joins them.
pub(super) struct Workers {
    batcher: Arc<Batcher>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Checks `settings` against the longest sequence (`max_tokens`) and starts
    /// `settings.workers` threads named `{name}-{i}` running batches of `net`.
    pub(super) fn start(
        net: Net,
        settings: EmbedderSettings,
        max_tokens: usize,
        name: &str,
    ) -> Result<Workers, EmbedError> {
        if settings.workers == 0 {
            return Err(EmbedError::Settings("workers must be at least 1".into()));
        }
        if settings.max_batch_tokens < max_tokens {
            return Err(EmbedError::Settings(format!(
                "max_batch_tokens {} is below the model's longest sequence, {max_tokens} tokens",
                settings.max_batch_tokens
            )));
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let kernel_threads = match settings.kernel_threads {
            0 => Threads {
                shared: (cores / settings.workers).max(1),
                alone: cores,
            },
            n => Threads::fixed(n),
        };
        let mut workers = Workers {
            batcher: Arc::new(Batcher::new(net, settings)),
            handles: Vec::new(),
        };
        for i in 0..workers.batcher.settings.workers {
            let b = Arc::clone(&workers.batcher);
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || b.work(kernel_threads));
            match spawned {
                Ok(h) => workers.handles.push(h),
                // Dropping `workers` stops and joins the ones started.
                Err(e) => {
                    return Err(EmbedError::Workers(format!(
                        "cannot start worker thread {i}: {e}"
                    )))
                }
            }
        }
        Ok(workers)
    }

    /// The batcher the workers take their work from.
    pub(super) fn batcher(&self) -> &Arc<Batcher> {
        &self.batcher
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.batcher.shut_down();
        let me = std::thread::current().id();
        for h in self.handles.drain(..) {
            // A last handle dropped inside a callback runs on a worker: not itself.
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

impl Batcher {
    fn new(net: Net, settings: EmbedderSettings) -> Batcher {
        Batcher {
            net,
            settings,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                tokens: 0,
                shutdown: false,
                busy: 0,
                dirty: false,
                company: None,
            }),
            ready: Condvar::new(),
            observer: RwLock::new(None),
        }
    }

    /// Sets (or, with `None`, removes) the observer told of each batch.
    pub(super) fn observe(&self, observer: Option<Arc<dyn BatchObserver>>) {
        *self.observer.write() = observer;
    }

    /// The queue now.
    pub(super) fn depth(&self) -> QueueDepth {
        let q = self.queue.lock();
        QueueDepth {
            sequences: q.items.len(),
            tokens: q.tokens,
            busy_workers: q.busy,
        }
    }

    /// Takes the queued sequences of a withdrawn `request` out of the queue; returns
    /// how many there were.
    pub(super) fn remove_request(&self, request: &Arc<Request>) -> usize {
        let mut q = self.queue.lock();
        let before = q.items.len();
        let mut freed = 0;
        q.items.retain(|item| {
            let keep = !Arc::ptr_eq(&item.request, request);
            if !keep {
                freed += item.ids.len();
            }
            keep
        });
        q.tokens -= freed;
        before - q.items.len()
    }

    /// The settings the workers run with.
    pub(super) fn settings(&self) -> &EmbedderSettings {
        &self.settings
    }

    /// Queues one request: its sequences (checked by the caller) with their token
    /// types (`types` empty, or one list per sequence, empty when all are 0); `done`
    /// gets the answer once the last is back, or right away for no sequences. With
    /// `max_queue_tokens` set, a request that would take the queue past it is refused
    /// (`done` is then dropped, never called), unless the queue is empty: a request
    /// larger than the bound still runs when it is alone.
    pub(super) fn submit(
        self: &Arc<Self>,
        seqs: Vec<Vec<u32>>,
        types: Vec<Vec<u32>>,
        (normalize, prompt): (bool, usize),
        done: Done,
    ) -> Result<Ticket, EmbedError> {
        let tokens = seqs.iter().map(Vec::len).sum();
        if seqs.is_empty() {
            done(Ok(Embeddings {
                vectors: Vec::new(),
                tokens: 0,
            }));
            return Ok(Ticket::default());
        }
        let request = Request::new(seqs.len(), tokens, done);
        let mut types = types.into_iter();
        let mut q = self.queue.lock();
        if let Some(max) = self.settings.max_queue_tokens {
            if q.tokens > 0 && q.tokens + tokens > max {
                return Err(EmbedError::Overloaded {
                    queued: q.tokens,
                    requested: tokens,
                    max,
                });
            }
        }
        // All at once, so a request's sequences stay together in line.
        for (index, ids) in seqs.into_iter().enumerate() {
            q.tokens += ids.len();
            q.items.push_back(Item {
                ids,
                types: types.next().unwrap_or_default(),
                request: Arc::clone(&request),
                index,
                request_tokens: tokens,
                normalize,
                prompt,
            });
        }
        drop(q);
        self.ready.notify_all();
        Ok(Ticket::new(&request, self))
    }

    /// Tells the workers to finish what is queued and stop.
    fn shut_down(&self) {
        self.queue.lock().shutdown = true;
        self.ready.notify_all();
    }

    /// A worker's life: batches until shut down and the queue is empty, each on as
    /// many kernel threads as `threads` gives it.
    fn work(&self, threads: Threads) {
        let mut now = 0;
        while let Some((batch, alone)) = self.next_batch() {
            let want = if alone { threads.alone } else { threads.shared };
            if want != now {
                crate::set_kernel_threads(want);
                now = want;
            }
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
    /// its budget, waiting up to `max_wait` for more while the queue is empty (only
    /// while requests come from several callers at once: see [`COMPANY`]). The
    /// budget is `max_batch_tokens`, or less when other workers are idle: the queued
    /// tokens shared evenly between the idle workers, so that a burst is spread over
    /// all of them instead of filling one batch while the others wait. `None` once
    /// shut down with nothing queued. With the batch, whether it runs alone: no other
    /// worker was busy and it left nothing queued for them.
    fn next_batch(&self) -> Option<(Vec<Item>, bool)> {
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
        let (budget, sharing) = match self.settings.workers.saturating_sub(q.busy) {
            0 | 1 => (max, false),
            idle => (q.tokens.div_ceil(idle).min(max), true),
        };
        let deadline = Instant::now() + self.settings.max_wait;
        let mut batch = Vec::new();
        let mut tokens = 0;
        loop {
            while let Some(next) = q.items.front() {
                // Shared between idle workers, the queue is cut by tokens alone, even
                // inside a request: its parts run at once on the idle workers, so it
                // comes back sooner than from one batch. Otherwise a request's texts
                // stay together (one batch answers it), unless it is larger than
                // max_batch_tokens: a request starts a batch or fits whole in the
                // budget; its next texts follow up to the hard limit.
                let fits = match next.index {
                    _ if sharing => tokens + next.ids.len() <= budget,
                    0 => tokens + next.request_tokens <= budget,
                    _ => tokens + next.ids.len() <= max,
                };
                if !batch.is_empty() && !fits {
                    break;
                }
                let item = q.items.pop_front().expect("front exists");
                q.tokens -= item.ids.len();
                tokens += item.ids.len();
                batch.push(item);
            }
            if sharing && budget < max && !batch.is_empty() {
                let (room, limit) = (budget.saturating_sub(tokens), max.saturating_sub(tokens));
                tokens += fill_share(&mut q, &mut batch, room, limit);
            }
            // Wait for more only when this worker took everything and has room, and
            // its batch starts a request: the rest of a request whose first texts are
            // already running (on another worker, or in this one's last batch) would
            // only come back later for the wait. And only while requests come from
            // several callers at once: a lone caller's next request comes after this
            // one's answer, so waiting would only add `max_wait` to each of its calls.
            let first = batch.first().map(|item| &item.request);
            if batch
                .iter()
                .any(|i| first.is_some_and(|f| !Arc::ptr_eq(&i.request, f)))
            {
                q.company = Some(Instant::now());
            }
            let crowded = q
                .company
                .is_some_and(|t| t.elapsed() < COMPANY.max(10 * self.settings.max_wait));
            let starts = batch.first().is_some_and(|item| item.index == 0);
            let room = crowded && starts && tokens < budget && q.items.is_empty();
            if !room || q.shutdown || self.ready.wait_until(&mut q, deadline).timed_out() {
                break;
            }
        }
        let alone = q.busy == 0 && q.items.is_empty();
        q.busy += 1;
        Some((batch, alone))
    }

    /// Runs one batch and answers its sequences; on failure, runs each alone.
    /// Sequences of requests withdrawn since the batch was formed are left out.
    fn run(&self, mut batch: Vec<Item>) {
        batch.retain(|item| !item.request.is_cancelled());
        if batch.is_empty() {
            return;
        }
        let seqs: Vec<&[u32]> = batch.iter().map(|i| i.ids.as_slice()).collect();
        let types: Vec<&[u32]> = batch.iter().map(|i| i.types.as_slice()).collect();
        let normalize: Vec<bool> = batch.iter().map(|i| i.normalize).collect();
        let prompt: Vec<usize> = batch.iter().map(|i| i.prompt).collect();
        match self.embed(&seqs, &types, &prompt, &normalize) {
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
                    let one = self
                        .embed(
                            &[&item.ids],
                            &[&item.types],
                            &[item.prompt],
                            &[item.normalize],
                        )
                        .map(|mut v| v.remove(0));
                    item.request.finish(item.index, one);
                }
            }
        }
    }

    /// One packed forward pass, its errors and panics as [`EmbedError::Model`].
    fn embed(
        &self,
        seqs: &[&[u32]],
        types: &[&[u32]],
        prompt: &[usize],
        normalize: &[bool],
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        #[cfg(test)]
        if seqs.iter().any(|s| s.contains(&tests::POISON)) {
            return Err(EmbedError::Model(crate::Error::Kernel {
                op: "embedder",
                msg: "a poisoned sequence (test)".into(),
            }));
        }
        let observer = self.observer.read().clone();
        let pass = || {
            if let Some(o) = &observer {
                o.batch(seqs);
            }
            self.net.run(seqs, types, prompt, normalize)
        };
        match catch_unwind(AssertUnwindSafe(pass)) {
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

/// Tops up a batch cut from a queue shared between idle workers: while its tokens
/// are short of the even share by `room`, moves in the queued sequence whose length
/// comes nearest to `room`, if that brings the batch nearer the share without passing
/// `limit` (what is left of `max_batch_tokens`). Returns the tokens moved in.
///
/// The cut in arrival order stops before the first sequence that would pass the
/// share, so one worker got up to a sequence's tokens less than the other. Their
/// batches run at once and the request comes back when the larger ends: on
/// all-MiniLM-L6-v2's sorted corpus, requests of 32 texts were cut 15 and 17 texts,
/// 576 and 634 tokens, and the first worker then sat idle for a tenth of the call.
/// The queue's order only decides which worker runs a sequence here: every queued
/// sequence is being shared out now.
fn fill_share(q: &mut Queue, batch: &mut Vec<Item>, mut room: usize, mut limit: usize) -> usize {
    let mut moved = 0;
    while room > 0 {
        // The nearest to `room`, counted as its distance from it; it must improve on
        // `room` itself (taking nothing).
        let best = q
            .items
            .iter()
            .enumerate()
            .map(|(at, item)| (at, item.ids.len()))
            .filter(|&(_, len)| len <= limit && len.abs_diff(room) < room)
            .min_by_key(|&(_, len)| len.abs_diff(room));
        let Some((at, len)) = best else { break };
        let item = q.items.remove(at).expect("found in the queue");
        q.tokens -= len;
        batch.push(item);
        moved += len;
        limit -= len;
        room = room.saturating_sub(len);
    }
    moved
}

/// Frees what the engine keeps for reuse: pooled buffers and arenas, and every cached
/// plan (they are rebuilt, in milliseconds, when work comes back).
fn trim_memory() {
    crate::trim_pools();
    crate::clear_plan_cache();
    log::debug!("embedder idle: pools and plan cache trimmed");
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[cfg(test)]
pub(super) mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::models::bert::testing;
    use crate::models::pooling::Pooling;
    use crate::models::{BertConfig, BertModel};

    /// A token whose batch fails (`Batcher::embed` under test).
    pub(crate) const POISON: u32 = 13;

    /// [`tiny_model`] with mean pooling.
    fn tiny_net() -> Net {
        Net::Embed(
            Arc::new(TextModel::Bert(tiny_model())),
            Head::pooling_only(8, Pooling::Mean),
        )
    }

    /// A one-layer BERT of width 8 with deterministic weights.
    fn tiny_model() -> BertModel {
        let cfg = BertConfig::from_json(
            r#"{"vocab_size": 20, "hidden_size": 8, "num_hidden_layers": 1,
                "num_attention_heads": 2, "intermediate_size": 16,
                "max_position_embeddings": 32, "type_vocab_size": 2}"#,
        )
        .unwrap();
        let weights = testing::filled(testing::encoder_shapes("", 20, 8, 16, 32), 1);
        let bytes = testing::safetensors_file(&weights);
        BertModel::from_safetensors(cfg, &bytes, Path::new("tiny.safetensors")).unwrap()
    }

    /// Runs `requests` (token sequences) through a batcher with `settings`, all queued
    /// before its one worker starts, and returns each request's answer.
    fn answers(
        settings: EmbedderSettings,
        requests: &[Vec<Vec<u32>>],
    ) -> Vec<Result<Embeddings, EmbedError>> {
        let b = Arc::new(Batcher::new(tiny_net(), settings));
        let (tx, rx) = std::sync::mpsc::channel();
        for (r, seqs) in requests.iter().enumerate() {
            let tx = tx.clone();
            let done: Done = Box::new(move |a| tx.send((r, a)).unwrap());
            b.submit(seqs.clone(), Vec::new(), (true, 0), done).unwrap();
        }
        b.shut_down();
        let worker = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.work(Threads::fixed(1)))
        };
        worker.join().unwrap();
        drop(tx);
        let mut out: Vec<_> = rx.into_iter().collect();
        out.sort_by_key(|(r, _)| *r);
        assert_eq!(out.len(), requests.len(), "every request is answered once");
        out.into_iter().map(|(_, a)| a).collect()
    }

    fn alone(seq: &[u32]) -> Vec<f32> {
        tiny_model()
            .embed_packed(&[seq], Pooling::Mean, Packing::Exact)
            .unwrap()
            .remove(0)
    }

    fn assert_same(got: &[f32], want: &[f32]) {
        let dot: f32 = got.iter().zip(want).map(|(a, b)| a * b).sum();
        assert!(dot > 0.99999, "cosine {dot}: {got:?} vs {want:?}");
    }

    fn settings(max_batch_tokens: usize) -> EmbedderSettings {
        EmbedderSettings {
            workers: 1,
            kernel_threads: 1,
            max_batch_tokens,
            max_wait: Duration::ZERO,
            idle_trim: None,
            precision: crate::models::Precision::F32,
            max_queue_tokens: None,
        }
    }

    #[test]
    fn a_failing_batch_is_rerun_so_only_the_bad_request_fails() {
        let good = vec![vec![1, 2, 3], vec![4, 5]];
        let bad = vec![vec![6, POISON, 7]];
        let also_good = vec![vec![8, 9, 10, 11]];
        let out = answers(settings(64), &[good.clone(), bad, also_good.clone()]);
        let v = out[0].as_ref().unwrap();
        assert_eq!(v.tokens, 5);
        assert_same(&v.vectors[0], &alone(&good[0]));
        assert_same(&v.vectors[1], &alone(&good[1]));
        let e = out[1].as_ref().unwrap_err();
        assert!(e.to_string().contains("poisoned"), "{e}");
        assert_same(&out[2].as_ref().unwrap().vectors[0], &alone(&also_good[0]));
    }

    #[test]
    fn a_request_split_over_batches_comes_back_whole_and_in_order() {
        // A budget of 4 tokens: every sequence is a batch of its own or shares one.
        let seqs: Vec<Vec<u32>> = (1..8).map(|n| (1..=n).collect()).collect();
        let out = answers(settings(4), &[seqs.clone(), vec![vec![2, 2]]]);
        let v = out[0].as_ref().unwrap();
        assert_eq!(v.vectors.len(), seqs.len());
        for (got, s) in v.vectors.iter().zip(&seqs) {
            assert_same(got, &alone(s));
        }
        assert_same(&out[1].as_ref().unwrap().vectors[0], &alone(&[2, 2]));
    }

    #[test]
    fn idle_workers_share_a_request_by_tokens_and_a_busy_one_keeps_it_whole() {
        let b = Arc::new(Batcher::new(
            tiny_net(),
            EmbedderSettings {
                workers: 2,
                ..settings(64)
            },
        ));
        let texts = |n: u32| -> Vec<Vec<u32>> { (0..n).map(|i| vec![1 + i, 2, 3, 4]).collect() };
        let sizes = |batch: &[Item]| {
            batch
                .iter()
                .map(|i| (i.index, i.ids.len()))
                .collect::<Vec<_>>()
        };
        // Both workers idle, one request of eight texts of 4 tokens: the first batch
        // takes half its tokens, the second (one worker idle now) the rest.
        b.submit(texts(8), Vec::new(), (true, 0), Box::new(|_| {}))
            .unwrap();
        let (first, first_alone) = b.next_batch().unwrap();
        let (second, second_alone) = b.next_batch().unwrap();
        assert_eq!(sizes(&first), (0..4).map(|i| (i, 4)).collect::<Vec<_>>());
        assert_eq!(sizes(&second), (4..8).map(|i| (i, 4)).collect::<Vec<_>>());
        // Neither runs alone: the first left the rest for the other worker, which
        // started while the first was busy. They share the cores.
        assert!(!first_alone && !second_alone);
        // One worker idle (the other busy): requests stay whole, even when the next
        // would fill the batch only in part.
        b.queue.lock().busy = 1;
        b.submit(texts(3), Vec::new(), (true, 0), Box::new(|_| {}))
            .unwrap();
        b.submit(texts(15), Vec::new(), (true, 0), Box::new(|_| {}))
            .unwrap();
        let (whole, _) = b.next_batch().unwrap();
        assert_eq!(
            sizes(&whole).len(),
            3,
            "the 15-text request does not fit whole"
        );
        assert_eq!(b.next_batch().unwrap().0.len(), 15);
    }

    #[test]
    fn idle_workers_get_even_shares_of_tokens_whatever_the_lengths() {
        let b = Arc::new(Batcher::new(
            tiny_net(),
            EmbedderSettings {
                workers: 2,
                ..settings(64)
            },
        ));
        let tokens = |batch: &[Item]| batch.iter().map(|i| i.ids.len()).sum::<usize>();
        // 40 tokens, longest first (as sentence-transformers sorts): in order, the
        // first share would stop at 9 + 8 = 17 (7 more would pass 20), leaving 23 to
        // the other worker; the 3-token text fills the gap exactly.
        let lens = [9, 8, 7, 6, 5, 3, 2];
        let texts: Vec<Vec<u32>> = lens.iter().map(|&n| vec![1; n]).collect();
        let answer = Arc::new(Mutex::new(None));
        let got = Arc::clone(&answer);
        b.submit(
            texts.clone(),
            Vec::new(),
            (true, 0),
            Box::new(move |r| *got.lock() = Some(r)),
        )
        .unwrap();
        let (first, _) = b.next_batch().unwrap();
        let (second, _) = b.next_batch().unwrap();
        assert_eq!((tokens(&first), tokens(&second)), (20, 20));
        let indices = |batch: &[Item]| batch.iter().map(|i| i.index).collect::<Vec<_>>();
        assert_eq!(indices(&first), [0, 1, 5]);
        assert_eq!(indices(&second), [2, 3, 4, 6]);
        // Run out of order, the answer is still in the request's order.
        b.queue.lock().busy = 2;
        for batch in [second, first] {
            b.run(batch);
            b.queue.lock().busy -= 1;
        }
        let vectors = answer.lock().take().unwrap().unwrap().vectors;
        for (v, t) in vectors.iter().zip(&texts) {
            assert_same(v, &alone(t));
        }
        // Nothing nearer the share than what was cut: nothing is moved. A share of
        // 8 of 16 tokens, cut at 7 (the next is 5): the 2-token texts would leave it
        // as far from 8 as it is.
        b.submit(
            [7, 5, 2, 2].map(|n| vec![1u32; n]).to_vec(),
            Vec::new(),
            (true, 0),
            Box::new(|_| {}),
        )
        .unwrap();
        let (first, _) = b.next_batch().unwrap();
        assert_eq!(tokens(&first), 7);
    }

    #[test]
    fn a_batch_runs_alone_only_when_no_other_worker_has_work() {
        let b = Arc::new(Batcher::new(
            tiny_net(),
            EmbedderSettings {
                workers: 2,
                ..settings(64)
            },
        ));
        let one = || vec![vec![1, 2, 3]];
        // One text, both workers idle: alone (all the cores).
        b.submit(one(), Vec::new(), (true, 0), Box::new(|_| {}))
            .unwrap();
        let (batch, alone) = b.next_batch().unwrap();
        assert_eq!(batch.len(), 1);
        assert!(alone);
        // Another text while that batch runs: its share of the cores.
        b.submit(one(), Vec::new(), (true, 0), Box::new(|_| {}))
            .unwrap();
        let (_, alone) = b.next_batch().unwrap();
        assert!(!alone);
    }
    #[test]
    fn a_lone_caller_never_waits_and_several_callers_do() {
        let b = Arc::new(Batcher::new(
            tiny_net(),
            EmbedderSettings {
                workers: 1,
                max_wait: Duration::from_millis(300),
                ..settings(64)
            },
        ));
        let submit = || {
            b.submit(vec![vec![1, 2, 3]], Vec::new(), (true, 0), Box::new(|_| {}))
                .unwrap()
        };
        // The size of the next batch and how long it took to form.
        let timed = || {
            let start = Instant::now();
            let len = b.next_batch().unwrap().0.len();
            (len, start.elapsed())
        };
        let max_wait = Duration::from_millis(300);
        // One request at a time: each batch runs at once, however long max_wait is.
        for _ in 0..3 {
            let _ticket = submit();
            let (len, took) = timed();
            assert!(len == 1 && took < max_wait, "{len} sequences in {took:?}");
        }
        // Two requests in one batch: callers come at once, so from now on a batch
        // that took everything waits for more (the whole max_wait, here).
        let _tickets = (submit(), submit());
        let (len, took) = timed();
        assert!(len == 2 && took >= max_wait, "{len} sequences in {took:?}");
        let _ticket = submit();
        let (len, took) = timed();
        assert!(len == 1 && took >= max_wait, "{len} sequences in {took:?}");
    }

    #[test]
    fn the_rest_of_a_running_request_does_not_wait_for_more() {
        // A minute's max_wait: the second batch holds the rest of a request whose first
        // half is running, so it must not wait for other requests to join it.
        let b = Arc::new(Batcher::new(
            tiny_net(),
            EmbedderSettings {
                workers: 2,
                max_wait: Duration::from_secs(60),
                ..settings(64)
            },
        ));
        let texts: Vec<Vec<u32>> = (0..8).map(|i| vec![1 + i, 2, 3, 4]).collect();
        b.submit(texts, Vec::new(), (true, 0), Box::new(|_| {}))
            .unwrap();
        let start = Instant::now();
        assert_eq!(b.next_batch().unwrap().0.len(), 4);
        assert_eq!(b.next_batch().unwrap().0.len(), 4);
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            start.elapsed()
        );
    }

    /// Counts the sequences and tokens of the batches it sees.
    #[derive(Default)]
    struct Counting(Mutex<(usize, usize)>);

    impl BatchObserver for Counting {
        fn batch(&self, sequences: &[&[u32]]) {
            let mut c = self.0.lock();
            c.0 += sequences.len();
            c.1 += sequences.iter().map(|s| s.len()).sum::<usize>();
        }
    }

    #[test]
    fn a_withdrawn_request_leaves_the_queue_and_is_never_run() {
        let b = Arc::new(Batcher::new(tiny_net(), settings(64)));
        let seen = Arc::new(Counting::default());
        b.observe(Some(Arc::clone(&seen) as Arc<dyn BatchObserver>));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut tickets = Vec::new();
        for (r, seqs) in [
            vec![vec![1, 2, 3]],
            vec![vec![4, 5], vec![6]],
            vec![vec![7, 8]],
        ]
        .into_iter()
        .enumerate()
        {
            let tx = tx.clone();
            let done: Done = Box::new(move |a| tx.send((r, a)).unwrap());
            tickets.push(b.submit(seqs, Vec::new(), (true, 0), done).unwrap());
        }
        assert_eq!(
            b.depth(),
            QueueDepth {
                sequences: 4,
                tokens: 8,
                busy_workers: 0
            }
        );
        assert_eq!(tickets[1].cancel(), 2, "both queued sequences removed");
        assert_eq!(tickets[1].cancel(), 0, "cancelling twice does nothing");
        assert_eq!(b.depth().sequences, 2);
        assert_eq!(b.depth().tokens, 5);
        // A request withdrawn after its batch was formed is skipped by `run`.
        let (batch, _) = b.next_batch().unwrap();
        assert_eq!(batch.len(), 2);
        assert_eq!(tickets[2].cancel(), 0, "nothing of it is queued any more");
        b.run(batch);
        b.queue.lock().busy -= 1;
        drop(tx);
        let answered: Vec<usize> = rx
            .into_iter()
            .map(|(r, a)| {
                assert!(a.is_ok());
                r
            })
            .collect();
        assert_eq!(answered, [0], "withdrawn requests are never answered");
        assert_eq!(*seen.0.lock(), (1, 3), "only request 0 ran");
        assert_eq!(b.depth(), QueueDepth::default());
        // An answered request's ticket does nothing.
        assert_eq!(tickets[0].cancel(), 0);
    }

    #[test]
    fn a_bounded_queue_refuses_what_would_pass_its_bound() {
        let mut s = settings(64);
        s.max_queue_tokens = Some(5);
        let b = Arc::new(Batcher::new(tiny_net(), s));
        let never = || -> Done { Box::new(|_| panic!("a refused request is never answered")) };
        // Alone, a request larger than the bound is taken.
        let big = b
            .submit(vec![vec![1; 7]], Vec::new(), (true, 0), never())
            .unwrap();
        let e = b
            .submit(vec![vec![1]], Vec::new(), (true, 0), never())
            .unwrap_err();
        assert_eq!(
            e,
            EmbedError::Overloaded {
                queued: 7,
                requested: 1,
                max: 5
            }
        );
        assert!(!e.is_input_error());
        assert!(e.to_string().contains("bound of 5"), "{e}");
        big.cancel();
        let (tx, rx) = std::sync::mpsc::channel();
        for n in [3, 2] {
            let tx = tx.clone();
            b.submit(
                vec![vec![1; n]],
                Vec::new(),
                (true, 0),
                Box::new(move |a| tx.send(a).unwrap()),
            )
            .unwrap();
        }
        assert!(matches!(
            b.submit(vec![vec![1]], Vec::new(), (true, 0), never()),
            Err(EmbedError::Overloaded { queued: 5, .. })
        ));
        b.shut_down();
        b.work(Threads::fixed(1));
        drop(tx);
        assert_eq!(rx.into_iter().filter(|a| a.is_ok()).count(), 2);
    }

    #[test]
    fn a_panicking_observer_fails_only_the_batch_it_panics_on() {
        struct Poisoned;
        impl BatchObserver for Poisoned {
            fn batch(&self, sequences: &[&[u32]]) {
                assert!(
                    !sequences.iter().any(|s| s.contains(&(POISON - 1))),
                    "poisoned"
                );
            }
        }
        let b = Arc::new(Batcher::new(tiny_net(), settings(64)));
        b.observe(Some(Arc::new(Poisoned)));
        let (tx, rx) = std::sync::mpsc::channel();
        for (r, seqs) in [vec![vec![1, 2]], vec![vec![3, POISON - 1]], vec![vec![4]]]
            .into_iter()
            .enumerate()
        {
            let tx = tx.clone();
            b.submit(
                seqs,
                Vec::new(),
                (true, 0),
                Box::new(move |a| tx.send((r, a)).unwrap()),
            )
            .unwrap();
        }
        b.shut_down();
        b.work(Threads::fixed(1));
        drop(tx);
        let mut out: Vec<_> = rx.into_iter().collect();
        out.sort_by_key(|(r, _)| *r);
        assert!(out[0].1.is_ok() && out[2].1.is_ok());
        let e = out[1].1.as_ref().unwrap_err();
        assert!(
            matches!(e, EmbedError::Model(_)) && e.to_string().contains("panicked"),
            "{e}"
        );
    }
}
