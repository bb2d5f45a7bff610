//! Serving sentence embeddings and reranking from text: [`Embedder`] loads a
//! sentence-transformers model folder once and embeds texts submitted from any number
//! of threads, batching them dynamically on worker threads of its own; [`Reranker`]
//! does the same for a cross-encoder folder, scoring (query, document) pairs.
//!
//! This module owns the path from text to vector or score: reading the folders
//! (`folder.rs`: weights, config, tokenizer, `max_seq_length`; `pipeline.rs`: the
//! module list of `modules.json`, pooling, `Dense`, `Normalize`, and the prompts;
//! `cross_encoder.rs`: a cross-encoder's head, its activation and its pair
//! tokenizer), tokenising on the submitting thread (a request of many texts shared out
//! over scoped threads, one per worker, while the workers wait for it), and the dynamic batcher
//! (`batcher.rs`: the queue, bounded when asked, the workers, each with its own
//! stream; `request.rs`: the answer of each request and the [`Ticket`] that withdraws
//! it), which both share. `observe.rs` is what a server may watch: a
//! [`BatchObserver`] told of each batch, and the [`QueueDepth`]. The forward passes themselves are the model's
//! ([`BertModel::embed_packed`],
//! [`BertClassifier::classify_packed`](crate::models::BertClassifier::classify_packed)): each batch is
//! ragged, its sequences packed one after another with no padding.
//!
//! ```no_run
//! use std::sync::Arc;
//! use streamfuse::embedder::Embedder;
//! # fn main() -> Result<(), streamfuse::embedder::EmbedError> {
//! let embedder = Arc::new(Embedder::load("target/models/all-MiniLM-L6-v2")?);
//! let vectors = embedder.embed(&["The cat sits outside", "A man is playing guitar"])?;
//! assert_eq!(vectors.len(), 2);
//! assert_eq!(vectors[0].len(), embedder.dim());
//! # Ok(())
//! # }
//! ```

mod batcher;
mod cross_encoder;
mod error;
mod folder;
mod observe;
mod pipeline;
mod request;
mod rerank;
mod tokenize;

pub use cross_encoder::ScoreActivation;
pub use error::EmbedError;
pub use observe::{BatchObserver, QueueDepth};
pub use request::Ticket;
pub use rerank::{Reranker, Scores, Truncation};

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokenizers::Tokenizer;

use crate::models::bert::Pooling;
#[cfg(doc)]
use crate::models::BertModel;
use crate::models::{Precision, TextModel};
use batcher::{Done, Net, Workers};
use tokenize::map_in_parts;

/// How an [`Embedder`] batches and spreads its work. `Default` gives sensible values
/// for a server; each field says what it trades.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbedderSettings {
    /// Worker threads, each running batches on its own stream (at least 1). Default:
    /// the number of cores. More workers run more batches at once; fewer make each
    /// batch larger.
    pub workers: usize,
    /// Kernel threads of each worker's stream (see
    /// [`set_kernel_threads`](crate::set_kernel_threads)); 0 (the default) shares the
    /// cores between the workers, at least 1 each, and gives a batch that runs alone
    /// (no other worker busy, nothing left queued: one request of one text) all of
    /// them.
    pub kernel_threads: usize,
    /// The most tokens one batch holds, summed over its texts (text-embeddings-
    /// inference's name). Default 2048. When several workers are idle, a burst is
    /// shared evenly between them instead. At least the model's longest text
    /// ([`Embedder::max_tokens`], 256 for all-MiniLM-L6-v2), so any text fits in a
    /// batch. Larger batches use the cores better and take more memory (about 20 KiB
    /// a token for MiniLM) and longer to come back.
    pub max_batch_tokens: usize,
    /// How long a worker waits for more texts when it emptied the queue and its
    /// batch is not full (default 2 ms), while requests come from several callers at
    /// once (a batch held several requests in the last 100 ms, or in the last ten
    /// `max_wait`s when that is longer). Never for a lone caller, whose next request
    /// comes only after this one's answer, nor for a batch that holds the rest of a
    /// request already running. Longer waits make larger batches under light load, at
    /// that cost in latency; under heavy load batches fill without waiting.
    pub max_wait: Duration,
    /// After this long without work, the engine's pooled memory and cached plans are
    /// freed (`Some(2 s)` by default; `None` never): memory goes back down after a
    /// burst instead of staying at its largest batch. This empties the process-wide
    /// plan cache and pool, which other users of streamfuse in the process share
    /// (their plans are rebuilt when next needed).
    pub idle_trim: Option<Duration>,
    /// The precision the model's matrix weights are kept in (`F32` by default; see
    /// [`Precision`] for the accuracy each reduced one keeps).
    pub precision: Precision,
    /// The most tokens that may wait in the queue (not yet in a batch); `None` (the
    /// default) leaves it unbounded. A request that would take the queue past it is
    /// refused at once with [`EmbedError::Overloaded`] (a server's 503), unless the
    /// queue is empty, so that any one request can run. Bounds both the memory of
    /// the queue and how long a request waits in it (about the bound over the
    /// throughput).
    pub max_queue_tokens: Option<usize>,
}

