//! The AVX-512 forms of [`gelu`](super::gelu) and [`exp`](super::exp): the scalar
//! function's operations in the same order, each an IEEE operation (or, in `gelu`, a
//! fused multiply-add) in both, so every lane gets the scalar function's bits (the
//! tests check it over a dense sweep of f32 and the special values).
//!
//! [`gelu_v512`] and [`exp_v512`] work on registers, for the fused kernel's
//! accumulator and the f32 tile's epilogue; [`gelu_n`] runs GELU over slices for
//! `math::in_place` and `math::map_into` (module `x86` picks the widest form the tier
//! runs). `exp`'s slice loop stays the compiler's: the same operations, vectorised as
//! well, and already close to a copy's time.
//!
//! `tanh`, `sigmoid`, `silu` and `gelu_tanh` have no form here: written the same way
//! on the fused kernel's registers they measured no faster than its tile fallback
//! (1.00 to 1.06 times its time), where `gelu` measured 0.86 to 0.92 times and `exp`
//! 0.81 to 0.93 (a fused `[input, op]` over 16K floats, the two alternated in one
//! process).

use std::arch::x86_64::*;

use super::{
    EXP_INF_ABOVE, EXP_MAX, EXP_MIN, GELU_EXP, GELU_HALF_SQRT_HALF, GELU_P, GELU_XMAX, LN2_HI,
    LN2_LO, LOG2E, ROUND,
};

/// `[e(0), e(1), .., e(N - 1)]` with `$i` the index in `$e`: a loop the compiler
/// unrolls. The function is written step by step over its `N` vectors, independent
/// chains the core can overlap (LLVM's scheduler reorders them as it likes).
macro_rules! each {
    ($n:ident, $i:ident => $e:expr) => {{
        let mut out = [_mm512_setzero_ps(); $n];
        for $i in 0..$n {
            out[$i] = $e;
        }
        out
    }};
}

/// [`gelu`](super::gelu) of every lane of `N` vectors.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn gelu_v512<const N: usize>(x: [__m512; N]) -> [__m512; N] {
    let (p, c) = (GELU_P, GELU_EXP);
    let one = _mm512_set1_ps(1.0);
    // `vminps` gives its second operand for a NaN, as the scalar `if` does.
    let xa = each!(N, i => _mm512_min_ps(_mm512_abs_ps(x[i]), _mm512_set1_ps(GELU_XMAX)));
    let t = each!(N, i => {
        let d = _mm512_fmadd_ps(xa[i], _mm512_set1_ps(GELU_HALF_SQRT_HALF), one);
        _mm512_div_ps(one, d)
    });
    let mut q = [_mm512_set1_ps(p[9]); N];
    for &pj in p[..9].iter().rev() {
        q = each!(N, i => _mm512_fmadd_ps(q[i], t[i], _mm512_set1_ps(pj)));
    }
    let hx = each!(N, i => _mm512_mul_ps(_mm512_set1_ps(0.5), xa[i]));
    let h = each!(N, i => _mm512_mul_ps(hx[i], xa[i]));
    let h_lo = each!(N, i => _mm512_fmsub_ps(hx[i], xa[i], h[i]));
    let kr = each!(N, i => {
        let s = _mm512_sub_ps(q[i], h[i]);
        _mm512_fmadd_ps(s, _mm512_set1_ps(LOG2E), _mm512_set1_ps(ROUND))
    });
    let k = each!(N, i => _mm512_sub_ps(kr[i], _mm512_set1_ps(ROUND)));
    let u = each!(N, i => _mm512_fmadd_ps(k[i], _mm512_set1_ps(LN2_HI), h[i]));
    let r = each!(N, i => {
        let d = _mm512_sub_ps(_mm512_sub_ps(q[i], u[i]), h_lo[i]);
        _mm512_fnmadd_ps(k[i], _mm512_set1_ps(LN2_LO), d)
    });
    let mut e = [_mm512_set1_ps(c[6]); N];
    for &cj in c[..6].iter().rev() {
        e = each!(N, i => _mm512_fmadd_ps(e[i], r[i], _mm512_set1_ps(cj)));
    }
    // `e · 2^k` correctly rounded, as the scalar two-factor product.
    let w = each!(N, i => _mm512_mul_ps(t[i], _mm512_scalef_ps(e[i], k[i])));
    each!(N, i => {
        let is_neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x[i], _mm512_setzero_ps());
        let pos = _mm512_mul_ps(x[i], _mm512_sub_ps(one, w[i]));
        _mm512_mask_mul_ps(pos, is_neg, neg(xa[i]), w[i])
    })
}

/// `x` in every lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn splat(x: f32) -> __m512 {
    _mm512_set1_ps(x)
}

/// `-x` (the sign bit flipped, as the scalar `-x`).
#[inline]
#[target_feature(enable = "avx512f")]
fn neg(x: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(x),
        _mm512_set1_epi32(i32::MIN),
    ))
}

