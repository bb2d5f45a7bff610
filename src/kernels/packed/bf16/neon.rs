//! The bf16 tiles on aarch64, over the pair panels every tier shares (module `bf16`:
//! rows `2q` and `2q + 1` of a column in one 32-bit pair), in the register blocks of
//! `packed::neon`, each with the chain's epilogue (`packed::neon::finish`, the f32
//! tile's bits):
//!
//! - **widened** (any NEON CPU; where it lacks the bf16 instructions): up to 5 rows by
//!   half a panel. Per pair of the half panel (one 64-byte line), four loads, and each
//!   vector's low halves shifted up (`shl` by 16: row `2q` as f32) and high halves
//!   masked (`and`: row `2q + 1`); then per row `fmla` by its element `2q`, then by
//!   `2q + 1`, the left rows in f32 read in place. So each sum is one chain of fused
//!   multiply-adds in the order of `k` over the widened weight: the f32 NEON tile's
//!   bits over f32 weights rounded to bf16 (the tests hold it there). 20 accumulators
//!   and the 8 widened vectors (6 rows would need 33 registers).
//! - **`bfmmla`** (FEAT_BF16, tier `neon-i8mm` on CPUs that have it): per two pairs of
//!   `k`, a 2 × 4 by 4 × 2 bf16 product into 2 × 2 f32 sums (`packed::neon::mmla`,
//!   shared with the int8 `smmla` tile), 16 multiply-adds an instruction, on the left
//!   rows rounded to bf16 pairs. Arm's bf16 instructions round their sums their own
//!   way: each pair's two products (exact) are added and rounded, then added to the
//!   running sum and rounded again, both **to odd** (and denormals flushed to zero
//!   without FEAT_EBF16). Each rounding errs by less than an ulp, at most 2⁻²³ of the
//!   magnitude summed so far, so over the `kp` pairs a sum stays within `kp · 2⁻²² ·
//!   Σ|ã·b̃|` of the exact sum of the rounded operands' products (the tests hold it
//!   there): 4.6e-5 of `Σ|ã·b̃|` at MiniLM's `k` of 384, beside the `2 · 2⁻⁸` the
//!   rounding of the operands costs.
//!
//! `bfmmla` is written in `asm!` (its intrinsic is not stable Rust), in a function
//! compiled with its target feature, which the caller has checked the CPU has. Only
//! correctness is checked here (under emulation); the shapes are not tuned on
//! hardware.

use std::arch::aarch64::*;

use super::super::neon::mmla::{block as mmla_block_of, instruction};
use super::super::neon::{finish, for_blocks, COLS, ROWS};
use super::{Tile, Wide, NR};

/// Most rows of a block of the widened tile.
const WIDE_ROWS: usize = 5;

/// The widened tile for `R` rows, block by block.
///
/// # Safety
///
/// `1 <= R`; `t.k >= 1` and `t.b` holds at least `ceil(t.k / 2) * NR` pairs; `t.a`
/// holds more than `(R - 1) * t.lda + t.k - 1` elements (row `i`'s element `p` at `i *
/// t.lda + p`); `dst` is valid for writes of `(R - 1) * ldc + j0 + width` elements
/// (`t.at`), of which nobody else reads or writes the tile's during the call, and `1 <=
/// width <= NR`; every step of `t.epilogue` has the tile's rows' columns `j0..j0 +
/// width` inside its operand (for a `Operand::Rows`, rows `row0..row0 + R`).
#[target_feature(enable = "neon")]
pub(super) unsafe fn wide_tile<const R: usize>(t: &Wide<'_>, dst: *mut f32) {
    for_blocks!(R, WIDE_ROWS, t.at.width, |i0, half| wide_block(
        t, i0, half, dst
    ));
}

/// The low (row `2q`) and high (row `2q + 1`) bf16 of four pairs, as f32 (exact).
#[inline]
#[target_feature(enable = "neon")]
fn widen(pairs: uint32x4_t) -> (float32x4_t, float32x4_t) {
    let lo = vshlq_n_u32::<16>(pairs);
    let hi = vandq_u32(pairs, vdupq_n_u32(0xffff_0000));
    (vreinterpretq_f32_u32(lo), vreinterpretq_f32_u32(hi))
}

