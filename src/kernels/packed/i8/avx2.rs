//! The int8 tile on 256-bit registers: the AVX2 tier (Haswell, Zen 1–3) and, with
//! `vpdpbusd` on ymm, the AVX-VNNI one (Alder Lake, Zen 5 without AVX-512); and the
//! activation quantisation in AVX2.
//!
//! **AVX2**, on `Narrow` weights. Without VNNI the widest byte product is
//! `vpmaddubsw`: u8 × s8, pairs summed into i16 **with saturation**. The tile takes
//! the activations shifted to u8 (`qa + 128`, in 1..=255, as the quantiser writes them
//! for this tile) as the unsigned operand and the 7-bit signed weights (-63..=63) as
//! the signed one, so a pair sum is at most 2 · 255 · 63 = 32130 < 32767 in magnitude
//! and never saturates; `vpmaddwd` by ones sums the pairs into i32 and `vpaddd` into
//! the accumulators: three instructions per 32 multiply-adds (VNNI does them in one),
//! two of them on the two multiply ports, so twice the multiply-adds per cycle of the
//! f32 FMA. The sums hold `Σ (qa + 128) · q = Σ qa · q + 128 · Σ_p q[p, j]`; the
//! weight's column sums take the shift off at the conversion. With 8-bit weights
//! (`Shifted`) a pair could reach 2 · 255 · 127 and saturate; keeping them 8-bit and
//! exact costs a `vpsignb` per `vpmaddubsw` (the activation's sign moved onto the
//! weight, `|qa|` the unsigned operand), four instructions per 32 multiply-adds, three
//! on the multiply ports. Measured on this project's Skylake-SP (`STREAMFUSE_ISA=avx2`,
//! one thread's CPU time, medians of 21 rounds alternating the forms, a pass over
//! MiniLM's four weight shapes): the exact 8-bit form 67.3 GOP/s at 896 rows and 69.1
//! at 28, this one 76.1 and 78.6 (both then with a `vpxor` a row and quad to shift the
//! activations), and 86.3 and 87.4 with the quantiser writing them shifted (against
//! f32 through `gemm` in the same run: 91.0 and 36.3 GFLOP/s, `gemm` running its
//! AVX-512 kernels whatever the tier; the AVX2 FMA peak of this core is about 62).
//! The raw `vpmaddubsw`, `vpmaddwd`, `vpaddd` chain peaks at about 128 GOP/s here.
//! The scale groups (`NARROW_GROUP`) cost a conversion of each group's sums (a
//! subtraction, a conversion and a fused multiply-add per vector, the f32 sums kept on
//! the stack): in one run, 88.2 GOP/s at 896 rows and 92.6 at 28 in one group, 81.4
//! and 84.3 in groups of 64 (f32 through `gemm`: 107.4 and 48.9).
//!
//! **AVX-VNNI**, on `Shifted` weights. `vpdpbusd` (VEX-encoded, on ymm) on the panel's
//! unsigned bytes, as the AVX512_VNNI tile does on zmm, the weight's shift taken off
//! at the conversion with the rows' sums.
//!
//! **Epilogue.** Both apply a chain's steps (a bias, a residual, GELU: `Step`) to each
//! row's f32 results before they store them, with the element-wise program's
//! operations (`math::gelu_v256` for GELU), as the f32 tile does, so the program's own
//! pass over the output disappears: it was 12% of all-MiniLM-L6-v2's int8 profile at
//! batch 32 on the avx2 tier (perf, `run_range_avx2`).
//!
//! Both run the same tile body ([`Dot`] says how a quad is multiplied): passes of two
//! rows over the panel, each row with four accumulators of 8 columns (16 registers:
//! 8 accumulators, the panel's 4 vectors, the row's broadcast activations, the ones
//! and a temporary), a scale group at a time, then the conversion every path shares
//! (`(acc - shift) as f32 · sw[g, j]`, summed over the groups, times `sa[i]`), so the
//! bits are the portable tile's.

use super::super::f32::avx2::finish;
use super::super::f32::AVX2_ROWS;
use super::super::Cols;
use super::quantize::Bytes;
use super::{Tile, NR, QUAD, ZERO};
use std::arch::x86_64::*;

/// What a [`Dot`]'s sums hold beyond `Σ qa · q`, taken off at the conversion.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Shift {
    /// The weight's shift, `128 · Σ_p qa[i, p]`: one value a row.
    Rows,
    /// The activations' shift, `128 · Σ_p q[p, j]`: one value a column.
    Columns,
}

