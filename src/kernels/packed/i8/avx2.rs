//! The int8 tile on 256-bit registers: the AVX2 tier (Haswell, Zen 1–3) and, with
//! `vpdpbusd` on ymm, the AVX-VNNI one (Alder Lake, Zen 5 without AVX-512); and the
//! activation quantisation in AVX2.
//!
//! **AVX2.** Without VNNI the widest byte product is `vpmaddubsw`: u8 × s8, pairs
//! summed into i16 **with saturation**. The panel's bytes are the weight shifted to
//! u8 (`q + 128`, up to 255) and the activations reach ±127, so a pair could reach
//! 2 · 255 · 127 > 32767 and saturate. The tile instead takes the weight back to signed
//! (`q = byte ^ 0x80`, in -127..=127) and moves the activation's sign onto it
//! (`vpsignb`): `|qa| · (sign(qa) · q) = qa · q`, with `|qa| ≤ 127` the unsigned
//! operand, so a pair sum is at most 2 · 127 · 127 = 32258 < 32767 and never
//! saturates. `vpmaddwd` by ones then sums the pairs into i32 and `vpaddd` into the
//! accumulators: four instructions per 32 multiply-adds (VNNI does them in one), with
//! the exact sums `Σ qa · q` (no shift to take off). Measured against the other exact
//! forms on a Skylake-SP core (a 60 × 384 by 384 × 1152 product, weight in L2):
//! MEASURED-AVX2.
//!
//! **AVX-VNNI.** `vpdpbusd` (VEX-encoded, on ymm) on the panel's unsigned bytes, as
//! the AVX512_VNNI tile does on zmm, the shift taken off at the conversion.
//!
//! Both run the same tile body ([`Dot`] says how a quad is multiplied): passes of two
//! rows over the panel, each row with four accumulators of 8 columns (16 registers:
//! 8 accumulators, the panel's 4 vectors, the row's broadcast activations and the
//! temporaries), then the conversion every path shares, `((acc - shift) as f32 ·
//! sw[j]) · sa[i]`, so the bits are the portable tile's.

use super::{Tile, QUAD, ZERO};
use std::arch::x86_64::*;

/// How the tile multiplies one quad of `k` of a panel vector (8 columns × 4 bytes) by
/// a row's four activation bytes (broadcast), into 8 i32 lanes.
pub(super) trait Dot {
    /// Whether the sums keep the weight's shift (`128 · Σ qa`, taken off at the
    /// conversion).
    const SHIFTED: bool;
    /// The panel's vector as [`Dot::dot`] takes it.
    ///
    /// # Safety
    ///
    /// The CPU has what the implementation's instructions need.
    unsafe fn weight(w: __m256i) -> __m256i;
    /// The row's broadcast activation bytes as [`Dot::dot`] takes them.
    ///
    /// # Safety
    ///
    /// As for [`Dot::weight`].
    unsafe fn row(x: __m256i) -> [__m256i; 2];
    /// `acc` plus, in each i32 lane, the four products of its bytes of `w` and `x`.
    ///
    /// # Safety
    ///
    /// As for [`Dot::weight`].
    unsafe fn dot(acc: __m256i, w: __m256i, x: &[__m256i; 2]) -> __m256i;
}

/// AVX2: the activation's sign moved onto the signed weight, `vpmaddubsw`,
/// `vpmaddwd` by ones, `vpaddd` (see the module doc for why it cannot saturate).
pub(super) struct Sign;

impl Dot for Sign {
    const SHIFTED: bool = false;

    #[inline(always)]
    unsafe fn weight(w: __m256i) -> __m256i {
        // SAFETY: AVX2 (the caller's contract).
        unsafe { _mm256_xor_si256(w, _mm256_set1_epi8(ZERO as i8)) }
    }

    #[inline(always)]
    unsafe fn row(x: __m256i) -> [__m256i; 2] {
        // SAFETY: AVX2 (the caller's contract).
        unsafe { [x, _mm256_abs_epi8(x)] }
    }

    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, x: &[__m256i; 2]) -> __m256i {
        // SAFETY: AVX2 (the caller's contract). `x[1] = |qa| ≤ 127` and the signed
        // weight is in -127..=127, so each pair sum of `vpmaddubsw` is at most 32258:
        // no saturation, the i16 and then i32 sums are exact.
        unsafe {
            let pairs = _mm256_maddubs_epi16(x[1], _mm256_sign_epi8(w, x[0]));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

/// AVX-VNNI: `vpdpbusd` on ymm, the panel's unsigned bytes by the signed activations.
pub(super) struct Vnni;

impl Dot for Vnni {
    const SHIFTED: bool = true;

    #[inline(always)]
    unsafe fn weight(w: __m256i) -> __m256i {
        w
    }

    #[inline(always)]
    unsafe fn row(x: __m256i) -> [__m256i; 2] {
        [x, x]
    }

    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, x: &[__m256i; 2]) -> __m256i {
        // SAFETY: AVX-VNNI (the caller's contract).
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, x[0]) }
    }
}

/// The tile on AVX2.
///
/// # Safety
///
/// The CPU has AVX2; `t.kp >= 4` is a multiple of 4, `t.b` holds `t.kp * NR` bytes,
/// `t.qa` holds `R * t.kp`, `t.sa` and `t.sums` hold `R`, `t.sw` holds `NR`; `1 <=
/// t.width <= NR`; `dst` is valid for writes of `t.at + (R - 1) * t.ldc + t.width`
/// elements, of which nobody else reads or writes the tile's during the call.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    // SAFETY: the caller's contract.
    unsafe { passes::<R, Sign>(t, dst) }
}

