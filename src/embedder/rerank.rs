//! [`Reranker`]: a cross-encoder scoring (query, document) pairs, batched as the
//! [`Embedder`](super::Embedder) batches texts. Owns the pair's tokens (one sequence
//! `[CLS] query [SEP] document [SEP]`, token types 0 up to the first `[SEP]` and 1
//! after it, cut to the model's length as asked), the checks on a request, and turning
//! the classifier's logits into [`Scores`] and a ranking.

use std::path::Path;

use tokenizers::Tokenizer;

use super::batcher::{Done, Net, Workers};
use super::cross_encoder::{CrossEncoderFolder, ScoreActivation};
use super::{
    check_ids, wait_for, BatchObserver, EmbedError, EmbedderSettings, Embeddings, QueueDepth,
    Ticket,
};
use std::sync::Arc;

use crate::models::{BertClassifier, BertModel};

/// What to do with a pair longer than the model takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Truncation {
    /// Cut tokens from the end of the longer of query and document, one at a time,
    /// until the pair fits (Hugging Face's `truncation=True`, what sentence-transformers'
    /// CrossEncoder does).
    #[default]
    Right,
    /// The same, cutting from the start of the longer one.
    Left,
    /// Refuse the request ([`EmbedError::TooLong`]).
    Refuse,
}

/// The answer to one rerank request, in the order of its documents.
#[derive(Clone, Debug, PartialEq)]
pub struct Scores {
    /// The classifier's logit for each document.
    pub logits: Vec<f32>,
    /// Each logit through the model's [`ScoreActivation`] (what sentence-transformers'
    /// `CrossEncoder.predict` returns).
    pub scores: Vec<f32>,
    /// Tokens of all the pairs together, special tokens included.
    pub tokens: usize,
}

impl Scores {
    /// The documents' indices, most relevant first: by logit, descending; equal
    /// logits keep their documents' order.
    pub fn ranking(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.logits.len()).collect();
        order.sort_by(|&a, &b| self.logits[b].total_cmp(&self.logits[a]));
        order
    }
}

/// A cross-encoder reranker: relevance scores of documents for a query, for any number
/// of threads at once.
///
/// It loads a sentence-transformers CrossEncoder folder (a
/// `BertForSequenceClassification` with one label: config.json, model.safetensors,
/// tokenizer.json; tokenizer_config.json and sentence_bert_config.json when present;
/// the rule for its activation is [`ScoreActivation`]'s, the longest pair
/// [`Reranker::max_tokens`]). Each (query, document) pair is one sequence with
/// token types; the pairs of all callers go into ragged batches of up to
/// [`EmbedderSettings::max_batch_tokens`] tokens on the reranker's own worker threads,
/// as the [`Embedder`](super::Embedder)'s texts do (the same batcher). `Reranker` is
/// `Send + Sync`; share it with `Arc`. Dropping the last handle lets the workers finish
/// what is queued and joins them.
pub struct Reranker {
    workers: Workers,
    /// The classifier the workers run (shared with them).
    classifier: Arc<BertClassifier>,
    right: Tokenizer,
    left: Tokenizer,
    whole: Tokenizer,
    max_tokens: usize,
    activation: ScoreActivation,
}

impl Reranker {
    /// The most documents one request may rank (a request's pairs are held in memory
    /// at once).
    pub const MAX_DOCUMENTS: usize = 2048;

    /// Loads the CrossEncoder folder `dir` and starts the workers with default
    /// settings.
    pub fn load(dir: impl AsRef<Path>) -> Result<Reranker, EmbedError> {
        Reranker::load_with(dir, EmbedderSettings::default())
    }

    /// [`Reranker::load`] with `settings`.
    pub fn load_with(
        dir: impl AsRef<Path>,
        settings: EmbedderSettings,
    ) -> Result<Reranker, EmbedError> {
        let f = CrossEncoderFolder::load(dir.as_ref(), settings.precision)?;
        let classifier = Arc::new(f.classifier);
        let net = Net::Classify(Arc::clone(&classifier));
        Ok(Reranker {
            classifier,
            workers: Workers::start(net, settings, f.max_tokens, "streamfuse-rerank")?,
            right: f.right,
            left: f.left,
            whole: f.whole,
            max_tokens: f.max_tokens,
            activation: f.activation,
        })
    }

    /// Scores of `documents` for `query`, in the documents' order (pairs cut to the
    /// model's length at their ends); blocks until they are made.
    pub fn score<S: AsRef<str>>(&self, query: &str, documents: &[S]) -> Result<Scores, EmbedError> {
        wait_for(|done| self.submit(query, documents, Truncation::Right, done))
    }

