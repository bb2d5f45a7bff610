//! The AVX2 (with FMA) forms of [`gelu`](super::gelu) and [`exp`](super::exp): the
//! scalar functions' operations in the same order, each one IEEE operation (or, in
//! `gelu`, one fused multiply-add) in both, so every lane gets the scalar function's
//! bits (the tests check it over a dense sweep of f32 and the special values), as the
//! AVX-512 forms (module `avx512`) do. AVX2 has no `vscalefps`: `2^k` is built in the
//! exponent bits as two factors, as the scalar functions build it.
//!
//! [`gelu_v256`] and [`exp_v256`] work on registers, for the fused kernel's
//! accumulator and the f32 tile's epilogue on AVX2; [`gelu_n`] runs GELU over slices
//! for `math::in_place` and `math::map_into` (module `x86` picks the widest form the
//! tier runs).

use std::arch::x86_64::*;

use super::{
    gelu, EXP_INF_ABOVE, EXP_MAX, EXP_MIN, GELU_EXP, GELU_HALF_SQRT_HALF, GELU_P, GELU_XMAX,
    LN2_HI, LN2_LO, LOG2E, ROUND,
};

/// `[e(0), e(1), .., e(N - 1)]` with `$i` the index in `$e`: a loop the compiler
/// unrolls, independent chains the core can overlap.
macro_rules! each {
    ($n:ident, $i:ident => $e:expr) => {{
        let mut out = [_mm256_setzero_ps(); $n];
        for $i in 0..$n {
            out[$i] = $e;
        }
        out
    }};
}

/// `x` in every lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn splat(x: f32) -> __m256 {
    _mm256_set1_ps(x)
}

/// `-x` (the sign bit flipped, as the scalar `-x`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn neg(x: __m256) -> __m256 {
    _mm256_xor_ps(x, splat(-0.0))
}

/// `2^ki` as the two normal factors `2^(ki >> 1)` and `2^(ki - (ki >> 1))`, built in
/// the exponent bits (the scalar functions' `s1`, `s2`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn two_factors(ki: __m256i) -> (__m256, __m256) {
    let half = _mm256_srai_epi32::<1>(ki);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_slli_epi32::<23>(_mm256_add_epi32(half, bias));
    let s2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_sub_epi32(ki, half), bias));
    (_mm256_castsi256_ps(s1), _mm256_castsi256_ps(s2))
}

/// The integer `k` that `t = k + ROUND` holds in its low mantissa bits.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn rounded_int(t: __m256) -> __m256i {
    _mm256_sub_epi32(
        _mm256_castps_si256(t),
        _mm256_set1_epi32(ROUND.to_bits() as i32),
    )
}

/// [`gelu`](super::gelu) of every lane of `N` vectors.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn gelu_v256<const N: usize>(x: [__m256; N]) -> [__m256; N] {
    let (p, c) = (GELU_P, GELU_EXP);
    let one = splat(1.0);
    // `vminps` gives its second operand for a NaN, as the scalar `if` does.
    let xa = each!(N, i => _mm256_min_ps(_mm256_andnot_ps(splat(-0.0), x[i]), splat(GELU_XMAX)));
    let t = each!(N, i => {
        let d = _mm256_fmadd_ps(xa[i], splat(GELU_HALF_SQRT_HALF), one);
        _mm256_div_ps(one, d)
    });
    let mut q = [splat(p[9]); N];
    for &pj in p[..9].iter().rev() {
        q = each!(N, i => _mm256_fmadd_ps(q[i], t[i], splat(pj)));
    }
    let hx = each!(N, i => _mm256_mul_ps(splat(0.5), xa[i]));
    let h = each!(N, i => _mm256_mul_ps(hx[i], xa[i]));
    let h_lo = each!(N, i => _mm256_fmsub_ps(hx[i], xa[i], h[i]));
    let kr = each!(N, i => {
        let s = _mm256_sub_ps(q[i], h[i]);
        _mm256_fmadd_ps(s, splat(LOG2E), splat(ROUND))
    });
    let k = each!(N, i => _mm256_sub_ps(kr[i], splat(ROUND)));
    let u = each!(N, i => _mm256_fmadd_ps(k[i], splat(LN2_HI), h[i]));
    let r = each!(N, i => {
        let d = _mm256_sub_ps(_mm256_sub_ps(q[i], u[i]), h_lo[i]);
        _mm256_fnmadd_ps(k[i], splat(LN2_LO), d)
    });
    let mut e = [splat(c[6]); N];
    for &cj in c[..6].iter().rev() {
        e = each!(N, i => _mm256_fmadd_ps(e[i], r[i], splat(cj)));
    }
    // t · ((e · 2^half) · 2^(k - half)), as the scalar products.
    let w = each!(N, i => {
        let (s1, s2) = two_factors(rounded_int(kr[i]));
        _mm256_mul_ps(t[i], _mm256_mul_ps(_mm256_mul_ps(e[i], s1), s2))
    });
    each!(N, i => {
        let is_neg = _mm256_cmp_ps::<_CMP_LT_OQ>(x[i], _mm256_setzero_ps());
        let pos = _mm256_mul_ps(x[i], _mm256_sub_ps(one, w[i]));
        _mm256_blendv_ps(pos, _mm256_mul_ps(neg(xa[i]), w[i]), is_neg)
    })
}

