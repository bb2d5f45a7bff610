//! The native `Embedder` and `Reranker` (`streamfuse._streamfuse._Embedder`,
//! `_Reranker`): one Rust [`Embedder`]/[`Reranker`] each, so one copy of the weights
//! whatever the number of Python threads calling it. A call copies its texts out of
//! Python, then releases the GIL for the rest: tokenising, queueing every chunk of
//! `batch_size` texts at once on the embedder's workers (which batch the texts of all
//! callers together, each worker on its own stream), and waiting for the answers. It
//! takes the GIL back only to report progress (when asked) and, every 100 ms of
//! waiting, to let Ctrl-C through. The sentence-transformers-style API (`encode`,
//! `predict`, `rank`, prompts, the progress bar) is the Python wrapper's
//! (python/streamfuse/models.py).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use streamfuse::embedder::{
    EmbedError, Embedder, EmbedderSettings, Embeddings, Reranker, Scores, Truncation,
};

use crate::errors::embed_err;

/// The constructor's settings as the Python wrapper passes them: `(precision,
/// workers, max_batch_tokens, kernel_threads)`; `workers` `None` is one per core,
/// `kernel_threads` 0 shares the cores between the workers (all of them for a batch
/// that runs alone).
#[derive(FromPyObject)]
pub struct Args(String, Option<usize>, usize, usize);

/// Loads a folder with `load` and the settings `args` say, without the GIL.
fn load<T: Send>(
    py: Python<'_>,
    path: PathBuf,
    args: Args,
    load: fn(&std::path::Path, EmbedderSettings) -> Result<T, EmbedError>,
) -> PyResult<T> {
    let Args(precision, workers, max_batch_tokens, kernel_threads) = args;
    let mut s = EmbedderSettings {
        precision: precision.parse().map_err(PyValueError::new_err)?,
        max_batch_tokens,
        kernel_threads,
        ..Default::default()
    };
    if let Some(w) = workers {
        s.workers = w;
    }
    py.detach(|| load(&path, s)).map_err(embed_err)
}

/// Waits for `chunks` answers on `rx` without the GIL, calling `progress(k)` (with
/// the GIL) as each chunk of `k` items comes back, and checking for Ctrl-C every
/// 100 ms. Each answer is `(chunk index, its result)`; `place` stores it.
fn gather<T: Send>(
    py: Python<'_>,
    rx: mpsc::Receiver<(usize, Result<T, EmbedError>)>,
    chunks: usize,
    progress: Option<&Py<PyAny>>,
    mut place: impl FnMut(usize, T) -> usize + Send,
) -> PyResult<()> {
    py.detach(move || {
        let mut left = chunks;
        while left > 0 {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok((c, r)) => {
                    let n = place(c, r.map_err(embed_err)?);
                    left -= 1;
                    if let Some(p) = progress {
                        Python::attach(|py| p.call1(py, (n,)).map(drop))?;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => Python::attach(|py| py.check_signals())?,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(embed_err(EmbedError::Workers("a request was lost".into())))
                }
            }
        }
        Ok(())
    })
}

/// The chunk size, checked.
fn chunk(batch_size: usize) -> PyResult<usize> {
    if batch_size == 0 {
        return Err(PyValueError::new_err("batch_size must be at least 1"));
    }
    Ok(batch_size)
}

/// Sentence embeddings from a sentence-transformers folder (the native half of
/// `streamfuse.Embedder`).
#[pyclass(frozen, module = "streamfuse._streamfuse", name = "_Embedder")]
pub struct PyEmbedder {
    inner: Embedder,
}

#[pymethods]
impl PyEmbedder {
    /// Loads the folder `path` and starts its worker threads as `args` say.
    #[new]
    fn new(py: Python<'_>, path: PathBuf, args: Args) -> PyResult<Self> {
        let inner = load(py, path, args, |p, s| Embedder::load_with(p, s))?;
        Ok(PyEmbedder { inner })
    }