/// The tile on AVX-VNNI.
///
/// # Safety
///
/// [`tile`]'s, and the CPU has AVX-VNNI.
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
/// [`tile`]'s, and the CPU has what `D` needs.
#[inline(always)]
pub(super) unsafe fn passes<const R: usize, D: Dot>(t: &Tile<'_>, dst: *mut f32) {
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

/// One pass: `H` rows of `t` by its whole panel, 4 accumulators of 8 columns a row.
///
/// # Safety
///
/// [`passes`]'s, for `H` rows.
#[inline(always)]
unsafe fn rows<const H: usize, D: Dot>(t: &Tile<'_>, dst: *mut f32) {
    // SAFETY: the caller's contract (every intrinsic needs AVX2 at most, or `D`'s).
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); 4]; H];
        let (a, b) = (t.qa.as_ptr(), t.b.as_ptr());
        for p in 0..t.kp / 4 {
            // p < kp / 4, so bytes p * QUAD..(p + 1) * QUAD are inside `t.b` (kp * NR
            // = kp / 4 * QUAD bytes), and row i's 4 bytes at i * kp + 4 * p are
            // inside `t.qa` (H * kp bytes) for i < H.
            super::super::prefetch_ahead(b.wrapping_add(p * QUAD));
            let mut w = [_mm256_setzero_si256(); 4];
            for (c, w) in w.iter_mut().enumerate() {
                *w = D::weight(_mm256_loadu_si256(b.add(p * QUAD + 32 * c).cast()));
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = std::ptr::read_unaligned(a.add(i * t.kp + 4 * p).cast::<i32>());
                let x = D::row(_mm256_set1_epi32(x));
                for (acc, w) in acc.iter_mut().zip(&w) {
                    *acc = D::dot(*acc, *w, &x);
                }
            }
        }
        store::<H>(&acc, D::SHIFTED, t, dst);
    }
}

/// Converts and stores the sums `acc` of `t`'s `H` rows (row `i`'s columns `8c..8c +
/// 8` in `acc[i][c]`): `((acc - shift) as f32 · sw[j]) · sa[i]`, `shift = 128 ·
/// sums[i]` when `shifted`, else 0, stored to `t.width` columns.
///
/// # Safety
///
/// The CPU has AVX2; `t.sa` and `t.sums` hold `H`, `t.sw` holds `NR`; `1 <= t.width
/// <= NR`; `dst` is valid for writes of `t.at + (H - 1) * t.ldc + t.width` elements,
/// of which nobody else reads or writes the tile's meanwhile.
#[inline(always)]
unsafe fn store<const H: usize>(
    acc: &[[__m256i; 4]; H],
    shifted: bool,
    t: &Tile<'_>,
    dst: *mut f32,
) {
    // SAFETY: the caller's contract; `t.sw` holds 32 floats (four vectors); row i's
    // columns are at at + i * ldc.., inside `dst`; a vector is stored whole only when
    // all its 8 columns are below `width`, else masked to those that are.
    unsafe {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (i, acc) in acc.iter().enumerate() {
            let shift = if shifted {
                t.sums[i].wrapping_mul(ZERO as i32)
            } else {
                0
            };
            let (shift, sa) = (_mm256_set1_epi32(shift), _mm256_set1_ps(t.sa[i]));
            let row = dst.add(t.at + i * t.ldc);
            for (c, &acc) in acc.iter().enumerate() {
                let sw = _mm256_loadu_ps(t.sw.as_ptr().add(8 * c));
                let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc, shift));
                let v = _mm256_mul_ps(_mm256_mul_ps(v, sw), sa);
                if t.width >= 8 * (c + 1) {
                    _mm256_storeu_ps(row.add(8 * c), v);
                } else if t.width > 8 * c {
                    let mask =
                        _mm256_cmpgt_epi32(_mm256_set1_epi32((t.width - 8 * c) as i32), lane);
                    _mm256_maskstore_ps(row.add(8 * c), mask, v);
                }
            }
        }
    }
}

/// [`super::quantize::slice`] in AVX2: the same bytes, scale and sum. A pass for the
/// largest magnitude (and a NaN-or-infinity check: `x · 0` summed, as the portable
/// form does), then 32 elements at a time: `x · 127 / max` clamped to ±127, rounded
/// to nearest even by adding 1.5 · 2²³ and taking the integer from the low bits, the
/// i32 packed to bytes (`vpackssdw`, `vpacksswb`, `vpermd` to undo their lane order),
/// summed in i32. The tail goes element by element.
///
/// # Safety
///
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_slice(row: &[f32], out: &mut [i8]) -> (f32, i32) {
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
        let inv = match super::quantize::factor(max, bad, out) {
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
            _mm256_storeu_si256(o.add(p).cast(), bytes);
            p += 32;
        }
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sums);
        let mut sum: i32 = lanes.iter().sum();
        for (o, &x) in out[body..n].iter_mut().zip(&row[body..]) {
            let q = super::round_to_i8(x * inv);
            *o = q as i8;
            sum += q;
        }
        out[n..].fill(0);
        (max / 127.0, sum)
    }
}
