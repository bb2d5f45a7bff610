//! bf16 panels: rounding, packing, the left operand's rows in bf16, and the tiles.
//!
//! A bf16 is the top half of an f32 (sign, the 8 exponent bits, 7 mantissa bits), so
//! widening is exact and a product of two bf16 is exact in f32. `vdpbf16ps` multiplies
//! 16 pairs of bf16 from each operand and adds both products of a pair into one f32
//! lane: the panel holds rows `2q` and `2q + 1` of a column in one 32-bit pair, and
//! each left row's elements `2q, 2q + 1` are broadcast as one pair. The left operand is
//! rounded to bf16 a chunk of rows at a time, into a scratch on the stack (so no
//! allocation, whichever thread runs the product), and each chunk is multiplied by
//! every panel of the thread's part.
//!
//! Accuracy: each operand is rounded to the nearest bf16 (8 significant bits: relative
//! error at most 2⁻⁸), the products are exact, and the sums are f32; a product of `k`
//! terms stays within `2 · 2⁻⁸ · Σ|a·b|` (plus f32 rounding of the sums) of the f32
//! product (the tests hold it there).
//! Without AVX512_BF16 the portable tile computes the same sums in the same order
//! with f32 operations.

#[cfg(target_arch = "x86_64")]
use super::by_rows;
use super::{chunk_rows, with_stack, Cols, Matrix, Out, Part, MR, NR};
use crate::kernels::{error, KernelError};

