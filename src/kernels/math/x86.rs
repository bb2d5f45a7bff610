//! The hand-written x86-64 forms of [`gelu`](super::gelu) over slices: the widest the
//! tier in use runs (module `avx512`, else module `avx2`), for `math::in_place` and
//! `math::map_into`, with the scalar function's bits; none on the portable tier (so
//! `STREAMFUSE_PORTABLE=1` turns them off). Also the tests' shared sweep of f32 that
//! both modules' register forms are held to.

use super::{avx2, avx512};
use crate::kernels::cpu::{self, Tier};

/// The tier whose GELU slice loop runs: AVX-512, AVX2, or none.
fn tier() -> Option<Tier> {
    if cpu::has_avx512() {
        Some(Tier::Avx512)
    } else if cpu::has_avx2() {
        Some(Tier::Avx2)
    } else {
        None
    }
}

/// `dst[i] = gelu(src[i])` for `i < n` with `tier`'s loop.
///
/// # Safety
///
/// The CPU runs `tier` (AVX-512 or AVX2); `src` is valid for reading and `dst` for
/// writing `n` f32; they are the same pointer or do not overlap.
unsafe fn gelu_with(tier: Tier, src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: the caller's contract is each loop's.
    unsafe {
        match tier {
            Tier::Avx512 => avx512::gelu_n(src, dst, n),
            Tier::Avx2 => avx2::gelu_n(src, dst, n),
            _ => unreachable!("GELU has slice loops on AVX-512 and AVX2 only"),
        }
    }
}

/// `xs[i] = gelu(xs[i])` and true, if the tier runs AVX-512 or AVX2; false (and
/// nothing done) otherwise.
pub(crate) fn gelu_in_place(xs: &mut [f32]) -> bool {
    let Some(tier) = tier() else {
        return false;
    };
    let p = xs.as_mut_ptr();
    // SAFETY: the tier includes `tier`, so the CPU runs it; `p` is valid for reading
    // and writing `xs.len()` f32, and the loops allow `src == dst`.
    unsafe { gelu_with(tier, p, p, xs.len()) };
    true
}

/// `dst[i] = gelu(src[i])` for the elements both have and true, if the tier runs
/// AVX-512 or AVX2; false (and nothing done) otherwise.
pub(crate) fn gelu_map_into(src: &[f32], dst: &mut [f32]) -> bool {
    let Some(tier) = tier() else {
        return false;
    };
    let n = src.len().min(dst.len());
    // SAFETY: the CPU runs `tier`; `src` and `dst` are valid for `n` f32 and distinct
    // borrows, so they do not overlap.
    unsafe { gelu_with(tier, src.as_ptr(), dst.as_mut_ptr(), n) };
    true
}

/// What the tests of the vector forms share: the sweep of f32 and the bitwise check.
#[cfg(test)]
pub(super) mod testing {
    use crate::kernels::cpu::{self, Tier};
    use crate::kernels::math::GELU_XMAX;
    use crate::kernels::testutil::Rng;

    /// `vf` (a vector form on one vector of `L` lanes, of `tier`) over `xs`, when the
    /// CPU runs `tier` whatever tier is forced (this tests the vector function
    /// itself), against the scalar `sf`, bit for bit (any NaN matching any NaN).
    pub(in crate::kernels::math) fn check<V: Copy, const L: usize>(
        tier: Tier,
        name: &str,
        vf: unsafe fn([V; 1]) -> [V; 1],
        sf: fn(f32) -> f32,
        xs: &[f32],
    ) {
        assert_eq!(std::mem::size_of::<V>(), 4 * L, "a vector of {L} f32");
        if !cpu::cpu_runs(tier) {
            return;
        }
        for chunk in xs.chunks(L) {
            let mut lanes = [0f32; L];
            lanes[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: `V` is a vector of `L` f32 (asserted), plain data like
            // `[f32; L]`; the CPU runs `tier`, whose instructions `vf` needs.
            let got: [f32; L] = unsafe {
                let [y] = vf([std::mem::transmute_copy(&lanes)]);
                std::mem::transmute_copy(&y)
            };
            for (&x, &y) in chunk.iter().zip(&got) {
                let want = sf(x);
                assert!(
                    y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                    "{name} on {tier}({x:e} = {:#010x}): vector {y:e}, scalar {want:e}",
                    x.to_bits()
                );
            }
        }
    }

    /// The f32 whose bits are multiples of 2^10 (8192 values in every binade of both
    /// signs, NaNs and infinities included), random bits, random values in [-12, 12],
    /// the special values, and every f32 within 4096 ulp of each of `edges`.
    pub(in crate::kernels::math) fn sweep(edges: &[f32]) -> Vec<f32> {
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

    /// [`sweep`] for GELU: around its clamp, 1 and 0.5, every f32 in [-14.3, -12.9]
    /// (the clamp and the subnormal results), and [-2^-10, 2^-10] on a grid of 2^-30
    /// (`t` near 1, `P` near 0).
    pub(in crate::kernels::math) fn gelu_sweep() -> Vec<f32> {
        let mut xs = sweep(&[GELU_XMAX, 1.0, 0.5]);
        let (lo, hi) = ((-12.9f32).to_bits(), (-14.3f32).to_bits());
        xs.extend((lo..=hi).map(f32::from_bits));
        xs.extend((-(1 << 20)..=1 << 20).map(|i| i as f32 * (1.0 / (1u64 << 30) as f32)));
        xs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::math::gelu;
    use crate::kernels::testutil::Rng;

    /// The slice loops of every tier this CPU runs (whatever tier is forced), and the
    /// dispatch: every length up to a few vectors past a whole step, at every offset
    /// in a vector, in place and into another slice, give the scalar bits and touch
    /// nothing past the end.
    #[test]
    fn gelu_slices_are_the_scalar_function() {
        let mut rng = Rng::new(8);
        let src: Vec<f32> = (0..200).map(|_| rng.f32() * 8.0).collect();
        let tiers = [Tier::Avx512, Tier::Avx2].into_iter();
        let direct = tiers.filter(|&t| cpu::cpu_runs(t)).map(Some);
        for with in direct.chain([None]) {
            for start in 0..16 {
                for n in 0..=150 {
                    let xs = &src[start..start + n];
                    let mut a = xs.to_vec();
                    a.push(7.0);
                    let mut b = vec![7.0f32; n + 1];
                    match with {
                        // SAFETY: the CPU runs `t`; `a` and `b` hold `n` f32 (and one
                        // more), `a` in place, `xs` and `b` distinct.
                        Some(t) => unsafe {
                            gelu_with(t, a.as_ptr(), a.as_mut_ptr(), n);
                            gelu_with(t, xs.as_ptr(), b.as_mut_ptr(), n);
                        },
                        None => {
                            let done = gelu_in_place(&mut a[..n]);
                            assert_eq!(done, gelu_map_into(xs, &mut b[..n]));
                            assert_eq!(done, tier().is_some());
                            if !done {
                                return; // the portable tier
                            }
                        }
                    }
                    for (i, &x) in xs.iter().enumerate() {
                        let w = gelu(x).to_bits();
                        assert_eq!(a[i].to_bits(), w, "in place, {with:?} {start} {n}");
                        assert_eq!(b[i].to_bits(), w, "into, {with:?} {start} {n}");
                    }
                    assert_eq!((a[n], b[n]), (7.0, 7.0), "past the end, {start} {n}");
                }
            }
        }
    }
}
