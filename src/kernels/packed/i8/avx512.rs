//! The int8 tiles on 512-bit registers, and the conversion every AVX-512 path ends
//! with.
//!
//! - [`tile`], on AVX512_VNNI: `vpdpbusd` multiplies the panel's unsigned bytes by four
//!   activation bytes broadcast from memory and sums the four products into each i32
//!   lane (one instruction per 64 multiply-adds).
//! - [`tile_bw`], on AVX-512 without VNNI (Skylake-SP, Cascade Lake's non-VNNI parts
//!   aside): the panel's bytes are widened in registers to i16 (`vpmovzxbw`, still
//!   shifted by 128), four activation bytes widened to four i16 and broadcast, and
//!   `vpmaddwd` sums pairs of products into i32 (`vpaddd` into the accumulators): two
//!   instructions per 32 multiply-adds, exact (a product is at most 255 · 127), each
//!   accumulator holding two partial sums of each of its 8 columns, added at the end.
//!   MEASURED-BW
//!
//! Both keep the shift of the weight in their sums and take it off in [`convert`]'s
//! conversion, `((acc - 128 Σ qa) as f32 · sw[j]) · sa[i]`, as the portable tile does.

use super::{Tile, NR, QUAD, ZERO};
use std::arch::x86_64::*;

/// # Safety
///
/// The CPU has AVX-512 F and BW and AVX512_VNNI; `t.kp >= 4` is a multiple of 4,
/// `t.b` holds `t.kp * NR` bytes, `t.qa` holds `R * t.kp`, `t.sa` and `t.sums`
/// hold `R`, `t.sw` holds `NR`; `1 <= t.width <= NR`; `dst` is valid for writes of
/// `t.at + (R - 1) * t.ldc + t.width` elements, of which nobody else reads or
/// writes the tile's during the call.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    let mut acc0 = [_mm512_setzero_si512(); R];
    let mut acc1 = [_mm512_setzero_si512(); R];
    let (a, b) = (t.qa.as_ptr(), t.b.as_ptr());
    for p in 0..t.kp / 4 {
        // SAFETY: p < kp / 4, so bytes p * QUAD..(p + 1) * QUAD are inside `t.b`
        // (kp * NR = kp / 4 * QUAD bytes), and row i's 4 bytes at i * kp + 4 * p
        // are inside `t.qa` (R * kp bytes) for i < R.
        unsafe {
            super::super::prefetch_ahead(b.wrapping_add(p * QUAD));
            let b0 = _mm512_loadu_si512(b.add(p * QUAD).cast());
            let b1 = _mm512_loadu_si512(b.add(p * QUAD + 64).cast());
            for i in 0..R {
                let x = _mm512_set1_epi32(std::ptr::read_unaligned(
                    a.add(i * t.kp + 4 * p).cast::<i32>(),
                ));
                acc0[i] = _mm512_dpbusd_epi32(acc0[i], b0, x);
                acc1[i] = _mm512_dpbusd_epi32(acc1[i], b1, x);
            }
        }
    }
    // SAFETY: the caller's contract.
    unsafe { store::<R>(&acc0, &acc1, t, dst) }
}

/// Converts and stores the i32 sums `acc` (row `i`'s 32 in `acc[i]`) of the
/// tile `t`'s `R` rows, as the VNNI tile does its accumulators.
///
/// # Safety
///
/// The CPU has AVX-512 F and BW; `t.sa` and `t.sums` hold `R`, `t.sw` holds `NR`;
/// `1 <= t.width <= NR`; `dst` is valid for writes of `t.at + (R - 1) * t.ldc +
/// t.width` elements, of which nobody else reads or writes the tile's meanwhile.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn convert<const R: usize>(acc: &[[i32; NR]; R], t: &Tile<'_>, dst: *mut f32) {
    let load = |x: &[i32]| {
        // SAFETY: `x` holds 16 i32 (a half of a row of `acc`).
        unsafe { _mm512_loadu_si512(x.as_ptr().cast()) }
    };
    let acc0: [__m512i; R] = std::array::from_fn(|i| load(&acc[i][..16]));
    let acc1: [__m512i; R] = std::array::from_fn(|i| load(&acc[i][16..]));
    // SAFETY: the caller's contract.
    unsafe { store::<R>(&acc0, &acc1, t, dst) }
}

