//! The aarch64 NEON form of [`gelu`](super::gelu): the scalar function's operations in
//! the same order, each one IEEE operation or one fused multiply-add in both, so every
//! lane gets the scalar function's bits (the tests check it over a sweep of f32 and the
//! special values).
//!
//! [`gelu_neon`] works on registers, for the f32 tile's epilogue (`packed::f32`). Slices
//! of GELU, `exp` and the other functions keep the compiler's loops (`math::in_place`):
//! NEON is part of every aarch64 target, and those loops compile to NEON code over the
//! same operations (`fmla`, `fdiv` on four lanes: the same bits by construction), so a
//! hand-written slice loop would add code for no gain; and no fused register program
//! runs on NEON yet to want a register form of `exp`.
//!
//! The selects are written as compares and bit selects, never as `vminq`/`vmaxq`:
//! NEON's minimum returns a NaN operand where the scalar `if` (and x86's `vminps`)
//! returns the other one.

use std::arch::aarch64::*;

use super::{GELU_EXP, GELU_HALF_SQRT_HALF, GELU_P, GELU_XMAX, LN2_HI, LN2_LO, LOG2E, ROUND};

/// `x` in every lane.
#[inline]
#[target_feature(enable = "neon")]
fn splat(x: f32) -> float32x4_t {
    vdupq_n_f32(x)
}

/// [`gelu`](super::gelu) of every lane of one vector.
#[inline]
#[target_feature(enable = "neon")]
fn gelu4(x: float32x4_t) -> float32x4_t {
    let (p, c) = (GELU_P, GELU_EXP);
    let one = splat(1.0);
    // `if ax < XMAX { ax } else { XMAX }`: a NaN compares false and gives XMAX.
    let ax = vabsq_f32(x);
    let xa = vbslq_f32(vcltq_f32(ax, splat(GELU_XMAX)), ax, splat(GELU_XMAX));
    // `vfmaq_f32(a, b, c)` is `b.mul_add(c, a)`.
    let t = vdivq_f32(one, vfmaq_f32(one, xa, splat(GELU_HALF_SQRT_HALF)));
    let mut q = splat(p[9]);
    for &pj in p[..9].iter().rev() {
        q = vfmaq_f32(splat(pj), q, t);
    }
    let hx = vmulq_f32(splat(0.5), xa);
    let h = vmulq_f32(hx, xa);
    let h_lo = vfmaq_f32(vnegq_f32(h), hx, xa);
    let kr = vfmaq_f32(splat(ROUND), vsubq_f32(q, h), splat(LOG2E));
    let k = vsubq_f32(kr, splat(ROUND));
    let u = vfmaq_f32(h, k, splat(LN2_HI));
    // `(-k).mul_add(LN2_LO, d)`: `vfmsq_f32(d, k, c)` is `d - k·c` rounded once, the
    // same value (negation is exact).
    let r = vfmsq_f32(vsubq_f32(vsubq_f32(q, u), h_lo), k, splat(LN2_LO));
    let mut e = splat(c[6]);
    for &cj in c[..6].iter().rev() {
        e = vfmaq_f32(splat(cj), e, r);
    }
    // `e · 2^k` as `e · 2^half · 2^(k - half)`, both factors normal.
    let ki = vsubq_s32(
        vreinterpretq_s32_f32(kr),
        vdupq_n_s32(ROUND.to_bits() as i32),
    );
    let half = vshrq_n_s32::<1>(ki);
    let bias = vdupq_n_s32(127);
    let s1 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(half, bias)));
    let s2 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(vsubq_s32(ki, half), bias)));
    let w = vmulq_f32(t, vmulq_f32(vmulq_f32(e, s1), s2));
    let neg = vmulq_f32(vnegq_f32(xa), w);
    let pos = vmulq_f32(x, vsubq_f32(one, w));
    // `if x < 0.0`: a NaN compares false and takes the positive side (a NaN).
    vbslq_f32(vcltq_f32(x, vdupq_n_f32(0.0)), neg, pos)
}

/// [`gelu`](super::gelu) of every lane of `N` vectors (independent chains the core can
/// overlap).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn gelu_neon<const N: usize>(x: [float32x4_t; N]) -> [float32x4_t; N] {
    let mut y = x;
    for v in &mut y {
        *v = gelu4(*v);
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::math::gelu;
    use crate::kernels::testutil::Rng;

    /// `gelu4` of `x`, lane by lane, against the scalar function, bit for bit (any NaN
    /// matching any NaN).
    fn check(xs: &[f32]) {
        for chunk in xs.chunks(4) {
            let mut lanes = [0f32; 4];
            lanes[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: `lanes` holds 4 f32, read and written as one vector (NEON is part
            // of every aarch64 target).
            unsafe { vst1q_f32(lanes.as_mut_ptr(), gelu4(vld1q_f32(lanes.as_ptr()))) };
            for (&x, &y) in chunk.iter().zip(&lanes) {
                let want = gelu(x);
                assert!(
                    y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                    "gelu({x:e} = {:#010x}): NEON {y:e}, scalar {want:e}",
                    x.to_bits()
                );
            }
        }
    }

    /// The register form over every f32 whose bits are a multiple of 2^11 (both signs,
    /// every binade, NaNs and infinities), random values in [-16, 16], every f32 in
    /// [-14.3, -12.9] (the clamp and the subnormal results), a fine grid around 0, and
    /// the special values.
    #[test]
    fn gelu_neon_is_the_scalar_function() {
        let mut xs: Vec<f32> = (0..1u32 << 21).map(|i| f32::from_bits(i << 11)).collect();
        let mut rng = Rng::new(11);
        xs.extend((0..1 << 18).map(|_| rng.f32() * 16.0));
        let (lo, hi) = ((-12.9f32).to_bits(), (-14.3f32).to_bits());
        xs.extend((lo..=hi).map(f32::from_bits));
        xs.extend((-(1 << 16)..=1 << 16).map(|i| i as f32 * (1.0 / (1u64 << 26) as f32)));
        let specials: [u32; 14] = [
            0x0000_0000, // ±0
            0x7f80_0000, // ±infinity
            0x7fc0_0000, // quiet NaN
            0x7f80_0001, // signalling NaN
            0x7fc0_1234,
            0x0080_0000, // smallest normal
            0x0000_0001, // smallest subnormal
            0x007f_ffff, // largest subnormal
            0x7f7f_ffff, // largest finite
            GELU_XMAX.to_bits(),
            (GELU_XMAX.to_bits()) - 1,
            (GELU_XMAX.to_bits()) + 1,
            1.0f32.to_bits(),
            0.5f32.to_bits(),
        ];
        xs.extend(
            specials
                .iter()
                .flat_map(|&b| [b, b | 0x8000_0000].map(f32::from_bits)),
        );
        check(&xs);
    }
}
