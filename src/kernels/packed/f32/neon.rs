//! The f32 tile on aarch64 NEON: the packed panels every tier shares ([`NR`] = 32
//! columns), multiplied in register blocks of up to [`ROWS`] rows by half a panel
//! ([`COLS`] columns, four vectors of 4 lanes).
//!
//! A block keeps `ROWS × 4` = 24 accumulators of the 32 vector registers, four more
//! for the panel's vectors of one step; per step of `k` it loads those four and
//! multiplies each by every row's element of the left operand (`fmla` by a scalar,
//! read in place). A tile of up to [`MR`](super::MR) rows (the row blocks the packed
//! product cuts) runs as row groups of at most `ROWS`, as even as possible, each over
//! both halves of the panel, which stays in L1 meanwhile (`k · 128` bytes).
//!
//! Every accumulator is one chain of fused multiply-adds in the order of `k` from
//! zero, as on AVX-512, so the results have the same bits as the scalar loop of fused
//! multiply-adds and as the x86 tiles; the epilogue's steps ([`Step`]) are applied to
//! the accumulators before they are stored, each the IEEE operation the element-wise
//! program does (GELU by `math::gelu_neon`, the scalar function's bits).
//!
//! Only correctness is checked here (under emulation, `scripts/test-aarch64.sh`); the
//! block's shape follows the usual NEON f32 kernels (24 accumulators, a load of the
//! panel per four `fmla`s) and is not tuned on hardware.

use std::arch::aarch64::*;

use super::{Step, Tile, NR};

/// Most rows of one register block.
const ROWS: usize = 6;
/// Columns of one register block: half a panel.
const COLS: usize = NR / 2;

/// The tile for `R` rows: row groups of at most [`ROWS`], each over the panel's halves
/// that hold columns of the tile's width.
///
/// # Safety
///
/// `1 <= R`; `t.k >= 1` and `t.b` holds at least `t.k * NR` elements; `t.a` holds
/// more than `(R - 1) * t.lda + (t.k - 1) * t.cs`; `dst` is valid for writes of
/// `(R - 1) * ldc + j0 + width` elements (`t.at`), of which nobody else reads or
/// writes the tile's during the call, and `1 <= width <= NR`; every step of
/// `t.epilogue` has the tile's rows' columns `j0..j0 + width` inside its operand (for
/// a [`Step::Rows`], rows `row0..row0 + R`). (NEON is part of every aarch64 target.)
#[target_feature(enable = "neon")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    let groups = R.div_ceil(ROWS);
    let mut i0 = 0;
    for g in 0..groups {
        let h = (R - i0).div_ceil(groups - g);
        for half in 0..2 {
            if half * COLS >= t.at.width {
                break;
            }
            macro_rules! go {
                ($h:literal) => {
                    // SAFETY: rows i0..i0 + h are rows of the tile (i0 + h <= R) and
                    // `half` is a half with columns inside the width: the caller's
                    // contract covers every access of the block.
                    unsafe { block::<$h>(t, i0, half, dst) }
                };
            }
            match h {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                4 => go!(4),
                5 => go!(5),
                6 => go!(6),
                _ => unreachable!("row groups hold 1 to ROWS rows"),
            }
        }
        i0 += h;
    }
}

/// How many of the 4 lanes of vector `v` of half `half` are columns of a tile
/// `width` wide.
#[inline(always)]
fn lanes(width: usize, half: usize, v: usize) -> usize {
    width.saturating_sub(half * COLS + 4 * v).min(4)
}

/// The `n` (1 to 4) floats at `p` in the first lanes of a vector, zeros after.
///
/// # Safety
///
/// `p` is valid for reading `n` f32.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load(p: *const f32, n: usize) -> float32x4_t {
    // SAFETY: the caller's contract; the partial form reads `n` floats into a local.
    unsafe {
        if n == 4 {
            vld1q_f32(p)
        } else {
            let mut buf = [0f32; 4];
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            vld1q_f32(buf.as_ptr())
        }
    }
}

/// Stores the first `n` (1 to 4) lanes of `x` at `p`.
///
/// # Safety
///
/// `p` is valid for writing `n` f32.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn store(p: *mut f32, x: float32x4_t, n: usize) {
    // SAFETY: the caller's contract; the partial form writes `n` floats from a local.
    unsafe {
        if n == 4 {
            vst1q_f32(p, x)
        } else {
            let mut buf = [0f32; 4];
            vst1q_f32(buf.as_mut_ptr(), x);
            std::ptr::copy_nonoverlapping(buf.as_ptr(), p, n);
        }
    }
}

/// `acc + x`, or `x + acc` when not `sum_first` (the operand order of the program's
/// add, which decides the NaN an add of two NaNs gives).
#[inline]
#[target_feature(enable = "neon")]
fn ordered_add(acc: float32x4_t, x: float32x4_t, sum_first: bool) -> float32x4_t {
    let (l, r) = if sum_first { (acc, x) } else { (x, acc) };
    vaddq_f32(l, r)
}

/// Rows `i0..i0 + H` of the tile by half `half` of its panel: the loop over `k`, the
/// epilogue, the store of the columns inside the tile's width.
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
    let n = |v: usize| lanes(t.at.width, half, v);
    // The first column of the block, in the tile's operands' numbering.
    let j0 = t.at.j0 + half * COLS;
    for step in t.epilogue {
        match *step {
            Step::Columns { values, sum_first } => {
                for v in 0..4 {
                    if n(v) == 0 {
                        break;
                    }
                    // SAFETY: `values` holds the tile's columns j0..j0 + width (the
                    // caller's contract); vector v's n(v) lanes are among them.
                    let x = unsafe { load(values.as_ptr().add(j0 + 4 * v), n(v)) };
                    for acc in acc.iter_mut() {
                        acc[v] = ordered_add(acc[v], x, sum_first);
                    }
                }
            }
            Step::Rows {
                data,
                offset,
                stride,
                sum_first,
            } => {
                for (i, acc) in acc.iter_mut().enumerate() {
                    let row = offset + (t.row0 + i0 + i) * stride + j0;
                    for (v, c) in acc.iter_mut().enumerate() {
                        if n(v) == 0 {
                            break;
                        }
                        // SAFETY: row row0 + i0 + i of the matrix has the tile's
                        // columns inside `data` (the caller's contract).
                        let x = unsafe { load(data.as_ptr().add(row + 4 * v), n(v)) };
                        *c = ordered_add(*c, x, sum_first);
                    }
                }
            }
            Step::Gelu => {
                for acc in acc.iter_mut() {
                    *acc = crate::kernels::math::gelu_neon(*acc);
                }
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (v, &x) in acc.iter().enumerate() {
            if n(v) == 0 {
                break;
            }
            // SAFETY: row i0 + i's columns j0 + 4v.. (n(v) of them, inside the width)
            // are inside `dst` and written by no one else (the caller's contract).
            unsafe { store(dst.add((i0 + i) * t.at.ldc + j0 + 4 * v), x, n(v)) };
        }
    }
}