/// The conversion both tiles end with: `((acc - 128 · sums[i]) as f32 · sw[j]) ·
/// sa[i]`, stored masked to `t.width` columns.
///
/// # Safety
///
/// [`convert`]'s.
#[inline(always)]
unsafe fn store<const R: usize>(
    acc0: &[__m512i; R],
    acc1: &[__m512i; R],
    t: &Tile<'_>,
    dst: *mut f32,
) {
    // SAFETY: `t.sw` holds NR = 32 floats (two vectors).
    let (sw0, sw1) = unsafe {
        (
            _mm512_loadu_ps(t.sw.as_ptr()),
            _mm512_loadu_ps(t.sw.as_ptr().add(16)),
        )
    };
    let (m0, m1) = super::super::lane_masks(t.width);
    for i in 0..R {
        // SAFETY: the CPU has AVX-512F and BW (the caller's contract); row i's columns
        // are at at + i * ldc.., inside `dst` (valid for at + (R - 1) * ldc + width
        // elements); the masks write only the first `width` lanes.
        unsafe {
            let shift = _mm512_set1_epi32(t.sums[i].wrapping_mul(ZERO as i32));
            let sa = _mm512_set1_ps(t.sa[i]);
            let lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc0[i], shift));
            let hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc1[i], shift));
            let row = dst.add(t.at + i * t.ldc);
            _mm512_mask_storeu_ps(row, m0, _mm512_mul_ps(_mm512_mul_ps(lo, sw0), sa));
            let hi = _mm512_mul_ps(_mm512_mul_ps(hi, sw1), sa);
            _mm512_mask_storeu_ps(row.add(16), m1, hi);
        }
    }
}

/// Rows of one pass of [`tile_bw`] over the panel: 6 rows of 4 accumulators, the
/// panel's 4 widened vectors and the broadcast activations fill 29 of the 32 registers.
const BW_ROWS: usize = 6;

/// The tile on AVX-512 without VNNI: the tile's `R` rows in passes of at most
/// [`BW_ROWS`] (as even as possible: 14 rows are 5, 5 and 4), each over the whole
/// panel.
///
/// # Safety
///
/// [`tile`]'s, without VNNI: the CPU has AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn tile_bw<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    let passes = R.div_ceil(BW_ROWS);
    let mut i0 = 0;
    for pass in 0..passes {
        let h = (R - i0).div_ceil(passes - pass);
        let rows = t.rows(i0, h);
        // SAFETY: `rows` is rows i0..i0 + h of `t`, so the caller's contract holds
        // for it with `h` rows.
        unsafe {
            match h {
                1 => bw_rows::<1>(&rows, dst),
                2 => bw_rows::<2>(&rows, dst),
                3 => bw_rows::<3>(&rows, dst),
                4 => bw_rows::<4>(&rows, dst),
                5 => bw_rows::<5>(&rows, dst),
                _ => bw_rows::<BW_ROWS>(&rows, dst),
            }
        }
        i0 += h;
    }
}

/// One pass of [`tile_bw`]: `H` rows (at most [`BW_ROWS`]), `H × 4` accumulators of 8
/// columns × 2 partial sums; per quad of `k`, the panel's 128 bytes widened to four
/// vectors of i16 (`q + 128`), and per row its 4 activation bytes widened and
/// broadcast, then `vpmaddwd` + `vpaddd` per vector.
///
/// # Safety
///
/// [`tile_bw`]'s, for `H` rows.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bw_rows<const H: usize>(t: &Tile<'_>, dst: *mut f32) {
    let mut acc = [[_mm512_setzero_si512(); 4]; H];
    let (a, b) = (t.qa.as_ptr(), t.b.as_ptr());
    for p in 0..t.kp / 4 {
        // SAFETY: p < kp / 4, so bytes p * QUAD..(p + 1) * QUAD are inside `t.b`
        // (kp * NR = kp / 4 * QUAD bytes), and row i's 4 bytes at i * kp + 4 * p
        // are inside `t.qa` (H * kp bytes) for i < H.
        unsafe {
            super::super::prefetch_ahead(b.wrapping_add(p * QUAD));
            let mut w = [_mm512_setzero_si512(); 4];
            for (c, w) in w.iter_mut().enumerate() {
                *w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(b.add(p * QUAD + 32 * c).cast()));
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = std::ptr::read_unaligned(a.add(i * t.kp + 4 * p).cast::<i32>());
                let x = _mm512_cvtepi8_epi16(_mm256_set1_epi32(x));
                for (acc, w) in acc.iter_mut().zip(&w) {
                    *acc = _mm512_add_epi32(*acc, _mm512_madd_epi16(x, *w));
                }
            }
        }
    }
    // Lane 2j + h of accumulator c holds a partial sum of column 8c + j: add the
    // pairs, 16 columns a vector.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let half = |x: __m512i, y: __m512i| {
        _mm512_add_epi32(
            _mm512_permutex2var_epi32(x, even, y),
            _mm512_permutex2var_epi32(x, odd, y),
        )
    };
    let acc0: [__m512i; H] = std::array::from_fn(|i| half(acc[i][0], acc[i][1]));
    let acc1: [__m512i; H] = std::array::from_fn(|i| half(acc[i][2], acc[i][3]));
    // SAFETY: the caller's contract.
    unsafe { store::<H>(&acc0, &acc1, t, dst) }
}

/// [`super::quantize::slice`] compiled for AVX-512 (the same arithmetic, vectorised).
///
/// # Safety
///
/// The CPU has AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize_slice(row: &[f32], out: &mut [i8]) -> (f32, i32) {
    super::quantize::slice(row, out, super::quantize::Bytes::Signed)
}
