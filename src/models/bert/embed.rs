//! The API over token ids: [`BertModel::embed_batch`] pads a few sequences into one
//! forward pass, and [`BertModel::embed`] batches many by length
//! ([`length_sorted_batches`]) over one or several threads, each with its own stream.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::BertModel;
use crate::{Error, Result, Tensor};

/// How [`BertModel::embed`] batches and spreads its work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbedOptions {
    /// Sequences per forward pass (at least 1).
    pub batch: usize,
    /// Threads, each with its own stream, that take batches in turn (at least 1).
    pub threads: usize,
    /// Kernel threads of each stream (see [`set_kernel_threads`](crate::set_kernel_threads));
    /// `None` picks: all cores for one thread, else the cores split between threads.
    pub kernel_threads: Option<usize>,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            batch: 32,
            threads: 1,
            kernel_threads: None,
        }
    }
}

impl BertModel {
    /// Embeddings of a few token sequences in one forward pass, padded to the longest
    /// of them. Each sequence must have 1 to `BertConfig::positions` tokens, each
    /// below `vocab_size`.
    pub fn embed_batch(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let op = "bert_embed";
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let l = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        for (i, s) in seqs.iter().enumerate() {
            self.check_sequence(op, i, s)?;
        }
        let b = seqs.len();
        let mut ids = vec![self.config.pad_token_id; b * l];
        let mut mask = vec![0.0f32; b * l];
        for (i, s) in seqs.iter().enumerate() {
            ids[i * l..i * l + s.len()].copy_from_slice(s);
            mask[i * l..i * l + s.len()].fill(1.0);
        }
        let ids = Tensor::from_vec(ids, &[b, l])?;
        let mask = Tensor::from_vec(mask, &[b, l])?;
        let out = self.forward(&ids, &mask)?.to_vec::<f32>()?;
        Ok(out.chunks_exact(self.dim()).map(|c| c.to_vec()).collect())
    }

    pub(super) fn check_sequence(&self, op: &'static str, i: usize, s: &[u32]) -> Result<()> {
        let max = self.config.positions();
        if s.is_empty() || s.len() > max {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "sequence {i} has {} tokens; sequences need 1 to {max}",
                    s.len()
                ),
            });
        }
        if let Some(&bad) = s.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "sequence {i} has token id {bad}, outside the vocabulary of {}",
                    self.config.vocab_size
                ),
            });
        }
        Ok(())
    }

    /// Embeddings of many token sequences, returned in input order.
    ///
    /// Sequences are sorted by length and cut into batches of `opts.batch`
    /// neighbours, so each batch is padded only to its own longest sequence. With
    /// `opts.threads > 1`, that many threads (each its own stream) share this model's
    /// weights and take batches in turn, longest first.
    pub fn embed(&self, seqs: &[Vec<u32>], opts: &EmbedOptions) -> Result<Vec<Vec<f32>>> {
        let op = "bert_embed";
        if opts.batch == 0 || opts.threads == 0 {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "batch and threads must be at least 1, got batch {} and threads {}",
                    opts.batch, opts.threads
                ),
            });
        }
        for (i, s) in seqs.iter().enumerate() {
            self.check_sequence(op, i, s)?;
        }
        let batches = length_sorted_batches(seqs, opts.batch);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = opts.threads.min(batches.len().max(1));
        let kernel_threads = opts.kernel_threads.unwrap_or(if threads == 1 {
            0
        } else {
            (cores / threads).max(1)
        });
        let results: Mutex<Vec<Option<Vec<f32>>>> = Mutex::new(vec![None; seqs.len()]);
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        let work = || {
            if opts.kernel_threads.is_some() || threads > 1 {
                crate::set_kernel_threads(kernel_threads);
            }
            while !failed.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(batch) = batches.get(i) else { break };
                let refs: Vec<&[u32]> = batch.iter().map(|&j| seqs[j].as_slice()).collect();
                match self.embed_batch(&refs) {
                    Ok(embs) => {
                        let mut r = results.lock();
                        for (&j, e) in batch.iter().zip(embs) {
                            r[j] = Some(e);
                        }
                    }
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        first_error.lock().get_or_insert(e);
                    }
                }
            }
        };
        if threads <= 1 {
            work();
        } else {
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(work);
                }
            });
        }
        if let Some(e) = first_error.into_inner() {
            return Err(e);
        }
        results
            .into_inner()
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                e.ok_or_else(|| Error::Kernel {
                    op,
                    msg: format!("sequence {i} was not embedded (a worker thread panicked)"),
                })
            })
            .collect()
    }
}

/// Indices of `seqs` cut into batches of at most `batch` sequences of similar length:
/// sorted by length (longest first, ties in input order), then chunked.
pub fn length_sorted_batches(seqs: &[Vec<u32>], batch: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].len()));
    order.chunks(batch.max(1)).map(|c| c.to_vec()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_group_similar_lengths() {
        let seqs: Vec<Vec<u32>> = [3, 9, 1, 8, 2, 9].iter().map(|&n| vec![1; n]).collect();
        let b = length_sorted_batches(&seqs, 2);
        assert_eq!(b, vec![vec![1, 5], vec![3, 0], vec![4, 2]]);
    }

    #[test]
    fn batches_keep_every_sentence_once_longest_first() {
        let lens = [5usize, 0, 17, 3, 3, 12, 1, 9, 9, 2, 30];
        let seqs: Vec<Vec<u32>> = lens.iter().map(|&n| vec![7; n]).collect();
        for batch in [0, 1, 3, 4, 11, 50] {
            let b = length_sorted_batches(&seqs, batch);
            assert!(b.iter().all(|c| !c.is_empty() && c.len() <= batch.max(1)));
            let flat: Vec<usize> = b.concat();
            let mut seen = flat.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..lens.len()).collect::<Vec<_>>(), "batch {batch}");
            assert!(
                flat.windows(2).all(|w| lens[w[0]] >= lens[w[1]]),
                "batch {batch}: {flat:?} not longest first"
            );
        }
        assert!(length_sorted_batches(&[], 4).is_empty());
    }
}