impl Default for EmbedderSettings {
    fn default() -> Self {
        EmbedderSettings {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel_threads: 0,
            max_batch_tokens: 2048,
            max_wait: Duration::from_millis(2),
            idle_trim: Some(Duration::from_secs(2)),
            precision: Precision::F32,
            max_queue_tokens: None,
        }
    }
}

/// The answer to one request: a vector per text, in order, and the tokens the texts
/// made (after truncation, special tokens included: OpenAI's `usage.prompt_tokens`).
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    /// One vector of [`Embedder::dim`] values per text: L2-normalised when the
    /// folder's module list ends with `Normalize` (or has no list), unless the
    /// request said otherwise ([`TextOptions::normalize`]).
    pub vectors: Vec<Vec<f32>>,
    /// Tokens of all the texts together.
    pub tokens: usize,
}

/// Sentence embeddings from text, for any number of threads at once.
///
/// `Embedder` is `Send + Sync`; share it with `Arc`. Each call tokenises its texts on
/// the calling thread (no padding; texts longer than the model's `max_seq_length`
/// are **truncated** to it, as sentence-transformers does, keeping the special
/// tokens) and queues them; the embedder's worker threads take queued texts of all
/// callers in ragged batches of up to [`EmbedderSettings::max_batch_tokens`] tokens
/// and run each as one forward pass with no padding. After the encoder come the
/// folder's modules (`modules.json`): pooling in the modes its config names (mean
/// when there is none), its `Dense` layers, and L2 normalisation when the list ends
/// with `Normalize` (a folder without `modules.json` is always normalised). A module
/// the engine does not run exactly makes [`Embedder::load`] fail with an error naming
/// it. The prompts of `config_sentence_transformers.json` are prepended as
/// sentence-transformers does ([`TextOptions::prompt_name`]).
///
/// Requests fail alone: an empty text is refused at once; if a batch fails, its texts
/// are run again one by one so only the request whose text fails gets the error.
/// Dropping the last handle lets the workers finish what is queued and joins them.
pub struct Embedder {
    workers: Workers,
    /// The model the workers run (shared with them).
    model: Arc<TextModel>,
    tokenizer: Tokenizer,
    max_tokens: usize,
    /// The pooling modes and the vectors' width (the head's, which the workers own).
    pooling: Vec<Pooling>,
    dim: usize,
    /// Whether vectors are normalised when a request does not say.
    normalize: bool,
    prompts: BTreeMap<String, String>,
    default_prompt: Option<String>,
}

/// What a request may choose ([`Embedder::embed_with`], [`Embedder::submit_with`]);
/// `Default` is the folder's behaviour, what [`Embedder::embed`] does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextOptions {
    /// The prompt (a name in the folder's `config_sentence_transformers.json`
    /// `prompts`) put before each text, as sentence-transformers' `prompt_name`:
    /// `None` uses the folder's `default_prompt_name`, if any. An empty prompt adds
    /// nothing. When the pooling config says `include_prompt: false`, the prompt's
    /// tokens (without the tokenizer's trailing special token) are left out of the
    /// mean and max pooling modes.
    pub prompt_name: Option<String>,
    /// Whether vectors are L2-normalised: `None` follows the folder (its module list
    /// ends with `Normalize`, or it has no list); `Some` is the caller's choice and
    /// wins over the folder's.
    pub normalize: Option<bool>,
}

impl Embedder {
    /// Loads the sentence-transformers folder `dir` (config.json, model.safetensors,
    /// tokenizer.json; modules.json and its modules' folders, sentence_bert_config.json
    /// and config_sentence_transformers.json when present) and starts the workers with
    /// default settings.
    pub fn load(dir: impl AsRef<Path>) -> Result<Embedder, EmbedError> {
        Embedder::load_with(dir, EmbedderSettings::default())
    }

    /// [`Embedder::load`] with `settings`.
    pub fn load_with(
        dir: impl AsRef<Path>,
        settings: EmbedderSettings,
    ) -> Result<Embedder, EmbedError> {
        let f = folder::Folder::load(dir.as_ref(), settings.precision)?;
        let p = f.pipeline;
        let (pooling, dim) = (p.head.pooling().to_vec(), p.head.dim());
        let model = Arc::new(f.model);
        let net = Net::Embed(Arc::clone(&model), p.head);
        Ok(Embedder {
            model,
            workers: Workers::start(net, settings, f.max_tokens, "streamfuse-embed")?,
            tokenizer: f.tokenizer,
            max_tokens: f.max_tokens,
            pooling,
            dim,
            normalize: p.normalize,
            prompts: p.prompts,
            default_prompt: p.default_prompt,
        })
    }