    /// Queues the pairs of `query` and each of `documents` and returns at once with a
    /// [`Ticket`] that can withdraw them (a full queue is [`EmbedError::Overloaded`]);
    /// `done` is called, on a worker thread, with the scores once every pair is scored. An
    /// empty query, no documents, more than [`Reranker::MAX_DOCUMENTS`], a text the
    /// tokenizer refuses or (with [`Truncation::Refuse`]) a pair longer than
    /// [`Reranker::max_tokens`] is an `Err` here, and `done` is then never called. An
    /// empty document is scored as it is. `done` should be quick: it runs on the thread
    /// that runs the next batch.
    pub fn submit<S: AsRef<str>>(
        &self,
        query: &str,
        documents: &[S],
        truncation: Truncation,
        done: impl FnOnce(Result<Scores, EmbedError>) + Send + 'static,
    ) -> Result<Ticket, EmbedError> {
        if query.trim().is_empty() {
            return Err(EmbedError::EmptyQuery);
        }
        check_count(documents.len())?;
        let pairs = documents
            .iter()
            .enumerate()
            .map(|(index, d)| self.encode(index, query, d.as_ref(), truncation))
            .collect::<Result<_, _>>()?;
        self.submit_tokens(pairs, done)
    }

    /// The tokens of the pair (`query`, `document`) and their types, as the reranker
    /// runs them: `[CLS] query [SEP] document [SEP]`, types 0 then 1, cut as
    /// `truncation` says (an error names the pair as document `index`).
    pub fn encode(
        &self,
        index: usize,
        query: &str,
        document: &str,
        truncation: Truncation,
    ) -> Result<(Vec<u32>, Vec<u32>), EmbedError> {
        let tokenizer = match truncation {
            Truncation::Right => &self.right,
            Truncation::Left => &self.left,
            Truncation::Refuse => &self.whole,
        };
        let enc = tokenizer
            .encode((query, document), true)
            .map_err(|e| EmbedError::Tokenize {
                index,
                msg: e.to_string(),
            })?;
        if enc.len() > self.max_tokens {
            return Err(EmbedError::TooLong {
                index,
                tokens: enc.len(),
                max: self.max_tokens,
            });
        }
        Ok((enc.get_ids().to_vec(), enc.get_type_ids().to_vec()))
    }

    /// [`Reranker::submit`] for pairs already tokenised: each is the ids of one
    /// sequence (special tokens included, 1 to [`Reranker::max_tokens`] of them, each
    /// in the model's vocabulary) and one token type per id (each below the model's
    /// `type_vocab_size`). A pair that is not so, no pairs or too many is an `Err`
    /// naming it.
    pub fn submit_tokens(
        &self,
        pairs: Vec<(Vec<u32>, Vec<u32>)>,
        done: impl FnOnce(Result<Scores, EmbedError>) + Send + 'static,
    ) -> Result<Ticket, EmbedError> {
        check_count(pairs.len())?;
        let cfg = self.model().config();
        for (index, (ids, types)) in pairs.iter().enumerate() {
            check_ids(index, ids, self.max_tokens, cfg.vocab_size)?;
            check_types(index, ids.len(), types, cfg.type_vocab_size)?;
        }
        let activation = self.activation;
        let done: Done = Box::new(move |r| done(r.and_then(|e| scores(e, activation))));
        let (seqs, types) = pairs.into_iter().unzip();
        self.workers.batcher().submit(seqs, types, (true, 0), done)
    }

    /// Sets the observer told of each batch before it runs (see [`BatchObserver`]);
    /// `None` removes it.
    pub fn observe(&self, observer: Option<std::sync::Arc<dyn BatchObserver>>) {
        self.workers.batcher().observe(observer);
    }

    /// What waits in the queue now, and how many workers are running a batch.
    pub fn queue_depth(&self) -> QueueDepth {
        self.workers.batcher().depth()
    }

    /// How logits become scores (read from the folder).
    pub fn activation(&self) -> ScoreActivation {
        self.activation
    }

    /// The most tokens a pair keeps, special tokens included: the least of the model's
    /// positions (`BertConfig::positions`), sentence_bert_config.json's `max_seq_length` and
    /// tokenizer_config.json's `model_max_length` (the length transformers' tokenizer
    /// cuts to when the CrossEncoder is given none; a value that is not a positive
    /// whole number, such as the 1e30 written when it is unknown, is ignored).
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The settings the reranker runs with.
    pub fn settings(&self) -> &EmbedderSettings {
        self.workers.batcher().settings()
    }