/// [`exp`](super::exp) of one vector: plain multiplies and adds (no FMA), the clamp as
/// `f32::clamp` (a NaN passes), the two-factor `2^k`, then the two selects.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
    // `if x < MIN { MIN }` is `max(MIN, x)`, `if y > MAX { MAX }` is `min(MAX, y)`:
    // `vmaxps`/`vminps` give their second operand for a NaN.
    let xc = _mm256_min_ps(splat(EXP_MAX), _mm256_max_ps(splat(EXP_MIN), x));
    let t = _mm256_add_ps(_mm256_mul_ps(xc, splat(LOG2E)), splat(ROUND));
    let k = _mm256_sub_ps(t, splat(ROUND));
    let r = _mm256_sub_ps(
        _mm256_sub_ps(xc, _mm256_mul_ps(k, splat(LN2_HI))),
        _mm256_mul_ps(k, splat(LN2_LO)),
    );
    // 1 + r (1 + r (1/2 + r (1/6 + .. + r (1/720 + r / 5040)))), innermost first.
    let mut p = _mm256_mul_ps(r, splat(1.0 / 5040.0));
    let c: [f32; 6] = [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0];
    for cj in c {
        p = _mm256_mul_ps(r, _mm256_add_ps(splat(cj), p));
    }
    let p = _mm256_add_ps(splat(1.0), p);
    let (s1, s2) = two_factors(rounded_int(t));
    let y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    let low = _mm256_cmp_ps::<_CMP_LT_OQ>(x, splat(EXP_MIN));
    let y = _mm256_andnot_ps(low, y);
    let high = _mm256_cmp_ps::<_CMP_GT_OQ>(x, splat(EXP_INF_ABOVE));
    _mm256_blendv_ps(y, splat(f32::INFINITY), high)
}

/// [`exp`](super::exp) of every lane of `N` vectors.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp_v256<const N: usize>(x: [__m256; N]) -> [__m256; N] {
    each!(N, i => exp8(x[i]))
}

/// `dst[i] = gelu(src[i])` for `i < n`, two vectors at a time, then the last few
/// elements with the scalar function (the same bits).
///
/// # Safety
///
/// The CPU has AVX2 and FMA. `src` must be valid for reading and `dst` for writing `n`
/// f32; they may be the same pointer, and must not overlap otherwise.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gelu_n(src: *const f32, dst: *mut f32, n: usize) {
    const N: usize = 2;
    const STEP: usize = 8 * N;
    let mut i = 0;
    while i + STEP <= n {
        // SAFETY: elements `i .. i + STEP` are within `n`; vector `j` is read before
        // any store to it (`dst` may be `src`).
        let x = each!(N, j => unsafe { _mm256_loadu_ps(src.add(i + 8 * j)) });
        let y = gelu_v256(x);
        for (j, &v) in y.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm256_storeu_ps(dst.add(i + 8 * j), v) };
        }
        i += STEP;
    }
    while i < n {
        // SAFETY: `i < n`; the element is read before it is written.
        unsafe { *dst.add(i) = gelu(*src.add(i)) };
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::x86::testing::{check, gelu_sweep, sweep};
    use super::*;
    use crate::kernels::cpu::Tier;
    use crate::kernels::math::exp;

    #[test]
    fn gelu_v256_is_the_scalar_function() {
        check::<_, 8>(Tier::Avx2, "gelu", gelu_v256::<1>, gelu, &gelu_sweep());
    }

    #[test]
    fn exp_v256_is_the_scalar_function() {
        // The clamps and the selects.
        let xs = sweep(&[EXP_MIN, EXP_MAX, EXP_INF_ABOVE]);
        check::<_, 8>(Tier::Avx2, "exp", exp_v256::<1>, exp, &xs);
    }
}
