//! The int8 tiles on aarch64: `sdot` (FEAT_DotProd, tier `neon-dotprod`) and `smmla`
//! (FEAT_I8MM, tier `neon-i8mm`), on `Signed` weights (the quads of the panels every
//! tier shares, each `q` a signed byte: both instructions multiply signed bytes by
//! signed bytes, so the sums are `Σ qa·q` with no shift to take off), in the register
//! blocks of `packed::neon` (up to 6 rows by half a panel).
//!
//! - `sdot`: per quad of `k`, the half panel's four vectors (4 columns × 4 bytes) and,
//!   per row, its 4 activation bytes in every lane: 16 multiply-adds an instruction
//!   (`fmla` does 4). 24 accumulators, 4 panel vectors and a broadcast.
//! - `smmla`: per two quads of `k`, a 2 × 8 by 8 × 2 product into 2 × 2 sums (module
//!   `packed::neon::mmla`, shared with the bf16 tile's `bfmmla`): 32 multiply-adds an
//!   instruction, twice `sdot`'s, for 8 `zip`s per 24 `smmla` (the panel's columns
//!   paired) where `sdot` needs none. At 6 rows by half a panel and two quads, 24
//!   `smmla` and 8 `zip`s against 48 `sdot`: fewer vector instructions by a third, so
//!   it runs where i8mm does. Counted, not measured: nothing here has run on hardware,
//!   and the count assumes, as ARCHITECTURE.md's rooflines do, that a core issues
//!   `smmla` as often as `sdot`.
//!
//! The sums are exact (module `i8`: no sum wraps) and the conversion, `((sum as f32) ·
//! sw[j]) · sa[i]`, is the portable tile's, so both give the portable bits (the tests
//! hold them to it); then the chain's epilogue and the store (`packed::neon::finish`),
//! with the f32 tile's bits.
//!
//! The instructions are written in `asm!` (their intrinsics are not stable Rust), each
//! in a function compiled with its target feature, which the tile's caller has checked
//! the CPU has.

use std::arch::aarch64::*;
use std::arch::asm;

use super::super::neon::mmla::{block as mmla_block, instruction};
use super::super::neon::{finish, for_blocks, COLS, ROWS};
use super::super::Cols;
use super::{Tile, QUAD};

/// The tile for `R` rows on `sdot`.
///
/// # Safety
///
/// The CPU has FEAT_DotProd; `1 <= R`; `t.kp >= 4` is a multiple of 4, `t.b` holds
/// `t.kp * NR` bytes of `Signed` weights, `t.qa` holds `R * t.kp` signed bytes, `t.sa`
/// holds `R`, `t.sw` holds `NR`; `1 <= t.width <= NR`; `dst` is valid for writes of
/// `t.at + (R - 1) * t.ldc + t.width` elements, of which nobody else reads or writes
/// the tile's meanwhile; every operand of `t.epilogue` holds the tile's rows' columns
/// `t.j0..t.j0 + t.width` (rows `t.row0..t.row0 + R` of a `Operand::Rows`).
#[target_feature(enable = "neon")]
pub(super) unsafe fn tile_sdot<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    for_blocks!(R, ROWS, t.width, |i0, half| dot_block(t, i0, half, dst));
}

/// The tile for `R` rows on `smmla`.
///
/// # Safety
///
/// [`tile_sdot`]'s, with FEAT_I8MM.
#[target_feature(enable = "neon")]
pub(super) unsafe fn tile_smmla<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    for_blocks!(R, ROWS, t.width, |i0, half| smmla_block(t, i0, half, dst));
}

/// `acc + Σ w·x`, four byte products a lane (`sdot`).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn sdot(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: one `sdot` on registers (the function's target feature lets it run);
    // it reads and writes nothing but them.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

instruction!(
    /// `smmla`: two rows × 8 signed bytes by 8 signed bytes × two columns into 2 × 2
    /// exact i32 sums, `[r0·c0, r0·c1, r1·c0, r1·c1]`.
    Smmla,
    "smmla",
    "16b",
    "neon,i8mm"
);

