//! How close one set of embeddings is to another: the accuracy report of a reduced
//! precision against f32 (`examples/minilm --precision P --compare f32`, and the
//! contract `tests/minilm.rs` holds).
//!
//! Two measures, each summarised by its minimum, median and mean over the sentences:
//! the cosine between a sentence's two embeddings, and a retrieval check, the share
//! of a sentence's `k` nearest neighbours (by cosine, among the other sentences) that
//! both sets agree on. The second is what a search index built on the embeddings would
//! notice.

use std::fmt;

/// Minimum, median and mean of a measure over the sentences.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The smallest value.
    pub min: f64,
    /// The median (the upper one for an even count).
    pub median: f64,
    /// The mean.
    pub mean: f64,
}

impl Summary {
    /// The summary of `values` (all zero when empty).
    fn of(mut values: Vec<f64>) -> Summary {
        if values.is_empty() {
            return Summary {
                min: 0.0,
                median: 0.0,
                mean: 0.0,
            };
        }
        values.sort_by(f64::total_cmp);
        Summary {
            min: values[0],
            median: values[values.len() / 2],
            mean: values.iter().sum::<f64>() / values.len() as f64,
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "min {:.6} median {:.6} mean {:.6}",
            self.min, self.median, self.mean
        )
    }
}

/// How close embeddings are to reference ones of the same sentences.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agreement {
    /// Cosine between each sentence's embedding and its reference.
    pub cosine: Summary,
    /// Share of each sentence's `k` nearest neighbours that the reference also has.
    pub overlap: Summary,
    /// The `k` of `overlap` (fewer when there are not `k` other sentences).
    pub k: usize,
}

/// Compares `test` with `reference` (the same sentences in the same order; any
/// lengths, not necessarily normalised). `k` neighbours for the retrieval check.
/// Sentences without a counterpart (when the lengths differ) are ignored.
pub fn agreement(test: &[Vec<f32>], reference: &[Vec<f32>], k: usize) -> Agreement {
    let n = test.len().min(reference.len());
    let cosines = Summary::of((0..n).map(|i| cosine(&test[i], &reference[i])).collect());
    let k = k.min(n.saturating_sub(1));
    let neighbours = |set: &[Vec<f32>], i: usize| -> Vec<usize> {
        let mut others: Vec<(f64, usize)> = (0..n)
            .filter(|&j| j != i)
            .map(|j| (cosine(&set[i], &set[j]), j))
            .collect();
        others.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        others.into_iter().take(k).map(|(_, j)| j).collect()
    };
    let overlap = Summary::of(
        (0..n)
            .map(|i| {
                if k == 0 {
                    return 1.0;
                }
                let a = neighbours(test, i);
                let b = neighbours(reference, i);
                a.iter().filter(|j| b.contains(j)).count() as f64 / k as f64
            })
            .collect(),
    );
    Agreement {
        cosine: cosines,
        overlap,
        k,
    }
}

/// The cosine of two vectors, in f64 (0 when either is zero).
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    dot / (na.sqrt() * nb.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_sets_agree_fully_and_a_swapped_neighbour_is_counted() {
        let set: Vec<Vec<f32>> = (0..6)
            .map(|i| vec![1.0, i as f32, (i * i) as f32 * 0.1])
            .collect();
        let a = agreement(&set, &set, 2);
        assert_eq!(a.k, 2);
        assert!((a.cosine.min - 1.0).abs() < 1e-12 && a.overlap.min == 1.0);
        // Moving one vector far away changes its own cosine and others' neighbours.
        let mut moved = set.clone();
        moved[3] = vec![-1.0, 0.0, 5.0];
        let b = agreement(&moved, &set, 2);
        assert!(b.cosine.min < 0.5 && b.overlap.min < 1.0 && b.cosine.median > 0.999);
        // k larger than the set is cut to the other sentences.
        assert_eq!(agreement(&set[..3], &set[..3], 10).k, 2);
        assert_eq!(agreement(&[], &[], 10).overlap.mean, 0.0);
    }
}
