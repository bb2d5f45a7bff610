//! The f32 tile on aarch64 NEON: the packed panels every tier shares ([`NR`] = 32
//! columns), multiplied in register blocks of up to `neon::ROWS` = 6 rows by half a
//! panel (`neon::COLS` columns, four vectors of 4 lanes; module `packed::neon`).
//!
//! A block keeps 24 accumulators of the 32 vector registers, four more for the panel's
//! vectors of one step; per step of `k` it loads those four and multiplies each by
//! every row's element of the left operand (`fmla` by a scalar, read in place). A tile
//! of up to [`MR`](super::MR) rows (the row blocks the packed product cuts) runs as row
//! groups of at most 6, as even as possible, each over both halves of the panel, which
//! stays in L1 meanwhile (`k · 128` bytes).
//!
//! Every accumulator is one chain of fused multiply-adds in the order of `k` from
//! zero, as on AVX-512, so the results have the same bits as the scalar loop of fused
//! multiply-adds and as the x86 tiles; the epilogue's steps are applied to the
//! accumulators before they are stored (`packed::neon::finish`, which the bf16 and int8
//! NEON tiles share).
//!
//! Only correctness is checked here (under emulation, `scripts/test-aarch64.sh`); the
//! block's shape follows the usual NEON f32 kernels (24 accumulators, a load of the
//! panel per four `fmla`s) and is not tuned on hardware.

use std::arch::aarch64::*;

use super::super::neon::{finish, for_blocks, COLS, ROWS};
use super::{Tile, NR};

/// The tile for `R` rows: row groups of at most `ROWS`, each over the panel's halves
/// that hold columns of the tile's width.
///
/// # Safety
///
/// `1 <= R`; `t.k >= 1` and `t.b` holds at least `t.k * NR` elements; `t.a` holds
/// more than `(R - 1) * t.lda + (t.k - 1) * t.cs`; `dst` is valid for writes of
/// `(R - 1) * ldc + j0 + width` elements (`t.at`), of which nobody else reads or
/// writes the tile's during the call, and `1 <= width <= NR`; every step of
/// `t.epilogue` has the tile's rows' columns `j0..j0 + width` inside its operand (for
/// a `Operand::Rows`, rows `row0..row0 + R`). (NEON is part of every aarch64 target.)
#[target_feature(enable = "neon")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    for_blocks!(R, ROWS, t.at.width, |i0, half| block(t, i0, half, dst));
}

/// Rows `i0..i0 + H` of the tile by half `half` of its panel: the loop over `k`, then
/// the epilogue and the store of the columns inside the tile's width (`finish`).
///
/// # Safety
///
/// [`tile`]'s contract for a tile of at least `i0 + H` rows, and `half * COLS <
/// t.at.width`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn block<const H: usize>(t: &Tile<'_>, i0: usize, half: usize, dst: *mut f32) {
    let mut acc = [[vdupq_n_f32(0.0); 4]; H];
    let a = t.a.as_ptr().wrapping_add(i0 * t.lda);
    let b = t.b.as_ptr().wrapping_add(half * COLS);
    for p in 0..t.k {
        // SAFETY: p < k, so the panel's row p, b[p * NR + half * COLS..][..16], is
        // inside `t.b` (k * NR elements); a[(i0 + i) * lda + p * cs] for i < H is an
        // element of row i0 + i < R, inside `t.a`.
        unsafe {
            let bp = b.add(p * NR);
            let bv = [
                vld1q_f32(bp),
                vld1q_f32(bp.add(4)),
                vld1q_f32(bp.add(8)),
                vld1q_f32(bp.add(12)),
            ];
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = *a.add(i * t.lda + p * t.cs);
                for (c, &w) in acc.iter_mut().zip(&bv) {
                    *c = vfmaq_n_f32(*c, w, x);
                }
            }
        }
    }
    // SAFETY: the caller's contract: `dst` and the epilogue's operands hold the tile's
    // rows' columns of `t.at`, this block's among them.
    unsafe { finish::<H>((t.epilogue, t.row0, t.at), (i0, half), acc, dst) };
}