/// How the tile multiplies one quad of `k` of a panel vector (8 columns × 4 bytes) by
/// a row's four activation bytes (broadcast), into 8 i32 lanes.
pub(super) trait Dot {
    /// What the sums hold beyond `Σ qa · q`.
    const SHIFT: Shift;
    /// `acc` plus, in each i32 lane, the four products of its bytes of `w` (the
    /// panel's) and `x` (the row's, broadcast).
    ///
    /// # Safety
    ///
    /// The CPU has what the implementation's instructions need.
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i;
}

/// AVX2 on `Narrow` weights: the activations shifted to u8 by the 7-bit signed
/// weights, `vpmaddubsw`, `vpmaddwd` by ones, `vpaddd`.
pub(super) struct Unsigned;

impl Dot for Unsigned {
    const SHIFT: Shift = Shift::Columns;

    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX2 (the caller's contract). `x = qa + 128` is in 0..=255 and a
        // `Narrow` weight in -63..=63, so each pair sum of `vpmaddubsw` is at most
        // 2 · 255 · 63 = 32130 in magnitude: no saturation, the sums are exact.
        unsafe {
            let pairs = _mm256_maddubs_epi16(x, w);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

/// AVX-VNNI: `vpdpbusd` on ymm, the panel's unsigned bytes by the signed activations.
pub(super) struct Vnni;

impl Dot for Vnni {
    const SHIFT: Shift = Shift::Rows;

    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX-VNNI (the caller's contract).
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, x) }
    }
}

/// The tile on AVX2, `Narrow` weights.
///
/// # Safety
///
/// The CPU has AVX2; `t.kp >= 4` is a multiple of 4, `t.b` holds `t.kp * NR` bytes of
/// `Narrow` weights (each in -63..=63) and `t.cols` their `NR` column sums, `t.qa`
/// holds `R * t.kp` bytes shifted to u8 (`qa + 128`), `t.sa` and `t.sums` hold `R`,
/// `t.sw` holds `NR`; `1 <= t.width <= NR`; `dst` is valid for writes of
/// `t.at + (R - 1) * t.ldc + t.width` elements, of which nobody else reads or writes
/// the tile's during the call.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    // SAFETY: the caller's contract.
    unsafe { passes::<R, Unsigned>(t, dst) }
}

/// The tile on AVX-VNNI, `Shifted` weights.
///
/// # Safety
///
/// [`tile`]'s, except that `t.b` holds `Shifted` weights, `t.cols` nothing and `t.qa`
/// signed bytes; and the CPU has AVX-VNNI.
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn tile_vnni<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    // SAFETY: the caller's contract.
    unsafe { passes::<R, Vnni>(t, dst) }
}

/// The tile's `R` rows in passes of two over the panel (and one of one row when `R`
/// is odd).
///
/// # Safety
///
/// [`tile`]'s (or [`tile_vnni`]'s), and the CPU has what `D` needs.
#[inline(always)]
unsafe fn passes<const R: usize, D: Dot>(t: &Tile<'_>, dst: *mut f32) {
    let mut i0 = 0;
    while i0 + 2 <= R {
        // SAFETY: rows i0..i0 + 2 of `t`: the caller's contract holds for them.
        unsafe { rows::<2, D>(&t.rows(i0, 2), dst) };
        i0 += 2;
    }
    if i0 < R {
        // SAFETY: as above, for the last row.
        unsafe { rows::<1, D>(&t.rows(i0, 1), dst) };
    }
}

/// One pass: `H` rows of `t` by its whole panel, 4 accumulators of 8 columns a row,
/// a scale group of `k` at a time, each group's sums converted and added up in f32.
///
/// # Safety
///
/// [`passes`]'s, for `H` rows.
#[inline(always)]
unsafe fn rows<const H: usize, D: Dot>(t: &Tile<'_>, dst: *mut f32) {
    // SAFETY: the caller's contract (every intrinsic needs AVX2 at most, or `D`'s).
    unsafe {
        let mut f = [[_mm256_setzero_ps(); 4]; H];
        let (a, b) = (t.qa.as_ptr(), t.b.as_ptr());
        let (quads, all) = (t.group / 4, t.kp / 4);
        let mut p0 = 0;
        for g in 0..t.groups() {
            let mut acc = [[_mm256_setzero_si256(); 4]; H];
            for p in p0..(p0 + quads).min(all) {
                // p < kp / 4, so bytes p * QUAD..(p + 1) * QUAD are inside `t.b` (kp *
                // NR = kp / 4 * QUAD bytes), and row i's 4 bytes at i * kp + 4 * p are
                // inside `t.qa` (H * kp bytes) for i < H.
                super::super::prefetch_ahead(b.wrapping_add(p * QUAD));
                let mut w = [_mm256_setzero_si256(); 4];
                for (c, w) in w.iter_mut().enumerate() {
                    *w = _mm256_loadu_si256(b.add(p * QUAD + 32 * c).cast());
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let x = std::ptr::read_unaligned(a.add(i * t.kp + 4 * p).cast::<i32>());
                    let x = _mm256_set1_epi32(x);
                    for (acc, &w) in acc.iter_mut().zip(&w) {
                        *acc = D::dot(*acc, w, x);
                    }
                }
            }
            convert::<H>(&acc, D::SHIFT, t, g, &mut f);
            p0 += quads;
        }
        store::<H>(&f, t, dst);
    }
}