    /// One vector per text, in order, as the folder makes them (see [`Embeddings`]);
    /// blocks until they are made. An empty list gives an empty list.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_counted(texts).map(|e| e.vectors)
    }

    /// [`Embedder::embed`], with the number of tokens the texts made.
    pub fn embed_counted<S: AsRef<str>>(&self, texts: &[S]) -> Result<Embeddings, EmbedError> {
        wait_for(|done| self.submit(texts, done))
    }

    /// [`Embedder::embed_counted`] with a request's choices (prompt, normalisation).
    pub fn embed_with<S: AsRef<str>>(
        &self,
        texts: &[S],
        options: &TextOptions,
    ) -> Result<Embeddings, EmbedError> {
        wait_for(|done| self.submit_with(texts, options, done))
    }

    /// Queues `texts` and returns at once with a [`Ticket`] that can withdraw them;
    /// `done` is called, on a worker thread, with the answer once every text is
    /// embedded (right away, on this thread, for an empty list). An empty text, one
    /// the tokenizer refuses, or a full queue ([`EmbedError::Overloaded`]) is an
    /// `Err` here, and `done` is then never called. `done` should be quick (send the
    /// answer somewhere): it runs on the thread that embeds the next batch.
    pub fn submit<S: AsRef<str>>(
        &self,
        texts: &[S],
        done: impl FnOnce(Result<Embeddings, EmbedError>) + Send + 'static,
    ) -> Result<Ticket, EmbedError> {
        self.submit_with(texts, &TextOptions::default(), done)
    }

    /// [`Embedder::submit`] with a request's choices: the prompt put before each text
    /// and whether vectors are normalised ([`TextOptions`]). A prompt name the folder
    /// does not have is [`EmbedError::UnknownPrompt`].
    pub fn submit_with<S: AsRef<str>>(
        &self,
        texts: &[S],
        options: &TextOptions,
        done: impl FnOnce(Result<Embeddings, EmbedError>) + Send + 'static,
    ) -> Result<Ticket, EmbedError> {
        let prompt = match options
            .prompt_name
            .as_ref()
            .or(self.default_prompt.as_ref())
        {
            None => "",
            Some(name) => self
                .prompts
                .get(name)
                .ok_or_else(|| EmbedError::UnknownPrompt {
                    name: name.clone(),
                    known: self.prompts.keys().cloned().collect(),
                })?,
        };
        let encode = |index: usize, text: &str| {
            self.tokenizer
                .encode(text, true)
                .map_err(|e| EmbedError::Tokenize {
                    index,
                    msg: e.to_string(),
                })
        };
        let prompt_tokens = if prompt.is_empty() {
            0
        } else {
            // sentence-transformers' prompt length: the prompt's tokens, less the
            // tokenizer's trailing special token (its [SEP] or EOS).
            let enc = encode(0, prompt)?;
            let trailing = enc.get_special_tokens_mask().last() == Some(&1);
            enc.len() - usize::from(trailing)
        };
        let tokenize = |index: usize, text: &&str| {
            let text = *text;
            if text.trim().is_empty() {
                return Err(EmbedError::EmptyText { index });
            }
            let enc = if prompt.is_empty() {
                encode(index, text)?
            } else {
                encode(index, &format!("{prompt}{text}"))?
            };
            Ok(enc.get_ids().to_vec())
        };
        let texts: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
        let seqs = map_in_parts(&texts, self.settings().workers, tokenize)?;
        let normalize = options.normalize.unwrap_or(self.normalize);
        self.submit_ids(seqs, (normalize, prompt_tokens), Box::new(done))
    }

    /// The token ids the model runs for each text, in order: special tokens
    /// included, truncated as the tokenizer is set to, no prompt; the input of
    /// [`Embedder::submit_tokens`]. Tokenised as [`Embedder::submit`] tokenises, on up
    /// to one thread per worker for a long list, so a binding that queues tokens
    /// (the Python package) keeps that speed. Unlike `submit` it takes an empty or
    /// all-whitespace text: the tokenizer's ids for it, its special tokens alone
    /// (`[CLS] [SEP]` for BERT), which is what sentence-transformers embeds. A text
    /// the tokenizer refuses is [`EmbedError::Tokenize`] naming its index.
    pub fn token_ids<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
    ) -> Result<Vec<Vec<u32>>, EmbedError> {
        map_in_parts(texts, self.settings().workers, |index, text| {
            self.tokenizer
                .encode(text.as_ref(), true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| EmbedError::Tokenize {
                    index,
                    msg: e.to_string(),
                })
        })
    }

    /// [`Embedder::submit`] for texts already tokenised (with their special tokens,
    /// and no prompt): each sequence must have 1 to [`Embedder::max_tokens`] ids,
    /// each in the model's vocabulary; a sequence that does not is an `Err` naming
    /// it. Vectors are normalised as the folder says ([`Embeddings`]).
    pub fn submit_tokens(
        &self,
        seqs: Vec<Vec<u32>>,
        done: impl FnOnce(Result<Embeddings, EmbedError>) + Send + 'static,
    ) -> Result<Ticket, EmbedError> {
        self.submit_tokens_normalizing(seqs, self.normalize, done)
    }

    /// [`Embedder::submit_tokens`], with the vectors L2-normalised only when
    /// `normalize` (else as the last module makes them: Text Embeddings Inference's
    /// `normalize: false`), whatever the folder says. With `normalize` the vectors
    /// of a folder that normalises are [`Embedder::submit_tokens`]'s, to the bit.
    pub fn submit_tokens_normalizing(
        &self,
        seqs: Vec<Vec<u32>>,
        normalize: bool,
        done: impl FnOnce(Result<Embeddings, EmbedError>) + Send + 'static,
    ) -> Result<Ticket, EmbedError> {
        self.submit_ids(seqs, (normalize, 0), Box::new(done))
    }

    /// Checks `seqs` and queues them with (normalize, prompt tokens).
    fn submit_ids(
        &self,
        seqs: Vec<Vec<u32>>,
        how: (bool, usize),
        done: Done,
    ) -> Result<Ticket, EmbedError> {
        let vocab = self.model().vocab_size();
        for (index, s) in seqs.iter().enumerate() {
            check_ids(index, s, self.max_tokens, vocab)?;
        }
        self.workers.batcher().submit(seqs, Vec::new(), how, done)
    }

    /// Sets the observer told of each batch before it runs (see [`BatchObserver`]),
    /// replacing any earlier one; `None` removes it.
    pub fn observe(&self, observer: Option<Arc<dyn BatchObserver>>) {
        self.workers.batcher().observe(observer);
    }

    /// What waits in the queue now, and how many workers are running a batch.
    pub fn queue_depth(&self) -> QueueDepth {
        self.workers.batcher().depth()
    }

    /// Width of the vectors (384 for all-MiniLM-L6-v2): the pooled width, or the
    /// last `Dense` module's.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The most tokens a text keeps (the folder's `max_seq_length`, else the model's
    /// positions); longer texts are truncated to it.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The settings the embedder runs with.
    pub fn settings(&self) -> &EmbedderSettings {
        self.workers.batcher().settings()
    }

    /// The text model, for callers that also want its config or, for a BERT-family
    /// model, [`BertModel::embed`] and the like ([`TextModel::bert`]).
    pub fn model(&self) -> &TextModel {
        &self.model
    }

    /// The pooling modes read from the folder, in the order they are concatenated.
    pub fn pooling(&self) -> &[Pooling] {
        &self.pooling
    }

    /// Whether vectors are L2-normalised when a request does not say (the folder's
    /// module list ends with `Normalize`, or it has none).
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// The prompts by name (`config_sentence_transformers.json`).
    pub fn prompts(&self) -> &BTreeMap<String, String> {
        &self.prompts
    }

    /// The prompt used when a request names none.
    pub fn default_prompt_name(&self) -> Option<&str> {
        self.default_prompt.as_deref()
    }

    /// The folder's tokenizer, set up as the embedder uses it (truncation at
    /// [`Embedder::max_tokens`], no padding).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

/// Calls `submit` with a callback and blocks until the callback has the answer.
fn wait_for<T: Send + 'static>(
    submit: impl FnOnce(Box<dyn FnOnce(Result<T, EmbedError>) + Send>) -> Result<Ticket, EmbedError>,
) -> Result<T, EmbedError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    submit(Box::new(move |r| {
        let _ = tx.send(r);
    }))?;
    rx.recv()
        .unwrap_or_else(|_| Err(EmbedError::Workers("the request was lost".into())))
}

/// Checks a tokenised sequence of request position `index`: 1 to `max_tokens` ids,
/// each below `vocab`.
fn check_ids(index: usize, ids: &[u32], max_tokens: usize, vocab: usize) -> Result<(), EmbedError> {
    if ids.is_empty() || ids.len() > max_tokens {
        return Err(EmbedError::Tokenize {
            index,
            msg: format!("{} tokens; a sequence needs 1 to {max_tokens}", ids.len()),
        });
    }
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(EmbedError::Tokenize {
            index,
            msg: format!("token id {bad} is outside the model's vocabulary of {vocab}"),
        });
    }
    Ok(())
}