/// `x` rounded to the nearest bf16 (ties to even); NaN stays a (quiet) NaN.
pub(super) fn round(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of a bf16 (exact).
pub(super) fn to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// The pair of rows `lo` and `hi` of one column as a `vdpbf16ps` operand.
fn pair(lo: f32, hi: f32) -> u32 {
    round(lo) as u32 | (round(hi) as u32) << 16
}

/// The panels of the `[k, n]` matrix at `offset` with strides `(rs, cs)` in `src`
/// (which the caller checked it fits), in bf16 pairs.
pub(super) fn pack(
    src: &[f32],
    offset: usize,
    (k, n, rs, cs): (usize, usize, usize, usize),
) -> Result<Vec<u32>, KernelError> {
    let kp = k.div_ceil(2);
    let per_panel = kp
        .checked_mul(NR)
        .ok_or_else(|| error("pack_bf16", "the packed size overflows"))?;
    let mut data = super::zeroed_pairs("pack_bf16", n.div_ceil(NR), per_panel)?;
    for (pj, panel) in data.chunks_exact_mut(kp * NR).enumerate() {
        let j0 = pj * NR;
        for (q, row) in panel.chunks_exact_mut(NR).enumerate() {
            for (jj, x) in row[..NR.min(n - j0)].iter_mut().enumerate() {
                let at = offset + 2 * q * rs + (j0 + jj) * cs;
                let hi = if 2 * q + 1 < k { src[at + rs] } else { 0.0 };
                *x = pair(src[at], hi);
            }
        }
    }
    Ok(data)
}

/// Most pairs of the stack scratch that holds one chunk of rows in bf16 (64 KiB).
const SCRATCH: usize = 16 << 10;

/// Computes `part` of the product of `g` by the bf16 panels `data`: its rows a chunk
/// at a time (as many as the stack scratch holds, whole tiles), each chunk rounded to
/// bf16 once and multiplied by every panel of the part. The scratch is on the stack,
/// so a product allocates nothing, whichever thread runs it.
pub(super) fn part(g: Matrix<'_>, data: &[u32], part: Part, simd: bool, out: Out) {
    let kp = g.k.div_ceil(2);
    let (first, end) = part.rows;
    let chunk = chunk_rows(end - first, kp, SCRATCH);
    with_stack(chunk * kp, |scratch: &mut [u32]| {
        chunks(g, data, part, simd, chunk, scratch, out)
    });
}

/// [`part`] with `scratch` for `chunk` rows.
fn chunks(
    g: Matrix<'_>,
    data: &[u32],
    part: Part,
    simd: bool,
    chunk: usize,
    scratch: &mut [u32],
    out: Out,
) {
    let kp = g.k.div_ceil(2);
    let (first, end) = part.rows;
    let mut c0 = first;
    while c0 < end {
        let rows = chunk.min(end - c0);
        let buf = &mut scratch[..rows * kp];
        for (i, dst) in buf.chunks_exact_mut(kp).enumerate() {
            round_row(g, c0 + i, simd, dst);
        }
        let buf = &*buf;
        for pj in part.panels.0..part.panels.1 {
            let b = &data[pj * kp * NR..(pj + 1) * kp * NR];
            let at = part.cols(pj);
            Part::blocks(c0, rows, |r0, h| {
                let t = Tile {
                    a: &buf[(r0 - c0) * kp..(r0 - c0 + h) * kp],
                    kp,
                    b,
                    at,
                };
                tile(&t, h, simd, out.skip(r0 * part.n));
            });
        }
        c0 += rows;
    }
}

/// Rounds row `i` of `g` to bf16 pairs in `dst` (`ceil(k / 2)` of them).
fn round_row(g: Matrix<'_>, i: usize, simd: bool, dst: &mut [u32]) {
    let row = &g.a[i * g.lda..];
    #[cfg(target_arch = "x86_64")]
    if g.cs == 1 && simd {
        assert!(crate::kernels::cpu::has_avx512_bf16() && dst.len() == g.k.div_ceil(2));
        // SAFETY: the CPU has AVX512_BF16 (asserted); the row's k elements are
        // `row[..k]` (cs == 1, and `g.a` ends at the last element of the last row, so
        // every row has k elements), and `dst` holds ceil(k / 2) pairs (asserted).
        unsafe { avx512::round_row(&row[..g.k], dst) };
        return;
    }
    let _ = simd;
    for (q, x) in dst.iter_mut().enumerate() {
        let hi = if 2 * q + 1 < g.k {
            row[(2 * q + 1) * g.cs]
        } else {
            0.0
        };
        *x = pair(row[2 * q * g.cs], hi);
    }
}

/// One tile's operands: rows of bf16 pairs (`kp` each, contiguous) and the panel `b`
/// (`kp` rows of [`NR`] pairs).
struct Tile<'a> {
    a: &'a [u32],
    kp: usize,
    b: &'a [u32],
    at: Cols,
}

/// `dst[i][j0..j0 + width] = a[i] · b` for the tile's `rows` rows.
fn tile(t: &Tile<'_>, rows: usize, simd: bool, dst: Out) {
    let w = t.at;
    // The bounds every access below relies on, checked once.
    assert!((1..=MR).contains(&rows) && w.width >= 1 && w.width <= NR);
    assert!(t.kp >= 1 && t.b.len() >= t.kp * NR && t.a.len() >= rows * t.kp);
    assert!(dst.len >= (rows - 1) * w.ldc + w.j0 + w.width);
    #[cfg(target_arch = "x86_64")]
    if simd {
        assert!(crate::kernels::cpu::has_avx512_bf16());
        macro_rules! call {
            ($r:literal) => {
                // SAFETY: AVX512_BF16 is present (asserted) and the asserts above are
                // the bounds `avx512::tile` documents; this tile's elements of `dst`
                // are written by no one else (see `Out`).
                unsafe { avx512::tile::<$r>(t, dst.ptr) }
            };
        }
        return by_rows!(rows, call!());
    }
    let _ = simd;
    portable(t, rows, dst)
}