/// Adds group `g`'s sums `acc` of `t`'s `H` rows (row `i`'s columns `8c..8c + 8` in
/// `acc[i][c]`) to `f`, as f32: `(acc - s) as f32 · sw[g, j]` (one rounding: a fused
/// multiply-add), with `s` as `shift` says (`128 · sums[i]` or `128 · cols[g, j]`);
/// group 0's are taken as they are (the product rounded).
///
/// # Safety
///
/// The CPU has AVX2; `t.sums` holds `H`, `t.sw` holds `(g + 1) * NR` or more, and
/// `t.cols` too for `Shift::Columns`.
#[inline(always)]
unsafe fn convert<const H: usize>(
    acc: &[[__m256i; 4]; H],
    shift: Shift,
    t: &Tile<'_>,
    g: usize,
    f: &mut [[__m256; 4]; H],
) {
    // SAFETY: the caller's contract: `t.sw` (and for `Columns` `t.cols`) holds the 32
    // values of group g at g * NR.. (four vectors).
    unsafe {
        let (sw, cols) = (t.sw.as_ptr().add(g * NR), t.cols.as_ptr());
        let mut by_col = [_mm256_setzero_si256(); 4];
        if shift == Shift::Columns {
            for (c, v) in by_col.iter_mut().enumerate() {
                let sums = _mm256_loadu_si256(cols.add(g * NR + 8 * c).cast());
                *v = _mm256_slli_epi32::<7>(sums);
            }
        }
        for (i, (acc, f)) in acc.iter().zip(f.iter_mut()).enumerate() {
            let by_row = match shift {
                Shift::Rows => t.sums[i].wrapping_mul(ZERO as i32),
                Shift::Columns => 0,
            };
            let by_row = _mm256_set1_epi32(by_row);
            for (c, (&acc, f)) in acc.iter().zip(f.iter_mut()).enumerate() {
                let s = _mm256_add_epi32(by_row, by_col[c]);
                let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc, s));
                let sw = _mm256_loadu_ps(sw.add(8 * c));
                *f = if g == 0 {
                    _mm256_mul_ps(v, sw)
                } else {
                    _mm256_fmadd_ps(v, sw, *f)
                };
            }
        }
    }
}

/// Stores `f · sa[i]` for `t`'s `H` rows (row `i`'s columns `8c..8c + 8` in
/// `f[i][c]`), each value taken through `t.epilogue` first, to `t.width` columns: by
/// the f32 AVX2 tile's `finish`, one 16-column half of the panel at a time, so the
/// epilogue's bits are the f32 tile's.
///
/// # Safety
///
/// The CPU has AVX2 and FMA; `t.sa` holds `H`; `H <= AVX2_ROWS`; `1 <= t.width <= NR`;
/// `dst` is valid for writes of `t.at + (H - 1) * t.ldc + t.width` elements, of which
/// nobody else reads or writes the tile's meanwhile; every operand of `t.epilogue`
/// holds the tile's rows' columns `t.j0..t.j0 + t.width` (rows `t.row0..t.row0 + H` of
/// a `Operand::Rows`).
#[inline(always)]
unsafe fn store<const H: usize>(f: &[[__m256; 4]; H], t: &Tile<'_>, dst: *mut f32) {
    let at = Cols {
        j0: t.j0,
        width: t.width,
        ldc: t.ldc,
    };
    // `finish` writes row i's columns at `i * ldc + j0` from its `dst`, so it gets ours
    // moved by `at - j0` (wrapping: only the sum it forms is used).
    let rows = dst.wrapping_add(t.at).wrapping_sub(t.j0);
    for half in 0..2 {
        if 16 * half >= t.width {
            break;
        }
        // SAFETY: the CPU has AVX2 (the caller's contract); no memory is touched.
        let acc = unsafe {
            let mut acc = [[_mm256_setzero_ps(); AVX2_ROWS]; 2];
            for (i, f) in f.iter().enumerate() {
                let sa = _mm256_set1_ps(t.sa[i]);
                acc[0][i] = _mm256_mul_ps(f[2 * half], sa);
                acc[1][i] = _mm256_mul_ps(f[2 * half + 1], sa);
            }
            acc
        };
        // SAFETY: the caller's contract, which is `finish`'s for these `H` rows: the
        // CPU has AVX2 and FMA, `rows` holds columns `at` of the tile's rows, as every
        // epilogue operand does, and the half holds columns (checked above).
        unsafe { finish::<H>((t.epilogue, t.row0, at), half, acc[0], acc[1], rows) };
    }
}