/// Rows `i0..i0 + H` of the tile by half `half` of its panel on `sdot`.
///
/// # Safety
///
/// [`tile_sdot`]'s contract for a tile of at least `i0 + H` rows, and `half * COLS <
/// t.width`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_block<const H: usize>(t: &Tile<'_>, i0: usize, half: usize, dst: *mut f32) {
    let mut acc = [[vdupq_n_s32(0); 4]; H];
    let b = t.b.as_ptr().wrapping_add(half * 4 * COLS);
    let a = t.qa.as_ptr().wrapping_add(i0 * t.kp);
    for p in 0..t.kp / 4 {
        // SAFETY: quad p's bytes of the half, b[p * QUAD + half * 64..][..64], are
        // inside `t.b` (kp / 4 quads); row i0 + i's 4 bytes at (i0 + i) * kp + 4p are
        // inside `t.qa` for i < H.
        unsafe {
            let q = b.add(p * QUAD);
            let w = [0, 16, 32, 48].map(|o| vreinterpretq_s8_u8(vld1q_u8(q.add(o))));
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = std::ptr::read_unaligned(a.add(i * t.kp + 4 * p).cast::<i32>());
                let x = vreinterpretq_s8_s32(vdupq_n_s32(x));
                for (c, &w) in acc.iter_mut().zip(&w) {
                    *c = sdot(*c, w, x);
                }
            }
        }
    }
    // SAFETY: the caller's contract.
    unsafe { convert::<H>(t, i0, half, acc, dst) };
}

/// Rows `i0..i0 + H` of the tile by half `half` of its panel on `smmla`
/// (`packed::neon::mmla` over the quads of `k`).
///
/// # Safety
///
/// [`tile_smmla`]'s contract for a tile of at least `i0 + H` rows, and `half * COLS <
/// t.width`.
#[target_feature(enable = "neon,i8mm")]
unsafe fn smmla_block<const H: usize>(t: &Tile<'_>, i0: usize, half: usize, dst: *mut f32) {
    // SAFETY: the CPU has FEAT_I8MM; rows i0..i0 + H of `t.qa` hold kp bytes (kp / 4
    // quads) each, kp apart, and the panel's half holds 64 bytes of each quad.
    let rows = unsafe {
        let a = t.qa.as_ptr().add(i0 * t.kp).cast::<u8>();
        let b = t.b.as_ptr().add(half * 4 * COLS);
        mmla_block::<Smmla, H>(a, t.kp, t.kp / 4, b)
    };
    let sums = rows.map(|row| row.map(|x| vreinterpretq_s32_u32(x)));
    // SAFETY: the caller's contract.
    unsafe { convert::<H>(t, i0, half, sums, dst) };
}

/// Converts the exact sums `sums` of rows `i0..i0 + H` of the tile by half `half` of
/// its panel, `((sum as f32) · sw[j]) · sa[i]` as the portable tile does, and hands
/// them to `finish` (the epilogue, then the store of the columns inside the width).
///
/// # Safety
///
/// [`tile_sdot`]'s contract for a tile of at least `i0 + H` rows, and `half * COLS <
/// t.width`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn convert<const H: usize>(
    t: &Tile<'_>,
    i0: usize,
    half: usize,
    sums: [[int32x4_t; 4]; H],
    dst: *mut f32,
) {
    let mut f = [[vdupq_n_f32(0.0); 4]; H];
    for (i, (f, sums)) in f.iter_mut().zip(&sums).enumerate() {
        let sa = vdupq_n_f32(t.sa[i0 + i]);
        for (v, (f, &sum)) in f.iter_mut().zip(sums).enumerate() {
            // SAFETY: `t.sw` holds NR scales and half * COLS + 4v + 4 <= NR.
            let sw = unsafe { vld1q_f32(t.sw.as_ptr().add(half * COLS + 4 * v)) };
            *f = vmulq_f32(vmulq_f32(vcvtq_f32_s32(sum), sw), sa);
        }
    }
    let at = Cols {
        j0: t.j0,
        width: t.width,
        ldc: t.ldc,
    };
    // `finish` writes row i's column j0 + c at `i * ldc + j0 + c` from its `dst`, ours at
    // `at + i * ldc + c`: it gets ours moved by `at - j0` (wrapping: only the sums it
    // forms are used).
    let rows = dst.wrapping_add(t.at).wrapping_sub(t.j0);
    // SAFETY: the caller's contract, which is `finish`'s for these rows and half.
    unsafe { finish::<H>((t.epilogue, t.row0, at), (i0, half), f, rows) };
}
