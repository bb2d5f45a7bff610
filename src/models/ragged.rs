//! The ragged batch of the decoder-style families (Qwen3, ModernBERT): sequences
//! packed one after another along the token axis with no padding, each token's
//! position within its sequence beside it (its row of the rotary tables), and the
//! embedding call around a family's forward pass ([`embed`]): check the sequences,
//! pack them, run the pass, pool each sequence's own rows through the [`Head`].
//!
//! BERT's packing (`bert/packed.rs`) differs only in what it keeps beside the ids
//! (absolute position and token-type rows); both bucket the total the same way
//! ([`bucket_tokens`]), so a family's plans see few distinct shapes.

use super::bert::bucket_tokens;
use super::head::Head;
use super::pooling::Span;
use crate::{Error, Result, Tensor};

/// A ragged batch laid out for one forward pass.
pub(crate) struct Packed {
    /// Token ids `[total]` (u32), filler included.
    pub(crate) ids: Tensor,
    /// Each token's position within its sequence `[total]` (u32).
    pub(crate) positions: Tensor,
    /// The sequences' offsets (u32, from 0 to `total`; the filler sequence and empty
    /// ones pad it to a power of two).
    pub(crate) offsets: Tensor,
    /// The row each real sequence starts at.
    pub(crate) starts: Vec<usize>,
}

impl Packed {
    /// Tokens in the batch, filler included.
    pub(crate) fn total(&self) -> usize {
        self.ids.dims()[0]
    }
}

/// The limits a family puts on its input sequences.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// The op named in errors.
    pub(crate) op: &'static str,
    /// Token ids are below it.
    pub(crate) vocab_size: usize,
    /// The longest sequence the model takes.
    pub(crate) max_positions: usize,
}

/// Vectors of `seqs` from one ragged `forward` pass (final states `[total, hidden]`
/// of a [`Packed`] batch) and `head`, in input order: sequence `i`'s first
/// `prompt[i]` tokens are its prompt (left out of pooling unless the head includes
/// prompts), and it is L2-normalised where `normalize[i]`.
pub(crate) fn embed(
    limits: Limits,
    seqs: &[&[u32]],
    head: &Head,
    prompt: &[usize],
    normalize: &[bool],
    forward: impl FnOnce(&Packed) -> Result<Tensor>,
) -> Result<Vec<Vec<f32>>> {
    if normalize.len() != seqs.len() || prompt.len() != seqs.len() {
        return Err(Error::Internal {
            msg: format!(
                "{}: {} normalize flags and {} prompt lengths for {} sequences",
                limits.op,
                normalize.len(),
                prompt.len(),
                seqs.len()
            ),
        });
    }
    if seqs.is_empty() {
        return Ok(Vec::new());
    }
    let packed = pack(limits, seqs)?;
    let spans: Vec<Span> = seqs
        .iter()
        .zip(&packed.starts)
        .zip(prompt)
        .map(|((s, &start), &skip)| Span {
            start,
            len: s.len(),
            skip: skip.min(s.len() - 1),
        })
        .collect();
    let states = forward(&packed)?;
    let v = head.apply(&states, &spans, normalize)?.to_vec::<f32>()?;
    Ok(v.chunks_exact(head.dim()).map(<[f32]>::to_vec).collect())
}