/// Rows `i0..i0 + H` of the tile by half `half` of its panel, widened to f32: per pair
/// of `k`, `acc = w_lo · a[2q] + acc`, then `w_hi · a[2q + 1] + acc`; an odd `k`'s last
/// element alone. Then the epilogue and the store.
///
/// # Safety
///
/// [`wide_tile`]'s contract for a tile of at least `i0 + H` rows, and `half * COLS <
/// t.at.width`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn wide_block<const H: usize>(t: &Wide<'_>, i0: usize, half: usize, dst: *mut f32) {
    let mut acc = [[vdupq_n_f32(0.0); 4]; H];
    let b = t.b.as_ptr().wrapping_add(half * COLS);
    let a = t.a.as_ptr().wrapping_add(i0 * t.lda);
    // The half panel's pair row `q`, widened.
    let pair_row = |q: usize| {
        // SAFETY: (each call) q < ceil(k / 2), so b[q * NR + half * COLS..][..16] is
        // inside `t.b` (ceil(k / 2) * NR pairs); the CPU has NEON (the caller's
        // contract).
        unsafe {
            let bq = b.add(q * NR);
            [0, 4, 8, 12].map(|o| widen(vreinterpretq_u32_u8(vld1q_u8(bq.add(o).cast()))))
        }
    };
    for q in 0..t.k / 2 {
        let w = pair_row(q);
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: 2q + 1 < k: elements 2q and 2q + 1 of row i0 + i < R are inside
            // `t.a`.
            let (x0, x1) = unsafe {
                let row = a.add(i * t.lda + 2 * q);
                (*row, *row.add(1))
            };
            for (c, &(lo, _)) in acc.iter_mut().zip(&w) {
                *c = vfmaq_n_f32(*c, lo, x0);
            }
            for (c, &(_, hi)) in acc.iter_mut().zip(&w) {
                *c = vfmaq_n_f32(*c, hi, x1);
            }
        }
    }
    if t.k % 2 == 1 {
        // The last pair's low halves (its high ones are the packing's zeros, with no
        // element of the rows to multiply).
        let w = pair_row(t.k / 2);
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: element k - 1 of row i0 + i < R is inside `t.a`.
            let x = unsafe { *a.add(i * t.lda + t.k - 1) };
            for (c, &(lo, _)) in acc.iter_mut().zip(&w) {
                *c = vfmaq_n_f32(*c, lo, x);
            }
        }
    }
    // SAFETY: the caller's contract: `dst` and the epilogue's operands hold the tile's
    // rows' columns of `t.at`, this block's among them.
    unsafe { finish::<H>((t.epilogue, t.row0, t.at), (i0, half), acc, dst) };
}

/// The `bfmmla` tile for `rows` rows (1 to `MR`), block by block.
///
/// # Safety
///
/// The CPU has FEAT_BF16; `t.kp >= 1`, `t.b` holds at least `t.kp * NR` pairs and
/// `t.a` at least `rows * t.kp`; `dst` is valid for writes of `(rows - 1) * ldc + j0 +
/// width` elements (`t.at`), of which nobody else reads or writes the tile's during
/// the call, and `1 <= width <= NR`; every step of `t.epilogue` has the tile's rows'
/// columns `j0..j0 + width` inside its operand (for a `Operand::Rows`, rows `row0..row0 +
/// rows`).
#[target_feature(enable = "neon")]
pub(super) unsafe fn mmla_tile(t: &Tile<'_>, rows: usize, dst: *mut f32) {
    for_blocks!(rows, ROWS, t.at.width, |i0, half| mmla_block(
        t, i0, half, dst
    ));
}

instruction!(
    /// `bfmmla`: two rows × 4 bf16 by 4 bf16 × two columns into 2 × 2 f32 sums,
    /// `[r0·c0, r0·c1, r1·c0, r1·c1]` (as bits), rounded as module `bf16::neon` says.
    Bfmmla,
    "bfmmla",
    "8h",
    "neon,bf16"
);

/// Rows `i0..i0 + H` of the tile by half `half` of its panel on `bfmmla`
/// (`packed::neon::mmla` over the pairs of `k`), then the epilogue and the store.
///
/// # Safety
///
/// [`mmla_tile`]'s contract (FEAT_BF16) for a tile of at least `i0 + H` rows, and
/// `half * COLS < t.at.width`.
#[target_feature(enable = "neon,bf16")]
unsafe fn mmla_block<const H: usize>(t: &Tile<'_>, i0: usize, half: usize, dst: *mut f32) {
    // SAFETY: the CPU has FEAT_BF16; rows i0..i0 + H of `t.a` hold kp pairs each, kp
    // apart, and the panel's half holds 64 bytes of each pair row.
    let rows = unsafe {
        let a = t.a.as_ptr().add(i0 * t.kp).cast::<u8>();
        let b = t.b.as_ptr().add(half * COLS).cast::<u8>();
        mmla_block_of::<Bfmmla, H>(a, 4 * t.kp, t.kp, b)
    };
    let acc = rows.map(|row| row.map(|x| vreinterpretq_f32_u32(x)));
    // SAFETY: the caller's contract: `dst` and the epilogue's operands hold the tile's
    // rows' columns of `t.at`, this block's among them.
    unsafe { finish::<H>((t.epilogue, t.row0, t.at), (i0, half), acc, dst) };
}
