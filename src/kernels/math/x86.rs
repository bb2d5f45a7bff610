//! The AVX-512 form of [`gelu`](super::gelu): the scalar function's operations in the
//! same order, each an IEEE operation or a fused multiply-add in both, so every lane
//! gets the scalar function's bits (`gelu_v512_is_the_scalar_function` checks it over
//! a dense sweep of f32 and the special values).
//!
//! [`gelu_v512`] works on registers, for the fused kernel's accumulator;
//! [`gelu_in_place`] and [`gelu_map_into`] run it over slices for `math::in_place` and
//! `math::map_into`, when `cpu::has_avx512` says so (so `STREAMFUSE_PORTABLE=1` turns
//! them off).

use std::arch::x86_64::*;

use super::{GELU_EXP, GELU_HALF_SQRT_HALF, GELU_P, GELU_XMAX, LN2_HI, LN2_LO, LOG2E, ROUND};
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
    let sign = _mm512_set1_epi32(i32::MIN);
    each!(N, i => {
        let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x[i], _mm512_setzero_ps());
        let pos = _mm512_mul_ps(x[i], _mm512_sub_ps(one, w[i]));
        let minus_xa = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(xa[i]), sign));
        _mm512_mask_mul_ps(pos, neg, minus_xa, w[i])
    })
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
    use crate::kernels::math::gelu;
    use crate::kernels::testutil::Rng;

    /// `gelu_n` over `xs` (when the CPU has AVX-512F, whatever `STREAMFUSE_PORTABLE`
    /// says: this tests the vector function itself) against the scalar function, bit
    /// for bit (any NaN matching any NaN).
    fn check(xs: &[f32]) {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut got = vec![0f32; xs.len()];
        // SAFETY: the CPU has AVX-512F; `xs` and `got` hold `xs.len()` f32 each.
        unsafe { gelu_n(xs.as_ptr(), got.as_mut_ptr(), xs.len()) };
        for (&x, &y) in xs.iter().zip(&got) {
            let want = gelu(x);
            assert!(
                y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                "gelu({x:e} = {:#010x}): vector {y:e}, scalar {want:e}",
                x.to_bits()
            );
        }
    }

    #[test]
    fn gelu_v512_is_the_scalar_function() {
        // Every f32 whose bits are a multiple of 2^10: 8192 values in every binade of
        // both signs, NaNs and infinities included.
        let grid: Vec<f32> = (0..1u32 << 22).map(|i| f32::from_bits(i << 10)).collect();
        check(&grid);
        // Random bits, and random values where activations live.
        let mut rng = Rng::new(5);
        let random: Vec<f32> = (0..1 << 20)
            .map(|i| {
                let bits = rng.next_u64() as u32;
                if i % 2 == 0 {
                    f32::from_bits(bits)
                } else {
                    (bits as i32) as f32 * (12.0 / i32::MAX as f32)
                }
            })
            .collect();
        check(&random);
        // Every f32 in [-14.3, -12.9]: the clamp at -14.2 and the subnormal results.
        let (lo, hi) = ((-12.9f32).to_bits(), (-14.3f32).to_bits());
        let tail: Vec<f32> = (lo..=hi).map(f32::from_bits).collect();
        check(&tail);
        // Every f32 in [-2^-10, 2^-10] a multiple of 2^-30 (t near 1, P near 0).
        let near0: Vec<f32> = (-(1 << 20)..=1 << 20)
            .map(|i| i as f32 * (1.0 / (1u64 << 30) as f32))
            .collect();
        check(&near0);
        let x = GELU_XMAX;
        let specials = [
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
            x,
            -x,
            x.next_up(),
            x.next_down(),
            -x.next_up(),
            -x.next_down(),
            1e30,
            -1e30,
        ];
        check(&specials);
        assert_eq!(gelu(-x).to_bits(), (-0.0f32).to_bits());
        assert_eq!(gelu(f32::NEG_INFINITY).to_bits(), (-0.0f32).to_bits());
        assert_eq!(gelu(f32::MAX), f32::MAX);
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
