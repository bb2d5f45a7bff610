//! The f32 tile: up to [`MR`] rows by one panel of [`NR`] columns, on AVX-512.
//!
//! `MR × 2` accumulators; per step of `k`, two vector loads of the panel and one
//! broadcast of each row's element of the left operand, read in place.
//!
//! While the row blocks of one panel multiply it, they ask for the **next panel**, a
//! cache line or two a step, into L2 ([`NextPanel`]): the first block of a panel reads
//! it from L3 or DRAM, and without the hint it waited on that stream while the blocks
//! after it found the panel in L2 and asked for nothing. Spread over the blocks, the
//! stream is as even as the arithmetic. Each step also asks for the current panel's
//! lines [`L1_AHEAD`] bytes on into L1, so the loads of the panel, now mostly from L2,
//! do not wait on it either.

use super::{by_rows, Cols, Matrix, Out, Part, MR, NR};

/// Computes `part` of the product of `g` by the f32 panels `data`: panel by panel, and
/// in each panel row block by row block (so a panel stays in L2 while every row block
/// reads it).
pub(super) fn part(g: Matrix<'_>, data: &[f32], part: Part, out: Out) {
    let k = g.k;
    let blocks = (part.rows.1 - part.rows.0).div_ceil(MR);
    for pj in part.panels.0..part.panels.1 {
        let b = &data[pj * k * NR..(pj + 1) * k * NR];
        let next = b.as_ptr().wrapping_add(k * NR).cast::<u8>();
        let at = part.cols(pj);
        let mut bi = 0;
        Part::blocks(part.rows.0, part.rows.1 - part.rows.0, |r0, h| {
            let t = Tile {
                a: &g.a[r0 * g.lda..],
                lda: g.lda,
                cs: g.cs,
                k,
                b,
                at,
                next: NextPanel::share(next, k, bi, blocks),
            };
            bi += 1;
            tile(&t, h, out.skip(r0 * part.n));
        });
    }
}

/// One tile's operands: rows of `a` (element `(i, p)` at `i * lda + p * cs`) and the
/// panel `b` (`k` rows of [`NR`]).
struct Tile<'a> {
    a: &'a [f32],
    lda: usize,
    cs: usize,
    k: usize,
    b: &'a [f32],
    at: Cols,
    next: NextPanel,
}

/// The cache lines of the next panel one row block asks for while it multiplies the
/// current panel: `per` lines a step from `at`, in its first `steps` steps. A panel
/// of `k` steps is `2k` lines (128 bytes a step); a lone block asks for two lines a
/// step, otherwise the first blocks ask for one line a step each until the panel is
/// covered (two blocks cover it; the rest ask for nothing).
///
/// Measured against asking for the two lines 4 KiB ahead of the current step (what
/// every tile did before; the bf16 and int8 tiles still do), on this project's 2-core
/// Xeon: a pass over MiniLM's 24 weights at 28 rows (both schemes alternated in one
/// process, medians of 21) 125 → 146 GFLOP/s on one thread, 227 rows 128 → 137, 896
/// rows 131 → 135; all-MiniLM-L6-v2 one sentence a call (binaries alternated, 8
/// pairs): p50 paired ratio 0.966; batches of 32: 0.99 (5 pairs, no change).
#[derive(Clone, Copy)]
struct NextPanel {
    at: *const u8,
    per: usize,
    steps: usize,
}

impl NextPanel {
    /// Row block `bi` of `blocks`' share of the next panel, which starts at `next` (a
    /// pointer only hinted at, never read: past the last panel it points nowhere).
    fn share(next: *const u8, k: usize, bi: usize, blocks: usize) -> NextPanel {
        let lines = 2 * k;
        let per = if blocks == 1 { 2 } else { 1 };
        let start = (bi * k * per).min(lines);
        NextPanel {
            at: next.wrapping_add(start * 64),
            per,
            steps: (lines - start) / per,
        }
    }
}

/// How far ahead of the step being multiplied a tile asks for its own panel's two
/// lines into L1 (16 steps). With the next panel already coming into L2
/// ([`NextPanel`]), measured in one process against no such hint: a pass over MiniLM's
/// 24 weights on one thread 14 rows 120 → 131 GFLOP/s, 20 rows 125 → 136, 36 rows 130
/// → 137, 227 rows 140 → 146, 896 rows 143 → 144 (medians of 21); all-MiniLM-L6-v2 one
/// sentence a call, the two alternated sentence by sentence over the corpus three
/// times: p50 3.28 → 3.18 ms, median paired ratio 0.974 (1 and 4 KiB: 0.971, 0.973).
const L1_AHEAD: usize = 2048;