/// `seqs` checked against `limits` and packed, with one filler sequence up to the
/// bucketed length.
pub(crate) fn pack(limits: Limits, seqs: &[&[u32]]) -> Result<Packed> {
    let op = limits.op;
    for (i, s) in seqs.iter().enumerate() {
        if s.is_empty() || s.len() > limits.max_positions {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "sequence {i} has {} tokens; the model takes 1 to {}",
                    s.len(),
                    limits.max_positions
                ),
            });
        }
        if let Some(bad) = s.iter().find(|&&t| t as usize >= limits.vocab_size) {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "sequence {i} has token id {bad}; the vocabulary has {}",
                    limits.vocab_size
                ),
            });
        }
    }
    let real: usize = seqs.iter().map(|s| s.len()).sum();
    let total = bucket_tokens(real);
    if u32::try_from(total).is_err() {
        return Err(Error::Arg {
            op,
            msg: format!("a packed batch of {total} tokens is more than u32 offsets hold"),
        });
    }
    let n_offsets = (seqs.len() + 2).next_power_of_two().max(8);
    let mut ids = Vec::with_capacity(total);
    let mut positions = Vec::with_capacity(total);
    let mut offsets = vec![0u32];
    for s in seqs {
        ids.extend_from_slice(s);
        positions.extend(0..s.len() as u32);
        offsets.push(ids.len() as u32);
    }
    let starts = offsets[..seqs.len()].iter().map(|&o| o as usize).collect();
    // Filler: token 0, one sequence of its own, its states thrown away. Its positions
    // count up from 0 and wrap at the model's longest sequence, so they stay rows of
    // the rotary tables.
    let filler = total - ids.len();
    positions.extend((0..filler).map(|p| (p % limits.max_positions) as u32));
    ids.resize(total, 0);
    offsets.resize(n_offsets, total as u32);
    Ok(Packed {
        ids: Tensor::from_vec(ids, &[total])?,
        positions: Tensor::from_vec(positions, &[total])?,
        offsets: Tensor::from_vec(offsets, &[n_offsets])?,
        starts,
    })
}

/// The cosines and sines of rotate-half rotary angles, `[positions, head_dim / 2]`
/// each: position `p`, pair `i` turns by `p · θ^(-2i / head_dim)`. Computed in f32
/// step by step as Hugging Face's default rotary embedding does (inverse
/// frequencies, then their products with the positions, then cos and sin), so the
/// angles round as its do.
pub(crate) fn rotary_tables(
    theta: f64,
    head_dim: usize,
    positions: usize,
) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let theta = theta as f32;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    let angles: Vec<f32> = (0..positions)
        .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
        .collect();
    Ok((
        Tensor::from_vec(angles.iter().map(|a| a.cos()).collect(), &[positions, half])?,
        Tensor::from_vec(angles.iter().map(|a| a.sin()).collect(), &[positions, half])?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        op: "test_pack",
        vocab_size: 10,
        max_positions: 6,
    };

    #[test]
    fn packing_counts_positions_per_sequence_and_buckets_the_total() {
        let p = pack(LIMITS, &[&[1, 2, 3], &[4]]).unwrap();
        assert_eq!(p.total(), 8);
        assert_eq!(p.ids.to_vec::<u32>().unwrap(), [1, 2, 3, 4, 0, 0, 0, 0]);
        assert_eq!(
            p.positions.to_vec::<u32>().unwrap(),
            [0, 1, 2, 0, 0, 1, 2, 3]
        );
        assert_eq!(p.offsets.to_vec::<u32>().unwrap(), [0, 3, 4, 8, 8, 8, 8, 8]);
        assert_eq!(p.starts, [0, 3]);
    }

    #[test]
    fn bad_sequences_are_named() {
        let long = [1u32; 7];
        for (seqs, what) in [
            (vec![&[][..]], "sequence 0 has 0 tokens"),
            (vec![&[1][..], &long[..]], "sequence 1 has 7 tokens"),
            (vec![&[1, 10][..]], "token id 10"),
        ] {
            let e = pack(LIMITS, &seqs).err().unwrap().to_string();
            assert!(e.contains(what), "{what}: {e}");
        }
    }

    #[test]
    fn rotary_tables_turn_by_position_and_frequency() {
        let (cos, sin) = rotary_tables(100.0, 4, 3).unwrap();
        let (c, s) = (cos.to_vec::<f32>().unwrap(), sin.to_vec::<f32>().unwrap());
        // Pair 1 of position 2 turns by 2 · 100^(-1/2) = 0.2.
        assert!((c[5] - 0.2f32.cos()).abs() < 1e-7 && (s[5] - 0.2f32.sin()).abs() < 1e-7);
        assert_eq!((c[0], s[0]), (1.0, 0.0));
    }
}