    /// One float32 vector per text, as an array `(len(texts), dim)`: L2-normalised
    /// when the folder's modules end with `Normalize` or `normalize` asks for it (as
    /// sentence-transformers' `normalize_embeddings`); the texts go to the workers in
    /// chunks of `batch_size`, all queued at once, and `progress(k)` is called as each
    /// chunk of `k` texts is done. An empty or all-whitespace text is `[CLS] [SEP]`
    /// (see [`Embedder::token_ids`]).
    #[pyo3(signature = (texts, batch_size = 32, progress = None, normalize = false))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        batch_size: usize,
        progress: Option<Py<PyAny>>,
        normalize: bool,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let normalize = normalize || self.inner.normalizes();
        let size = chunk(batch_size)?;
        let dim = self.inner.dim();
        let n = texts.len();
        let (tx, rx) = mpsc::channel::<(usize, Result<Embeddings, EmbedError>)>();
        let chunks = py.detach(|| -> PyResult<usize> {
            let mut count = 0;
            for (c, part) in texts.chunks(size).enumerate() {
                let seqs = self
                    .inner
                    .token_ids(part)
                    .map_err(|e| embed_err(offset(e, c * size)))?;
                let tx = tx.clone();
                self.inner
                    .submit_tokens_normalizing(seqs, normalize, move |r| {
                        let _ = tx.send((c, r));
                    })
                    .map_err(|e| embed_err(offset(e, c * size)))?;
                count += 1;
            }
            Ok(count)
        })?;
        drop(tx);
        let mut out = vec![0f32; n * dim];
        gather(py, rx, chunks, progress.as_ref(), |c, e: Embeddings| {
            for (i, v) in e.vectors.iter().enumerate() {
                let row = c * size + i;
                out[row * dim..(row + 1) * dim].copy_from_slice(v);
            }
            e.vectors.len()
        })?;
        let array = Array2::from_shape_vec((n, dim), out)
            .map_err(|e| crate::errors::internal(e.to_string()))?;
        Ok(array.into_pyarray(py))
    }

    /// Width of the vectors.
    #[getter]
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// The most tokens a text keeps (longer ones are truncated).
    #[getter]
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens()
    }

    /// Worker threads.
    #[getter]
    fn workers(&self) -> usize {
        self.inner.settings().workers
    }

    /// The token ids the embedder runs for `text` (special tokens included, after
    /// truncation).
    fn tokenize(&self, py: Python<'_>, text: String) -> PyResult<Vec<u32>> {
        py.detach(|| {
            self.inner
                .tokenizer()
                .encode(text.as_str(), true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| PyValueError::new_err(e.to_string()))
        })
    }
}

/// `e` with the text index it names moved by `by` (a chunk's index → the call's).
fn offset(e: EmbedError, by: usize) -> EmbedError {
    match e {
        EmbedError::EmptyText { index } => EmbedError::EmptyText { index: index + by },
        EmbedError::Tokenize { index, msg } => EmbedError::Tokenize {
            index: index + by,
            msg,
        },
        EmbedError::TooLong { index, tokens, max } => EmbedError::TooLong {
            index: index + by,
            tokens,
            max,
        },
        other => other,
    }
}

/// A reranker call's answer: the logits and the scores, one of each per pair.
type LogitsAndScores<'py> = (Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>);

/// Relevance scores from a CrossEncoder folder (the native half of
/// `streamfuse.Reranker`).
#[pyclass(frozen, module = "streamfuse._streamfuse", name = "_Reranker")]
pub struct PyReranker {
    inner: Reranker,
}

#[pymethods]
impl PyReranker {
    /// Loads the folder `path` and starts its worker threads as `args` say.
    #[new]
    fn new(py: Python<'_>, path: PathBuf, args: Args) -> PyResult<Self> {
        let inner = load(py, path, args, |p, s| Reranker::load_with(p, s))?;
        Ok(PyReranker { inner })
    }

    /// The logits and the scores (the logits through the folder's activation) of
    /// (query, document) `pairs`, two float32 arrays in the pairs' order; pairs longer
    /// than the model takes are cut from the end of their longer side.
    #[pyo3(signature = (pairs, batch_size = 32, progress = None))]
    fn score_pairs<'py>(
        &self,
        py: Python<'py>,
        pairs: Vec<(String, String)>,
        batch_size: usize,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<LogitsAndScores<'py>> {
        let size = chunk(batch_size)?.min(Reranker::MAX_DOCUMENTS);
        let n = pairs.len();
        let (tx, rx) = mpsc::channel::<(usize, Result<Scores, EmbedError>)>();
        let chunks = py.detach(|| -> PyResult<usize> {
            let mut count = 0;
            for (c, part) in pairs.chunks(size).enumerate() {
                let mut tokens = Vec::with_capacity(part.len());
                for (i, (q, d)) in part.iter().enumerate() {
                    if q.trim().is_empty() {
                        return Err(PyValueError::new_err(format!(
                            "pair {}: the query is empty; a query needs some content",
                            c * size + i
                        )));
                    }
                    let pair = self.inner.encode(c * size + i, q, d, Truncation::Right);
                    tokens.push(pair.map_err(embed_err)?);
                }
                let tx = tx.clone();
                self.inner
                    .submit_tokens(tokens, move |r| {
                        let _ = tx.send((c, r));
                    })
                    .map_err(embed_err)?;
                count += 1;
            }
            Ok(count)
        })?;
        drop(tx);
        let (mut logits, mut scores) = (vec![0f32; n], vec![0f32; n]);
        gather(py, rx, chunks, progress.as_ref(), |c, s: Scores| {
            let at = c * size;
            logits[at..at + s.logits.len()].copy_from_slice(&s.logits);
            scores[at..at + s.scores.len()].copy_from_slice(&s.scores);
            s.logits.len()
        })?;
        Ok((logits.into_pyarray(py), scores.into_pyarray(py)))
    }

    /// The most tokens a pair keeps.
    #[getter]
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens()
    }
}
