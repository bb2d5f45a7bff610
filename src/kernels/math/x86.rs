//! The AVX-512 forms of [`gelu`](super::gelu) and [`exp`](super::exp): the scalar
//! function's operations in the same order, each an IEEE operation (or, in `gelu`, a
//! fused multiply-add) in both, so every lane gets the scalar function's bits (the
//! tests check it over a dense sweep of f32 and the special values).
//!
//! [`gelu_v512`] and [`exp_v512`] work on registers, for the fused kernel's
//! accumulator; [`gelu_in_place`] and [`gelu_map_into`] run GELU over slices for
//! `math::in_place` and `math::map_into`, when `cpu::has_avx512` says so (so
//! `STREAMFUSE_PORTABLE=1` turns them off). `exp`'s slice loop stays the compiler's:
//! the same operations, vectorised as well, and already close to a copy's time.
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
use crate::kernels::cpu;

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
/// `src` must be valid for reading and `dst` for writing `n` f32; they may be the same
/// pointer, and must not overlap otherwise.
#[target_feature(enable = "avx512f")]
unsafe fn gelu_n(src: *const f32, dst: *mut f32, n: usize) {
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

/// `xs[i] = gelu(xs[i])` with AVX-512 and true, if `cpu::has_avx512`; false (and
/// nothing done) otherwise.
pub(crate) fn gelu_in_place(xs: &mut [f32]) -> bool {
    if !cpu::has_avx512() {
        return false;
    }
    let p = xs.as_mut_ptr();
    // SAFETY: the CPU has AVX-512F (`has_avx512`); `p` is valid for reading and writing
    // `xs.len()` f32, and `gelu_n` allows `src == dst`.
    unsafe { gelu_n(p, p, xs.len()) };
    true
}

/// `dst[i] = gelu(src[i])` for the elements both have, with AVX-512 and true, if
/// `cpu::has_avx512`; false (and nothing done) otherwise.
pub(crate) fn gelu_map_into(src: &[f32], dst: &mut [f32]) -> bool {
    if !cpu::has_avx512() {
        return false;
    }
    let n = src.len().min(dst.len());
    // SAFETY: the CPU has AVX-512F; `src` and `dst` are valid for `n` f32 and distinct
    // borrows, so they do not overlap.
    unsafe { gelu_n(src.as_ptr(), dst.as_mut_ptr(), n) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::math::{exp, gelu};
    use crate::kernels::testutil::Rng;

    /// A vector form on one vector, as the tests call it.
    type Vf = unsafe fn([__m512; 1]) -> [__m512; 1];

    /// `vf` over `xs` (when the CPU has AVX-512F, whatever `STREAMFUSE_PORTABLE` says:
    /// this tests the vector function itself) against the scalar `sf`, bit for bit (any
    /// NaN matching any NaN).
    fn check(name: &str, vf: Vf, sf: fn(f32) -> f32, xs: &[f32]) {
        if !cpu::cpu_runs(cpu::Tier::Avx512) {
            return;
        }
        for chunk in xs.chunks(16) {
            let mut lanes = [0f32; 16];
            lanes[..chunk.len()].copy_from_slice(chunk);
            let mut got = [0f32; 16];
            // SAFETY: the CPU has AVX-512F; `lanes` and `got` hold 16 f32 each.
            unsafe {
                let [y] = vf([_mm512_loadu_ps(lanes.as_ptr())]);
                _mm512_storeu_ps(got.as_mut_ptr(), y);
            }
            for (&x, &y) in chunk.iter().zip(&got) {
                let want = sf(x);
                assert!(
                    y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                    "{name}({x:e} = {:#010x}): vector {y:e}, scalar {want:e}",
                    x.to_bits()
                );
            }
        }
    }

    /// The f32 whose bits are multiples of 2^10 (8192 values in every binade of both
    /// signs, NaNs and infinities included), random bits, random values in [-12, 12],
    /// the special values, and every f32 within 4096 ulp of each of `edges`.
    fn sweep(edges: &[f32]) -> Vec<f32> {
        let mut xs: Vec<f32> = (0..1u32 << 22).map(|i| f32::from_bits(i << 10)).collect();
        let mut rng = Rng::new(5);
        xs.extend((0..1 << 20).map(|i| {
            let bits = rng.next_u64() as u32;
            if i % 2 == 0 {
                f32::from_bits(bits)
            } else {
                (bits as i32) as f32 * (12.0 / i32::MAX as f32)
            }
        }));
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001), // signalling NaN
            f32::from_bits(0xffc0_1234),
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::from_bits(1), // smallest subnormal
            f32::from_bits(0x8000_0001),
            f32::from_bits(0x007f_ffff), // largest subnormal
            f32::from_bits(0x807f_ffff),
            f32::MAX,
            f32::MIN,
            1e30,
            -1e30,
        ]);
        for &e in edges {
            for x in [e, -e] {
                let b = x.to_bits();
                xs.extend((b - 4096..=b + 4096).map(f32::from_bits));
            }
        }
        xs
    }

    #[test]
    fn gelu_v512_is_the_scalar_function() {
        let x = GELU_XMAX;
        let mut xs = sweep(&[x, 1.0, 0.5]);
        // Every f32 in [-14.3, -12.9]: the clamp and the subnormal results.
        let (lo, hi) = ((-12.9f32).to_bits(), (-14.3f32).to_bits());
        xs.extend((lo..=hi).map(f32::from_bits));
        // [-2^-10, 2^-10] on a grid of 2^-30 (t near 1, P near 0).
        xs.extend((-(1 << 20)..=1 << 20).map(|i| i as f32 * (1.0 / (1u64 << 30) as f32)));
        check("gelu", gelu_v512::<1>, gelu, &xs);
        assert_eq!(gelu(-x).to_bits(), (-0.0f32).to_bits());
        assert_eq!(gelu(f32::NEG_INFINITY).to_bits(), (-0.0f32).to_bits());
        assert_eq!(gelu(f32::MAX), f32::MAX);
    }

    #[test]
    fn exp_v512_is_the_scalar_function() {
        // The clamps and the selects.
        let xs = sweep(&[EXP_MIN, EXP_MAX, EXP_INF_ABOVE]);
        check("exp", exp_v512::<1>, exp, &xs);
    }

    /// The slice forms: every length up to a few vectors past a whole step, at every
    /// offset in a vector, in place and into another slice, give the scalar bits and
    /// touch nothing past the end.
    #[test]
    fn gelu_slices_are_the_scalar_function() {
        let mut rng = Rng::new(8);
        let src: Vec<f32> = (0..200).map(|_| rng.f32() * 8.0).collect();
        for start in 0..16 {
            for n in 0..=150 {
                let xs = &src[start..start + n];
                let mut a = xs.to_vec();
                a.push(7.0);
                let mut b = vec![7.0f32; n + 1];
                let done = gelu_in_place(&mut a[..n]);
                assert_eq!(done, gelu_map_into(xs, &mut b[..n]));
                if !done {
                    return; // no AVX-512, or STREAMFUSE_PORTABLE
                }
                for (i, &x) in xs.iter().enumerate() {
                    assert_eq!(a[i].to_bits(), gelu(x).to_bits(), "in place, {start} {n}");
                    assert_eq!(b[i].to_bits(), gelu(x).to_bits(), "into, {start} {n}");
                }
                assert_eq!((a[n], b[n]), (7.0, 7.0), "past the end, {start} {n}");
            }
        }
    }
}
