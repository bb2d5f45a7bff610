//! The AVX-512 split of f32 rows into the `hi` and `lo` bf16 tiles of a row tile's
//! blocks, the packing step of the AMX path's left operand.

use super::{Parts, KB, TILE};
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Splits one row (`k` elements) into row `r` of a row tile's blocks at `tiles`
/// (block `kb`'s `hi` tile at `count · kb · TILE`, its `lo` tile right after when
/// `parts` keeps it), 32 elements per block, the last block's past `k` zero.
///
/// # Safety
///
/// The CPU has AVX-512F, BW and AVX512_BF16. (`tiles` must hold `ceil(k / KB)`
/// blocks of `count` tiles: asserted.)
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn split_row(
    row: &[f32],
    tiles: &mut [MaybeUninit<u32>],
    r: usize,
    parts: Parts,
) {
    let k = row.len();
    let blocks = k.div_ceil(KB);
    let count = parts.count();
    assert!(tiles.len() >= blocks * count * TILE && r < 16);
    for kb in 0..blocks {
        let p = kb * KB;
        let n0 = (k - p).min(16);
        let n1 = (k - p).saturating_sub(16).min(16);
        let m0 = ((1u32 << n0) - 1) as __mmask16;
        let m1 = ((1u32 << n1) - 1) as __mmask16;
        // SAFETY: the masked loads read only elements p..p + n0 and p + 16..p + 16 +
        // n1, all below k; the stores write 64 bytes at tile rows inside `tiles`
        // (asserted); the transmutes reinterpret 32 bf16 as 16 pairs and back.
        unsafe {
            let x0 = _mm512_maskz_loadu_ps(m0, row.as_ptr().add(p));
            let x1 = _mm512_maskz_loadu_ps(m1, row.as_ptr().wrapping_add(p + 16));
            let hi: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(x1, x0));
            let at = tiles
                .as_mut_ptr()
                .add(count * kb * TILE + 16 * r)
                .cast::<u32>();
            _mm512_storeu_si512(at.cast(), hi);
            if parts == Parts::Hi {
                continue;
            }
            // The hi halves back in f32: each bf16 in the top half of its lane.
            let h0 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm512_castsi512_si256(hi),
            )));
            let h1 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm512_extracti64x4_epi64::<1>(hi),
            )));
            // lo = x - hi, zero where hi is not finite (its exponent all ones).
            let inf = _mm512_set1_epi32(0x7f80_0000);
            let f0 = _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(h0), inf), inf);
            let f1 = _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(h1), inf), inf);
            let l0 = _mm512_maskz_sub_ps(f0, x0, h0);
            let l1 = _mm512_maskz_sub_ps(f1, x1, h1);
            let lo: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(l1, l0));
            _mm512_storeu_si512(at.add(TILE).cast(), lo);
        }
    }
}
