//! A packed (ragged) batch of the attention kernel: sequences laid one after another
//! along the token axis ([`Packed`]), each run as a one-entry [`Job`] whose rows start
//! at its first token, the sequences shared between threads near the middle token.

use super::{Bias, Operands, Window};

/// A packed batch: each sequence runs as a [`Job`] of one batch entry whose rows
/// start at the sequence's first token.
pub(super) struct Packed<'a> {
    /// q, k and v, `[1, heads, total, dh]` (k and v of fewer heads).
    pub(super) ops: Operands<'a>,
    /// Sequence `s` is tokens `offsets[s]..offsets[s + 1]`.
    pub(super) offsets: &'a [u32],
    /// The bias by position within a sequence (batch dim 1), for every sequence.
    pub(super) bias: Option<Bias<'a>>,
    pub(super) scale: f32,
    /// The keys each query sees, by position within its sequence.
    pub(super) window: Window,
}

impl Packed<'_> {
    /// Sequences `range`, whose rows are `out`, cut in up to `pieces` parts run at
    /// once (`rayon::join`, near the middle token); one sequence left takes the
    /// remaining pieces for its blocks.
    pub(super) fn seqs(&self, range: std::ops::Range<usize>, out: &mut [f32], pieces: usize) {
        let row = self.ops.dims[1] * self.ops.dims[3];
        let at = |s: usize| self.offsets[s] as usize;
        if pieces > 1 && range.len() > 1 {
            let half = (at(range.start) + at(range.end)) / 2;
            let n = self.offsets[range.clone()].partition_point(|&o| o as usize <= half);
            let mid = (range.start + n).clamp(range.start + 1, range.end - 1);
            let (left, right) = out.split_at_mut((at(mid) - at(range.start)) * row);
            rayon::join(
                || self.seqs(range.start..mid, left, pieces / 2),
                || self.seqs(mid..range.end, right, pieces - pieces / 2),
            );
            return;
        }
        let mut done = 0;
        for s in range {
            let (first, len) = (at(s), at(s + 1) - at(s));
            if len == 0 {
                continue;
            }
            let mut job = self.ops.job(self.bias, self.scale, self.window, len, len);
            job.qr = job.qr.starting_at(first);
            job.kr = job.kr.starting_at(first);
            job.vr = job.vr.starting_at(first);
            let rows = &mut out[done..done + len * row];
            job.blocks(0..job.blocks_per_seq, rows, pieces);
            done += len * row;
        }
    }
}