/// The tile with f32 operations, in the order `vdpbf16ps` adds: per pair, the product
/// of the high halves, then of the low halves.
fn portable(t: &Tile<'_>, rows: usize, dst: Out) {
    for i in 0..rows {
        let mut acc = [0.0f32; NR];
        for (q, &x) in t.a[i * t.kp..(i + 1) * t.kp].iter().enumerate() {
            let (x0, x1) = (to_f32(x as u16), to_f32((x >> 16) as u16));
            for (s, &w) in acc.iter_mut().zip(&t.b[q * NR..(q + 1) * NR]) {
                *s += x1 * to_f32((w >> 16) as u16);
                *s += x0 * to_f32(w as u16);
            }
        }
        let start = i * t.at.ldc + t.at.j0;
        // SAFETY: the elements are row i's columns j0..j0 + width, inside `dst`
        // (asserted by `tile`) and written by no one else (see `Out`).
        let row = unsafe { dst.part(start, t.at.width) };
        row.copy_from_slice(&acc[..t.at.width]);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Tile, NR};
    use std::arch::x86_64::*;

    /// Rounds `row` (k elements) to `dst` (ceil(k / 2) pairs), 16 elements at a time.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F and AVX512_BF16; `dst.len() == row.len().div_ceil(2)`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn round_row(row: &[f32], dst: &mut [u32]) {
        debug_assert_eq!(dst.len(), row.len().div_ceil(2));
        let mut chunks = row.chunks_exact(16);
        let mut out = dst.chunks_exact_mut(8);
        for (c, o) in (&mut chunks).zip(&mut out) {
            // SAFETY: `c` holds 16 f32 and `o` 8 u32 (32 bytes): the load and the
            // store stay inside them.
            unsafe {
                let h = _mm512_cvtneps_pbh(_mm512_loadu_ps(c.as_ptr()));
                _mm256_storeu_si256(
                    o.as_mut_ptr().cast(),
                    std::mem::transmute::<__m256bh, __m256i>(h),
                );
            }
        }
        let rest = chunks.remainder();
        let tail = &mut dst[row.len() / 16 * 8..];
        for (q, x) in tail.iter_mut().enumerate() {
            let hi = rest.get(2 * q + 1).copied().unwrap_or(0.0);
            *x = super::pair(rest[2 * q], hi);
        }
    }

    /// The tile on AVX512_BF16: `R × 2` accumulators, one pair of `k` per iteration.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F and AVX512_BF16; `t.kp >= 1`, `t.b` holds at least
    /// `t.kp * NR` pairs and `t.a` at least `R * t.kp`; `dst` is valid for writes of
    /// `(R - 1) * ldc + j0 + width` elements (`t.at`), of which nobody else reads or
    /// writes the tile's during the call, and `1 <= width <= NR`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn tile<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
        let mut acc0 = [_mm512_setzero_ps(); R];
        let mut acc1 = [_mm512_setzero_ps(); R];
        let (a, b) = (t.a.as_ptr(), t.b.as_ptr());
        for q in 0..t.kp {
            // SAFETY: q < kp, so `b[q * NR..q * NR + 32]` is inside `t.b`, and
            // `a[i * kp + q]` for i < R inside `t.a`. The transmutes reinterpret 64
            // bytes of pairs as the 32 bf16 they hold.
            unsafe {
                super::super::prefetch_ahead(b.wrapping_add(q * NR).cast());
                let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(q * NR).cast()));
                let b1: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(b.add(q * NR + 16).cast()));
                for i in 0..R {
                    let x: __m512bh =
                        std::mem::transmute(_mm512_set1_epi32(*a.add(i * t.kp + q) as i32));
                    acc0[i] = _mm512_dpbf16_ps(acc0[i], x, b0);
                    acc1[i] = _mm512_dpbf16_ps(acc1[i], x, b1);
                }
            }
        }
        // SAFETY: the caller's contract: `dst` is valid for the tile's rows' columns
        // j0..j0 + width (at i * ldc + j0..), which no one else touches; the masks
        // write only the first `width` lanes.
        unsafe { super::super::store_rows!(R, acc0, acc1, t.at, dst) }
    }
}
