//! What the aarch64 NEON tiles of the packed products share (`f32::neon`,
//! `bf16::neon`, `i8::neon`): the cut of a tile (up to [`MR`](super::MR) rows by one
//! panel) into register blocks of at most [`ROWS`] rows by half a panel ([`COLS`]
//! columns, four vectors of 4 lanes), the loads and stores that the tile's width cuts
//! short, and [`finish`], which applies a chain's epilogue to a block's f32 results
//! and stores them, so every NEON tile gives the epilogue the f32 tile's bits. The 2 × 2
//! matrix instructions' block (`smmla`, `bfmmla`) is module `mmla`.
//!
//! A block of six rows keeps `6 × 4` = 24 accumulators of the 32 vector registers,
//! which leaves room for the panel's vectors of one step and the left operand's
//! broadcasts. The panel stays in L1 while the row groups of a tile pass over it.

pub(super) mod mmla;

use std::arch::aarch64::*;

use super::{Cols, Epilogue, Operand, Step, NR};

/// Most rows of one register block.
pub(super) const ROWS: usize = 6;
/// Columns of one register block: half a panel.
pub(super) const COLS: usize = NR / 2;

/// Calls `f(i0, h, half)` for the register blocks of a tile of `rows` rows whose panel
/// holds `width` columns: row groups of at most `most` rows (1 to [`ROWS`]), as even as
/// possible (14 rows by 6 are 5 + 5 + 4), each by the halves of the panel that hold
/// some of the columns.
pub(super) fn blocks(
    rows: usize,
    most: usize,
    width: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let groups = rows.div_ceil(most);
    let mut i0 = 0;
    for g in 0..groups {
        let h = (rows - i0).div_ceil(groups - g);
        for half in 0..2 {
            if half * COLS < width {
                f(i0, h, half);
            }
        }
        i0 += h;
    }
}

/// Runs `$block::<H>(args)` (an `unsafe fn` of a block of `H` rows, 1 to [`ROWS`], of a
/// tile by half its panel) for every register block of a tile of `$rows` rows whose
/// panel holds `$width` columns ([`blocks`], at most `$most` rows a block), with `$i0`
/// (the block's first row) and `$half` bound for the arguments. A tile's function
/// calls it under its own contract, which covers every block's: rows `i0..i0 + H` of
/// the tile by a half that holds columns of its width.
macro_rules! for_blocks {
    ($rows:expr, $most:expr, $width:expr, |$i0:ident, $half:ident| $block:ident($($arg:expr),* $(,)?)) => {
        $crate::kernels::packed::neon::blocks($rows, $most, $width, |$i0, h, $half| {
            // SAFETY: rows i0..i0 + h are rows of the tile and `half` holds columns of
            // its width (`blocks`), so the tile's contract, which its caller holds,
            // covers the block's.
            unsafe {
                match h {
                    1 => $block::<1>($($arg),*),
                    2 => $block::<2>($($arg),*),
                    3 => $block::<3>($($arg),*),
                    4 => $block::<4>($($arg),*),
                    5 => $block::<5>($($arg),*),
                    6 => $block::<6>($($arg),*),
                    _ => unreachable!("register blocks hold 1 to ROWS rows"),
                }
            }
        })
    };
}
pub(super) use for_blocks;

/// How many of the 4 lanes of vector `v` of half `half` of a panel are columns of a
/// tile `width` wide (0 to 4).
#[inline(always)]
pub(super) fn lanes(width: usize, half: usize, v: usize) -> usize {
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

/// Applies `epilogue` to the f32 results `acc` of rows `i0..i0 + H` of a tile by half
/// `half` of its panel (`acc[i][v]`: row `i0 + i`, columns `half * COLS + 4v..` of the
/// panel), each step the IEEE operation the element-wise program does (GELU by
/// `math::gelu_neon`, the scalar function's bits), then stores the lanes inside the
/// tile's width: row `i` of the tile, column `at.j0 + c` at `dst + i * at.ldc + at.j0 +
/// c`. The tile's row `i` is row `row0 + i` of the product, which a residual is indexed
/// by.
///
/// # Safety
///
/// `half * COLS < at.width <= NR`; `dst` is valid for writes of the block's rows'
/// columns `at.j0..at.j0 + at.width` (as placed above), which nobody else reads or
/// writes meanwhile; every step of `epilogue` has those columns inside its operand (for
/// a [`Operand::Rows`], of rows `row0 + i0..row0 + i0 + H`).
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn finish<const H: usize>(
    (epilogue, row0, at): (Epilogue<'_>, usize, Cols),
    (i0, half): (usize, usize),
    mut acc: [[float32x4_t; 4]; H],
    dst: *mut f32,
) {
    let n = |v: usize| lanes(at.width, half, v);
    // The first column of the block, in the tile's operands' numbering.
    let j0 = at.j0 + half * COLS;
    for step in epilogue {
        match *step {
            Step::Add {
                operand: Operand::Columns(values),
                sum_first,
            } => {
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
            Step::Add {
                operand:
                    Operand::Rows {
                        data,
                        offset,
                        stride,
                    },
                sum_first,
            } => {
                for (i, acc) in acc.iter_mut().enumerate() {
                    let row = offset + (row0 + i0 + i) * stride + j0;
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
            unsafe { store(dst.add((i0 + i) * at.ldc + j0 + 4 * v), x, n(v)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row count of a tile is cut into blocks of at most the given rows, in
    /// order, each row once, and only halves with columns are visited.
    #[test]
    fn blocks_cover_every_row_once() {
        for most in [5, ROWS] {
            for rows in 1..=super::super::MR {
                for width in [1, COLS, COLS + 1, NR] {
                    let mut seen = Vec::new();
                    blocks(rows, most, width, |i0, h, half| {
                        assert!((1..=most).contains(&h) && half * COLS < width);
                        if half == 0 {
                            seen.extend(i0..i0 + h);
                        }
                    });
                    assert_eq!(seen, (0..rows).collect::<Vec<_>>(), "{rows} rows");
                }
            }
        }
        assert_eq!((lanes(5, 0, 1), lanes(5, 0, 2), lanes(20, 1, 0)), (1, 0, 4));
    }
}