/// `dst[i][j0..j0 + width] = a[i] · b` for the tile's `rows` rows.
fn tile(t: &Tile<'_>, rows: usize, dst: Out) {
    macro_rules! call {
        ($r:literal) => {
            if t.cs == 1 {
                checked::<$r, true>(t, dst)
            } else {
                checked::<$r, false>(t, dst)
            }
        };
    }
    by_rows!(rows, call!())
}

/// `UNIT`: the rows of `a` are contiguous (`cs == 1`, the common case, compiled apart).
fn checked<const R: usize, const UNIT: bool>(t: &Tile<'_>, dst: Out) {
    // The bounds every access below relies on, checked once (a failed check is a bug of
    // this module, caught at the kernel boundary as a panic).
    let w = t.at;
    assert!(R >= 1 && R <= MR && w.width >= 1 && w.width <= NR);
    assert!(t.b.len() >= t.k * NR);
    assert!(t.k >= 1 && t.a.len() > (R - 1) * t.lda + (t.k - 1) * t.cs);
    assert!(!UNIT || t.cs == 1);
    assert!(dst.len >= (R - 1) * w.ldc + w.j0 + w.width);
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            super::has_avx512(),
            "the f32 packed kernel runs only on AVX-512"
        );
        // SAFETY: AVX-512F is present (asserted), the asserts above are the bounds
        // `avx512::tile` documents, and this tile's elements of `dst` are written by no
        // one else (see `Out`).
        unsafe { avx512::tile::<R, UNIT>(t, dst.ptr) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("PackedRhs::pack gives None without AVX-512");
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Tile, L1_AHEAD, NR};
    use std::arch::x86_64::*;

    /// The tile on AVX-512: `R × 2` accumulators, one step of `k` per iteration.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F; `t.k >= 1` and `t.b` holds at least `t.k * NR` elements;
    /// `t.a` holds more than `(R - 1) * t.lda + (t.k - 1) * t.cs`, and `t.cs == 1`
    /// when `UNIT`; `dst` is valid for writes of
    /// `(R - 1) * ldc + j0 + width` elements (`t.at`), of which nobody else reads or
    /// writes the tile's during the call, and `1 <= width <= NR`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const R: usize, const UNIT: bool>(t: &Tile<'_>, dst: *mut f32) {
        let mut acc0 = [_mm512_setzero_ps(); R];
        let mut acc1 = [_mm512_setzero_ps(); R];
        let (a, b) = (t.a.as_ptr(), t.b.as_ptr());
        for p in 0..t.k {
            let col = if UNIT { p } else { p * t.cs };
            if p < t.next.steps {
                let line = t.next.at.wrapping_add(p * t.next.per * 64);
                // A prefetch is only a hint: it reads nothing and cannot fault,
                // whatever the address (`wrapping_add` keeps computing it defined
                // past the last panel).
                _mm_prefetch::<_MM_HINT_T1>(line.cast());
                if t.next.per == 2 {
                    _mm_prefetch::<_MM_HINT_T1>(line.wrapping_add(64).cast());
                }
            }
            // The same for this panel's lines `L1_AHEAD` bytes on, into L1.
            let ahead = b.wrapping_add(p * NR + L1_AHEAD / 4).cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            // SAFETY: p < k, so `b[p * NR..p * NR + 32]` is inside `t.b` (k * NR
            // elements), and `a[i * lda + p * cs]` for i < R is inside `t.a` (whose
            // last element is at (R - 1) * lda + (k - 1) * cs or beyond).
            unsafe {
                let b0 = _mm512_loadu_ps(b.add(p * NR));
                let b1 = _mm512_loadu_ps(b.add(p * NR + 16));
                for i in 0..R {
                    let x = _mm512_set1_ps(*a.add(i * t.lda + col));
                    acc0[i] = _mm512_fmadd_ps(x, b0, acc0[i]);
                    acc1[i] = _mm512_fmadd_ps(x, b1, acc1[i]);
                }
            }
        }
        // SAFETY: the caller's contract: `dst` is valid for the tile's rows' columns
        // j0..j0 + width (at i * ldc + j0..), which no one else touches; the masks
        // write only the first `width` lanes.
        unsafe { super::super::store_rows!(R, acc0, acc1, t.at, dst) }
    }
}