/// [`exp`](super::exp) of one vector: plain multiplies and adds (no FMA), the clamp as
/// `f32::clamp` (a NaN passes), the two-factor `2^k`, then the two selects.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    // `if x < MIN { MIN }` is `max(MIN, x)`, `if y > MAX { MAX }` is `min(MAX, y)`:
    // `vmaxps`/`vminps` give their second operand for a NaN.
    let xc = _mm512_min_ps(splat(EXP_MAX), _mm512_max_ps(splat(EXP_MIN), x));
    let t = _mm512_add_ps(_mm512_mul_ps(xc, splat(LOG2E)), splat(ROUND));
    let k = _mm512_sub_ps(t, splat(ROUND));
    let ki = _mm512_sub_epi32(
        _mm512_castps_si512(t),
        _mm512_set1_epi32(ROUND.to_bits() as i32),
    );
    let r = _mm512_sub_ps(
        _mm512_sub_ps(xc, _mm512_mul_ps(k, splat(LN2_HI))),
        _mm512_mul_ps(k, splat(LN2_LO)),
    );
    // 1 + r (1 + r (1/2 + r (1/6 + .. + r (1/720 + r / 5040)))), innermost first.
    let mut p = _mm512_mul_ps(r, splat(1.0 / 5040.0));
    let c: [f32; 6] = [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0];
    for cj in c {
        p = _mm512_mul_ps(r, _mm512_add_ps(splat(cj), p));
    }
    let p = _mm512_add_ps(splat(1.0), p);
    let half = _mm512_srai_epi32::<1>(ki);
    let bias = _mm512_set1_epi32(127);
    let s1 = _mm512_slli_epi32::<23>(_mm512_add_epi32(half, bias));
    let s2 = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_sub_epi32(ki, half), bias));
    let y = _mm512_mul_ps(
        _mm512_mul_ps(p, _mm512_castsi512_ps(s1)),
        _mm512_castsi512_ps(s2),
    );
    let low = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, splat(EXP_MIN));
    let y = _mm512_mask_mov_ps(y, low, _mm512_setzero_ps());
    let high = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, splat(EXP_INF_ABOVE));
    _mm512_mask_mov_ps(y, high, splat(f32::INFINITY))
}

/// [`exp`](super::exp) of every lane of `N` vectors.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn exp_v512<const N: usize>(x: [__m512; N]) -> [__m512; N] {
    each!(N, i => exp16(x[i]))
}

/// `dst[i] = gelu(src[i])` for `i < n`, two vectors at a time, then one (masked) at a
/// time.
///
/// # Safety
///
/// The CPU has AVX-512F. `src` must be valid for reading and `dst` for writing `n`
/// f32; they may be the same pointer, and must not overlap otherwise.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gelu_n(src: *const f32, dst: *mut f32, n: usize) {
    const N: usize = 2;
    const STEP: usize = 16 * N;
    let mut i = 0;
    while i + STEP <= n {
        // SAFETY: elements `i .. i + STEP` are within `n`; vector `j` is read before
        // any store to it (`dst` may be `src`).
        let x = each!(N, j => unsafe { _mm512_loadu_ps(src.add(i + 16 * j)) });
        let y = gelu_v512(x);
        for (j, &v) in y.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm512_storeu_ps(dst.add(i + 16 * j), v) };
        }
        i += STEP;
    }
    while i < n {
        let m: __mmask16 = if n - i >= 16 {
            u16::MAX
        } else {
            (1 << (n - i)) - 1
        };
        // SAFETY: the lanes of `m` are elements `i ..` below `n`; masked-off lanes are
        // not accessed.
        let x = unsafe { _mm512_maskz_loadu_ps(m, src.add(i)) };
        let [y] = gelu_v512([x]);
        // SAFETY: as for the load.
        unsafe { _mm512_mask_storeu_ps(dst.add(i), m, y) };
        i += 16;
    }
}

#[cfg(test)]
mod tests {
    use super::super::x86::testing::{check, gelu_sweep, sweep};
    use super::*;
    use crate::kernels::cpu::Tier;
    use crate::kernels::math::{exp, gelu};

    #[test]
    fn gelu_v512_is_the_scalar_function() {
        let x = GELU_XMAX;
        check::<_, 16>(Tier::Avx512, "gelu", gelu_v512::<1>, gelu, &gelu_sweep());
        assert_eq!(gelu(-x).to_bits(), (-0.0f32).to_bits());
        assert_eq!(gelu(f32::NEG_INFINITY).to_bits(), (-0.0f32).to_bits());
        assert_eq!(gelu(f32::MAX), f32::MAX);
    }

    #[test]
    fn exp_v512_is_the_scalar_function() {
        // The clamps and the selects.
        let xs = sweep(&[EXP_MIN, EXP_MAX, EXP_INF_ABOVE]);
        check::<_, 16>(Tier::Avx512, "exp", exp_v512::<1>, exp, &xs);
    }
}
