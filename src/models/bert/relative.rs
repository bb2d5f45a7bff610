//! MPNet's relative position bias: a learned bias per attention head for each bucket
//! of the distance from a query to a key, the same in every layer, added to the
//! attention scores before the softmax ([`RelativeBias`]).
//!
//! Distances are bucketed as T5 and MPNet do it: half the buckets for keys before the
//! query and half for keys after; within a half, the first quarter of the buckets
//! hold one distance each, and the rest cover distances up to `max_distance` (128)
//! on a logarithmic scale, everything farther sharing the last bucket. The bucket of
//! a distance is computed here exactly as Hugging Face's
//! `MPNetEncoder.relative_position_bucket` does, in f32, so the boundaries fall where
//! its do (the unit test holds every distance up to 600 to its table).
//!
//! The bias itself is engine ops: the bucket of each (query, key) pair of a sequence
//! of length `l` is data (a `[l * l]` u32 index), and `index_select` of the
//! `[buckets, heads]` table by it, permuted to `[1, heads, l, l]`, is what attention
//! adds. It depends only on the distance, so it serves every sequence of a batch, and
//! one computation serves every layer.

use crate::{Result, Tensor};

/// The farthest distance with a bucket of its own range (Hugging Face's default, which
/// MPNet's config does not expose).
const MAX_DISTANCE: usize = 128;

/// The bucket of the distance `key - query` among `num_buckets` (at least 4).
pub(super) fn bucket(rel: i64, num_buckets: usize) -> usize {
    let half = num_buckets / 2;
    // Hugging Face negates: keys after the query take the upper half.
    let n = -rel;
    let base = if n < 0 { half } else { 0 };
    let n = n.unsigned_abs() as usize;
    let exact = half / 2;
    if n < exact {
        return base + n;
    }
    // In f32, as torch computes `log(n.float() / max_exact) / log(max_distance /
    // max_exact) * (num_buckets - max_exact)` before truncating it.
    let ratio = (n as f32 / exact as f32).ln();
    let span = ((MAX_DISTANCE as f64) / (exact as f64)).ln() as f32;
    let large = exact + (ratio / span * (half - exact) as f32) as usize;
    base + large.min(half - 1)
}

/// The learned table of a model with relative position buckets.
pub(super) struct RelativeBias {
    /// `[num_buckets, heads]`: the bias of each bucket for each head.
    table: Tensor,
    num_buckets: usize,
}

impl RelativeBias {
    /// The bias over `table` (`[num_buckets, heads]`, f32).
    pub(super) fn new(table: Tensor) -> RelativeBias {
        let num_buckets = table.dims()[0];
        RelativeBias { table, num_buckets }
    }

    /// The bias of the scores of a sequence of `l` tokens, `[1, heads, l, l]`:
    /// element `(0, h, i, j)` is head `h`'s bias for query `i` and key `j`.
    pub(super) fn scores(&self, l: usize) -> Result<Tensor> {
        let heads = self.table.dims()[1];
        let idx: Vec<u32> = (0..l as i64)
            .flat_map(|i| (0..l as i64).map(move |j| (i, j)))
            .map(|(i, j)| bucket(j - i, self.num_buckets) as u32)
            .collect();
        let idx = Tensor::from_vec(idx, &[l * l])?;
        self.table
            .index_select(&idx, 0)?
            .reshape(&[l, l, heads])?
            .permute(&[2, 0, 1])?
            .unsqueeze(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hugging Face's buckets (transformers 5.24, `relative_position_bucket` with 32
    /// buckets) for every distance from -600 to 600, as runs: each run starts at the
    /// distance given and lasts until the next.
    const HF_RUNS: [(i64, usize); 31] = [
        (-600, 15),
        (-90, 14),
        (-63, 13),
        (-45, 12),
        (-31, 11),
        (-22, 10),
        (-15, 9),
        (-11, 8),
        (-7, 7),
        (-6, 6),
        (-5, 5),
        (-4, 4),
        (-3, 3),
        (-2, 2),
        (-1, 1),
        (0, 0),
        (1, 17),
        (2, 18),
        (3, 19),
        (4, 20),
        (5, 21),
        (6, 22),
        (7, 23),
        (8, 24),
        (12, 25),
        (16, 26),
        (23, 27),
        (32, 28),
        (46, 29),
        (64, 30),
        (91, 31),
    ];

    #[test]
    fn buckets_match_hugging_face_at_every_distance() {
        for rel in -600i64..=600 {
            let run = HF_RUNS.iter().rev().find(|(from, _)| *from <= rel).unwrap();
            assert_eq!(bucket(rel, 32), run.1, "distance {rel}");
        }
    }

    #[test]
    fn the_scores_bias_reads_the_table_by_bucket() {
        // 32 buckets, 2 heads: head h's bias for bucket b is 100 h + b.
        let table: Vec<f32> = (0..32)
            .flat_map(|b| (0..2).map(move |h| (100 * h + b) as f32))
            .collect();
        let rb = RelativeBias::new(Tensor::from_vec(table, &[32, 2]).unwrap());
        let s = rb.scores(20).unwrap();
        assert_eq!(s.dims(), &[1, 2, 20, 20]);
        let v = s.contiguous().unwrap().to_vec::<f32>().unwrap();
        for h in 0..2 {
            for i in 0..20i64 {
                for j in 0..20i64 {
                    let at = (h * 400 + i * 20 + j) as usize;
                    assert_eq!(v[at], (100 * h as usize + bucket(j - i, 32)) as f32);
                }
            }
        }
    }
}