    /// The encoder under the classifier head.
    pub fn model(&self) -> &BertModel {
        self.classifier.model()
    }

    /// The folder's tokenizer as pairs are cut by default ([`Truncation::Right`] at
    /// [`Reranker::max_tokens`], no padding).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.right
    }
}

/// An error unless a request of `n` documents is allowed.
fn check_count(n: usize) -> Result<(), EmbedError> {
    match n {
        0 => Err(EmbedError::NoDocuments),
        n if n > Reranker::MAX_DOCUMENTS => Err(EmbedError::TooManyDocuments {
            count: n,
            max: Reranker::MAX_DOCUMENTS,
        }),
        _ => Ok(()),
    }
}

/// Checks pair `index`'s token types: one per token (`tokens`), each below `kinds`.
fn check_types(index: usize, tokens: usize, types: &[u32], kinds: usize) -> Result<(), EmbedError> {
    let bad = |msg| Err(EmbedError::Tokenize { index, msg });
    if types.len() != tokens {
        return bad(format!(
            "{tokens} tokens but {} token types; give one type per token",
            types.len()
        ));
    }
    match types.iter().position(|&t| t as usize >= kinds) {
        Some(at) => bad(format!(
            "token type {} at position {at}; the model's types are 0 to {}",
            types[at],
            kinds - 1
        )),
        None => Ok(()),
    }
}

/// The batcher's answer (one logit per pair) as [`Scores`]; a NaN logit is an error
/// rather than a score no order can hold.
fn scores(e: Embeddings, activation: ScoreActivation) -> Result<Scores, EmbedError> {
    let logits: Vec<f32> = e
        .vectors
        .iter()
        .map(|v| v.first().copied().unwrap_or(f32::NAN))
        .collect();
    if let Some(i) = logits.iter().position(|x| x.is_nan()) {
        return Err(EmbedError::Model(crate::Error::Internal {
            msg: format!("the reranker's logit for document {i} is NaN"),
        }));
    }
    Ok(Scores {
        scores: logits.iter().map(|&x| activation.apply(x)).collect(),
        logits,
        tokens: e.tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranking_is_by_logit_descending_and_stable() {
        let s = Scores {
            logits: vec![0.5, 2.0, -1.0, 2.0, 0.5],
            scores: vec![0.0; 5],
            tokens: 0,
        };
        assert_eq!(s.ranking(), vec![1, 3, 0, 4, 2]);
        let none = Scores {
            logits: vec![],
            scores: vec![],
            tokens: 0,
        };
        assert!(none.ranking().is_empty());
    }

    #[test]
    fn counts_and_types_are_checked() {
        assert_eq!(check_count(0), Err(EmbedError::NoDocuments));
        assert_eq!(check_count(1), Ok(()));
        assert_eq!(check_count(Reranker::MAX_DOCUMENTS), Ok(()));
        let e = check_count(Reranker::MAX_DOCUMENTS + 1).unwrap_err();
        assert!(e.to_string().contains("at most 2048"), "{e}");
        assert!(e.is_input_error());
        assert_eq!(check_types(0, 3, &[0, 1, 1], 2), Ok(()));
        let e = check_types(4, 3, &[0, 1], 2).unwrap_err().to_string();
        assert!(
            e.starts_with("text 4") && e.contains("3 tokens but 2 token types"),
            "{e}"
        );
        let e = check_types(1, 3, &[0, 2, 1], 2).unwrap_err().to_string();
        assert!(
            e.contains("token type 2 at position 1") && e.contains("0 to 1"),
            "{e}"
        );
    }

    #[test]
    fn logits_become_scores_and_nan_is_an_error() {
        let e = Embeddings {
            vectors: vec![vec![0.0], vec![-2.0]],
            tokens: 9,
        };
        let s = scores(e, ScoreActivation::Sigmoid).unwrap();
        assert_eq!(s.logits, vec![0.0, -2.0]);
        assert_eq!(s.scores[0], 0.5);
        assert!((s.scores[1] - 0.119_202_92).abs() < 1e-7);
        assert_eq!(s.tokens, 9);
        let nan = Embeddings {
            vectors: vec![vec![1.0], vec![f32::NAN]],
            tokens: 2,
        };
        let e = scores(nan, ScoreActivation::Identity).unwrap_err();
        assert!(e.to_string().contains("document 1 is NaN"), "{e}");
        assert!(!e.is_input_error());
    }
}
