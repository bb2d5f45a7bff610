//! The bf16 tile on AVX512_BF16: `vdpbf16ps` on the panel's pairs as they are, by the
//! left rows rounded to pairs (`vcvtneps2bf16`, 16 elements at a
//! time), 14 rows × 32 columns.

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
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(q * NR + 16).cast()));
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