/// [`super::quantize::slice`] in AVX2: the same bytes, scale and sum. A pass for the
/// largest magnitude (and a NaN-or-infinity check: `x · 0` summed, as the portable
/// form does), then 32 elements at a time: `x · 127 / max` clamped to ±127, rounded
/// to nearest even by adding 1.5 · 2²³ and taking the integer from the low bits, the
/// i32 packed to bytes (`vpackssdw`, `vpacksswb`, `vpermd` to undo their lane order),
/// summed in i32, xored with `bytes`' mask. The tail goes element by element.
///
/// # Safety
///
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_slice(row: &[f32], out: &mut [i8], bytes: Bytes) -> (f32, i32) {
    let n = row.len();
    assert!(out.len() >= n);
    let (r, o) = (row.as_ptr(), out.as_mut_ptr());
    let body = n / 32 * 32;
    let tail = n / 8 * 8;
    // SAFETY: AVX2 and FMA (the caller's contract); every load reads 8 floats at
    // p < tail (≤ n) with p + 8 ≤ n, and every store 32 bytes at p < body with
    // p + 32 ≤ n ≤ out.len().
    unsafe {
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let zero = _mm256_setzero_ps();
        let (mut m0, mut m1, mut bad) = (zero, zero, zero);
        let mut p = 0;
        while p + 16 <= tail {
            let (x0, x1) = (_mm256_loadu_ps(r.add(p)), _mm256_loadu_ps(r.add(p + 8)));
            m0 = _mm256_max_ps(m0, _mm256_and_ps(x0, abs));
            m1 = _mm256_max_ps(m1, _mm256_and_ps(x1, abs));
            bad = _mm256_fmadd_ps(x0, zero, bad);
            bad = _mm256_fmadd_ps(x1, zero, bad);
            p += 16;
        }
        if p < tail {
            let x = _mm256_loadu_ps(r.add(p));
            m0 = _mm256_max_ps(m0, _mm256_and_ps(x, abs));
            bad = _mm256_fmadd_ps(x, zero, bad);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_max_ps(m0, m1));
        let mut bads = [0f32; 8];
        _mm256_storeu_ps(bads.as_mut_ptr(), bad);
        let (mut max, mut bad) = (0f32, bads.iter().sum::<f32>());
        for v in lanes.into_iter().chain(row[tail..].iter().map(|x| x.abs())) {
            max = if v > max { v } else { max };
        }
        for &x in &row[tail..] {
            bad += x * 0.0;
        }
        let inv = match super::quantize::factor(max, bad, out, bytes) {
            Ok(inv) => inv,
            Err(scale) => return (scale, 0),
        };
        let (f, hi, lo) = (
            _mm256_set1_ps(inv),
            _mm256_set1_ps(127.0),
            _mm256_set1_ps(-127.0),
        );
        let magic = _mm256_set1_ps(super::MAGIC);
        let bits = _mm256_set1_epi32(super::MAGIC.to_bits() as i32);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mask = bytes.mask();
        let masks = _mm256_set1_epi8(mask);
        let round = |x: __m256| {
            let y = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(x, f), lo), hi);
            _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(y, magic)), bits)
        };
        let mut sums = _mm256_setzero_si256();
        let mut p = 0;
        while p < body {
            let q: [__m256i; 4] = [
                round(_mm256_loadu_ps(r.add(p))),
                round(_mm256_loadu_ps(r.add(p + 8))),
                round(_mm256_loadu_ps(r.add(p + 16))),
                round(_mm256_loadu_ps(r.add(p + 24))),
            ];
            sums = _mm256_add_epi32(
                sums,
                _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])),
            );
            let bytes = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let bytes = _mm256_permutevar8x32_epi32(bytes, order);
            _mm256_storeu_si256(o.add(p).cast(), _mm256_xor_si256(bytes, masks));
            p += 32;
        }
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sums);
        let mut sum: i32 = lanes.iter().sum();
        for (o, &x) in out[body..n].iter_mut().zip(&row[body..]) {
            let q = super::round_to_i8(x * inv);
            *o = q as i8 ^ mask;
            sum += q;
        }
        out[n..].fill(mask);
        (max / 127.0, sum)
    }
}
