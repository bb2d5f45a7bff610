//! Math for the unary kernels: the activation functions in f32, branch-free so that
//! their loops vectorise, and an accurate f64 `erf` that tests use as the reference.
//!
//! The f32 functions ([`exp`], [`tanh`], [`sigmoid`], [`silu`], [`gelu`], [`gelu_tanh`])
//! are written without calls or data-dependent branches (selects only), so a loop over
//! one compiles to vector code. [`in_place`] and [`map_into`] run such a loop compiled
//! for the CPU's best SIMD level (runtime dispatch), which is how the element-wise
//! kernel, the fused programs and the matmul epilogues apply them; each function states
//! its error bound and a test holds it there. [`gelu`] and [`exp`] also have
//! hand-written AVX-512 and AVX2 forms (`avx512`, `avx2`) with the same bits: the
//! fused programs and the f32 tile's epilogue apply those to their registers, and
//! [`in_place`] and [`map_into`] use [`gelu`]'s (`x86` picks the tier's).
//!
//! Rust's standard library has no stable `erf`, so the reference [`erfc`] evaluates, in
//! f64, two Chebyshev expansions fitted to the exact function (interpolation at
//! Chebyshev nodes of `math.erf`/`math.erfc` reference values):
//!
//! * for `|z| < 2`: `erf(z) / z` as a series in `t = z²` over `[0, 4]` (12 terms,
//!   relative error < 6e-11);
//! * for `2 <= z < 10`: `erfc(z) · e^(z²) · z` as a series in `u = 1/z` over
//!   `[0.1, 0.5]` (11 terms, relative error < 3e-11);
//! * for `z >= 10`, `erfc(z) < 3e-45`, below the smallest f32, so 0.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::{exp_v256, gelu_v256};
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::{exp_v512, gelu_v512};
#[cfg(target_arch = "x86_64")]
use x86::{gelu_in_place, gelu_map_into};

/// No hand-written form off x86-64: the portable loop runs.
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
pub(crate) use neon::gelu_neon;

#[cfg(not(target_arch = "x86_64"))]
fn gelu_in_place(_: &mut [f32]) -> bool {
    false
}

/// No hand-written form off x86-64: the portable loop runs.
#[cfg(not(target_arch = "x86_64"))]
fn gelu_map_into(_: &[f32], _: &mut [f32]) -> bool {
    false
}

/// `erf(z)/z` on `t = z²` in `[0, 4]`, Chebyshev coefficients.
const ERF_SMALL: [f64; 12] = [
    0.7415552820424018,
    -0.3010710733865947,
    0.06899483068983144,
    -0.013916271264722021,
    0.0024207995224331813,
    -0.0003658639685849378,
    4.862098443229416e-05,
    -5.749256558199948e-06,
    6.113243571174524e-07,
    -5.899100560813331e-08,
    5.206862422705664e-09,
    -4.210616438848902e-10,
];

/// `erfc(z) e^(z²) z` on `u = 1/z` in `[0.1, 0.5]`, Chebyshev coefficients.
const ERFC_LARGE: [f64; 11] = [
    0.5388792694224778,
    -0.025705101602143617,
    -0.0027669248619037745,
    0.00039932861894330753,
    -1.2342064485435714e-05,
    -3.4786940347803448e-06,
    6.435214988261122e-07,
    -3.7476606666460424e-08,
    -5.798734573322664e-09,
    1.750049549720245e-09,
    -1.999984874681812e-10,
];

/// Evaluates a Chebyshev series at `x` in `[a, b]` (Clenshaw's recurrence).
#[inline]
#[cfg_attr(not(test), allow(dead_code))] // f64 reference for the tests
fn chebyshev(c: &[f64], a: f64, b: f64, x: f64) -> f64 {
    let t = (2.0 * x - a - b) / (b - a);
    let (mut b1, mut b2) = (0.0, 0.0);
    for &cj in c[1..].iter().rev() {
        (b1, b2) = (2.0 * t * b1 - b2 + cj, b1);
    }
    t * b1 - b2 + c[0]
}

/// The error function, to about 1e-10 relative.
#[cfg_attr(not(test), allow(dead_code))] // f64 reference for the tests
pub(crate) fn erf(z: f64) -> f64 {
    let a = z.abs();
    if a < 2.0 {
        z * chebyshev(&ERF_SMALL, 0.0, 4.0, z * z)
    } else {
        (1.0 - erfc(a)).copysign(z)
    }
}

/// The complementary error function `1 - erf(z)`, to about 1e-10 relative (also in the
/// tail, where `1 - erf(z)` would cancel).
#[cfg_attr(not(test), allow(dead_code))] // f64 reference for the tests
pub(crate) fn erfc(z: f64) -> f64 {
    if z.is_nan() {
        z
    } else if z < 2.0 {
        1.0 - erf(z)
    } else if z < 10.0 {
        chebyshev(&ERFC_LARGE, 0.1, 0.5, 1.0 / z) * (-z * z).exp() / z
    } else {
        0.0
    }
}

/// The range [`exp`] clamps its argument to; below `EXP_MIN` it gives 0.
pub(crate) const EXP_MIN: f32 = -87.33;
/// See [`EXP_MIN`].
pub(crate) const EXP_MAX: f32 = 88.72;
/// Above this [`exp`] gives infinity.
pub(crate) const EXP_INF_ABOVE: f32 = 88.722_83;

/// `e^x`, written without calls or branches so that loops over it vectorise (libm's
/// `expf` is a function call per element).
///
/// The usual reduction: `x = k ln 2 + r` with `k = round(x / ln 2)` and `|r| <= ln 2 / 2`
/// (`ln 2` split in two parts, Cody–Waite, so `r` is exact enough), `e^r` by its degree-7
/// Taylor polynomial (truncation error `< 6e-9`, below half an f32 ulp), and `2^k` built
/// in the exponent bits (two factors, so the extreme `k` need no special case). Within 2 ulp of the exact value for normal results. Results
/// below the smallest normal f32 (`x < -87.33`) are flushed to 0; `x > 88.72` gives
/// infinity; NaN stays NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    // Adding and subtracting ROUND rounds to the nearest integer (no SSE4.1 needed).
    let xc = x.clamp(EXP_MIN, EXP_MAX);
    let t = xc * LOG2E + ROUND;
    let k = t - ROUND;
    // k as an integer straight from the bits of t (whose low mantissa bits hold
    // 2^22 + k), avoiding a float-to-int conversion that would not vectorise on SSE2.
    let ki = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = (xc - k * LN2_HI) - k * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2^k as two factors, so that k = 128 (and -126) need no special case.
    let half = ki >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((ki - half + 127) as u32) << 23);
    let y = p * s1 * s2;
    if x > EXP_INF_ABOVE {
        f32::INFINITY
    } else if x < EXP_MIN {
        0.0
    } else {
        y
    }
}

/// `tanh x`, branch-free so that loops over it vectorise (libm's `tanhf` is a call per
/// element).
///
/// For `|x| < 0.625`, `x + x³ Q(x²)` with `Q` a degree-4 polynomial fitted to minimise
/// the relative error (under 5e-9 before rounding); beyond, `1 - 2 / (e^(2|x|) + 1)`
/// with the sign put back. Within 3 ulp of the exact value (`tanh_is_accurate`);
/// saturates to ±1, keeps NaN.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    const Q: [f32; 5] = [
        -0.333_332_8,
        0.133_314_44,
        -0.053_739_846,
        0.020_639_392,
        -0.005_705_229,
    ];
    let a = x.abs();
    let s = x * x;
    let q = Q[0] + s * (Q[1] + s * (Q[2] + s * (Q[3] + s * Q[4])));
    let small = x + x * s * q;
    let big = (1.0 - 2.0 / (exp(2.0 * a) + 1.0)).copysign(x);
    if a < 0.625 {
        small
    } else {
        big
    }
}

/// `1 / (1 + e^-x)`; saturates cleanly to 0 and 1.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `max(x, 0)`, keeping NaN.
#[inline]
pub(crate) fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// `x · sigmoid(x)`.
#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// The coefficients of `P` in [`gelu`], constant term first.
pub(crate) const GELU_P: [f32; 10] = [
    -1.265_441_4,
    0.998_492_55,
    0.387_899_42,
    0.028_358_64,
    0.020_191_374,
    -0.116_778_7,
    -0.651_259_2,
    1.122_409_1,
    -0.666_066_5,
    0.142_194_88,
];

/// `|x|` from which [`gelu`] computes as at `|x| = GELU_XMAX` (where its negative side
/// is exactly `-0`).
pub(crate) const GELU_XMAX: f32 = 14.2;

/// `1 / (2√2)`: `t = 1 / (1 + |x| · GELU_HALF_SQRT_HALF)` in [`gelu`].
pub(crate) const GELU_HALF_SQRT_HALF: f32 = 0.353_553_38;

/// `e^r / 2` for `|r| <= ln 2 / 2` in [`gelu`], constant term first: `1 + r + r² G(r)`
/// with `G` of degree 4 fitted (Chebyshev, `mpmath.chebyfit`) to `(e^r - 1 - r) / r²`,
/// relative error under 8e-9, every coefficient halved (exactly).
pub(crate) const GELU_EXP: [f32; 7] = [
    0.5,
    0.5,
    0.25,
    0.083_332_88,
    0.020_833_278,
    0.004_181_597_4,
    0.000_696_310_2,
];

/// `log2(e)` and `ln 2` in two parts (`LN2_HI` has 15 significant bits, so `k · LN2_HI`
/// is exact for `|k| < 512`), and `1.5 · 2^23`, whose addition rounds an f32 of
/// magnitude below `2^22` to an integer: the reduction of [`exp`] and [`gelu`].
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// See [`LOG2E`].
pub(crate) const LN2_HI: f32 = 0.693_145_75;
/// See [`LOG2E`].
pub(crate) const LN2_LO: f32 = 1.428_606_8e-6;
/// See [`LOG2E`].
pub(crate) const ROUND: f32 = 12_582_912.0;

/// `c[0] + x·(c[1] + x·(… + x·c[n-1]))` by Horner's rule, one FMA a step, highest
/// coefficient first (the order the vector forms follow, so the bits agree).
#[inline(always)]
fn horner<const N: usize>(c: &[f32; N], x: f32) -> f32 {
    let (last, rest) = c.split_last().expect("a polynomial has a coefficient");
    rest.iter().rev().fold(*last, |q, &cj| q.mul_add(x, cj))
}

/// GELU, erf form: `x/2 · (1 + erf(x/√2))`, in f32 and branch-free, so that a loop over
/// it vectorises; `avx512::gelu_v512` and `avx2::gelu_v256` compute the same bits, and the order
/// of the operations below (each `mul_add` one fused multiply-add) is the contract
/// between the two.
///
/// Written as `x/2 · erfc(-x/√2)`: with `a = |x|/√2`, `erfc(a) = t · e^(P(t) - a²)` where
/// `t = 1 / (1 + a/2)` and `P` is a degree-9 polynomial in `t` (the form of Numerical
/// Recipes' `erfcc`, with our own coefficients [`GELU_P`]: a weighted least-squares fit
/// on `a` in `[0, 10]`, error of `P` under 5e-8, so `erfc` to about 1e-7 relative);
/// then, with `w = erfc(a)/2`, `gelu(x) = x · w` for negative `x` (the tail keeps its
/// relative accuracy) and `x · (1 - w)` for positive `x`.
///
/// The exponential is inlined and fused with its argument, so that the tail's relative
/// error does not grow with `a²`: `a² = h + h_lo` exactly (`h = (|x|/2)·|x|` and an FMA
/// for its rounding error), `k = round((P - h) / ln 2)`, and the reduced argument
/// `r = P - h - h_lo - k ln 2` is formed as `(P - (h + k LN2_HI)) - h_lo - k LN2_LO`,
/// where `h + k LN2_HI` is exact once `h >= 1` (both terms are multiples of `ulp(h)`
/// or of 2^-16, and the sum is below 2 in magnitude) and within 2^-24 below. Then
/// `e^r / 2` by the polynomial [`GELU_EXP`] (FMAs), times `2^k` (two factors, the first
/// product exact, so the result is correctly rounded also where it is subnormal), times
/// `t`. Every step is one IEEE operation or one FMA, so the vector form reproduces it
/// exactly.
///
/// The contract (`gelu_contract`): against the exact function, relative error at most
/// 5e-7 (4.5e-7 measured, near `x = 0`) for every `x >= -10`, and absolute error at
/// most 1.2e-7 · max(1, |x|) everywhere. PyTorch's CPU kernel (an Abramowitz–Stegun
/// style `erf`, about 1e-7 absolute in `erf`) is in the same absolute class and has no
/// relative bound in the tail. `|x|` is clamped to [`GELU_XMAX`] (NaN to it as well:
/// the result is NaN by the last product), where `erfc(a)/2` rounds to 0: from
/// `x = -14.2` down the result is `-0` (subnormal from about `x = -13`);
/// `gelu(inf) = inf`.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    let p = GELU_P;
    let c = GELU_EXP;
    let ax = x.abs();
    // `min` as `vminps` computes it: a NaN gives the second operand.
    let xa = if ax < GELU_XMAX { ax } else { GELU_XMAX };
    let t = 1.0 / xa.mul_add(GELU_HALF_SQRT_HALF, 1.0);
    let q = horner(&p, t);
    // a² = x²/2 = h + h_lo exactly.
    let hx = 0.5 * xa;
    let h = hx * xa;
    let h_lo = hx.mul_add(xa, -h);
    // k = round((P - h) / ln 2), and r = P - h - h_lo - k ln 2.
    let kr = (q - h).mul_add(LOG2E, ROUND);
    let k = kr - ROUND;
    let u = k.mul_add(LN2_HI, h);
    let r = (-k).mul_add(LN2_LO, (q - u) - h_lo);
    // e^r / 2.
    let e = horner(&c, r);
    // Times 2^k, k in [-149, 1], as 2^half · 2^(k - half), both normal.
    let ki = kr.to_bits() as i32 - ROUND.to_bits() as i32;
    let half = ki >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((ki - half + 127) as u32) << 23);
    let w = t * (e * s1 * s2);
    if x < 0.0 {
        -xa * w
    } else {
        x * (1.0 - w)
    }
}

/// One of the branch-free functions of this module, as a type: [`in_place`] and
/// [`map_into`] are generic over it so that the function is inlined into a loop compiled
/// for the CPU's SIMD level. (A closure or `fn` item passed as `impl Fn` is not
/// reliably inlined there once it is as large as [`gelu`]; the loop then calls a
/// scalar copy per element, 30 times slower.)
pub(crate) trait Activation: Copy {
    /// The function.
    fn apply(self, x: f32) -> f32;

    /// Applies the function to every element of `xs` with a hand-written SIMD form of
    /// it (the same bits as [`apply`](Self::apply)) and returns true, if it has one
    /// this CPU runs; returns false, having done nothing, otherwise.
    #[inline]
    fn simd_in_place(self, xs: &mut [f32]) -> bool {
        let _ = xs;
        false
    }

    /// `dst[i] = f(src[i])` for the elements both have, as
    /// [`simd_in_place`](Self::simd_in_place).
    #[inline]
    fn simd_map_into(self, src: &[f32], dst: &mut [f32]) -> bool {
        let _ = (src, dst);
        false
    }
}

macro_rules! activations {
    ($($name:ident => $f:ident),* $(,)?) => {$(
        #[doc = concat!("[`", stringify!($f), "`] as an [`Activation`].")]
        #[derive(Clone, Copy)]
        pub(crate) struct $name;
        impl Activation for $name {
            #[inline(always)]
            fn apply(self, x: f32) -> f32 {
                $f(x)
            }
        }
    )*};
}
activations!(Exp => exp, Tanh => tanh, Sigmoid => sigmoid, Silu => silu, GeluTanh => gelu_tanh);

/// [`gelu`] as an [`Activation`], with its AVX-512 and AVX2 forms for slices.
#[derive(Clone, Copy)]
pub(crate) struct Gelu;
impl Activation for Gelu {
    #[inline(always)]
    fn apply(self, x: f32) -> f32 {
        gelu(x)
    }

    #[inline]
    fn simd_in_place(self, xs: &mut [f32]) -> bool {
        gelu_in_place(xs)
    }

    #[inline]
    fn simd_map_into(self, src: &[f32], dst: &mut [f32]) -> bool {
        gelu_map_into(src, dst)
    }
}

/// Replaces every `x` of `xs` by `f(x)`: with `f`'s hand-written SIMD form if it has
/// one for this CPU ([`Activation::simd_in_place`]), else with the loop compiled for the
/// best SIMD level this CPU has (runtime dispatch through `pulp`): 16 lanes at a time
/// on AVX-512.
#[inline]
pub(crate) fn in_place<A: Activation>(xs: &mut [f32], f: A) {
    if f.simd_in_place(xs) {
        return;
    }
    /// The loop as a `pulp` op: `with_simd` is inlined into a function compiled with
    /// the detected target features, so the body below vectorises for them.
    struct Map<'a, A>(&'a mut [f32], A);
    impl<A: Activation> pulp::WithSimd for Map<'_, A> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _simd: S) {
            for x in self.0.iter_mut() {
                *x = self.1.apply(*x);
            }
        }
    }
    super::cpu::dispatch(Map(xs, f));
}

/// `dst[i] = f(src[i])` for the elements both have, run as [`in_place`] is.
#[inline]
pub(crate) fn map_into<A: Activation>(src: &[f32], dst: &mut [f32], f: A) {
    if f.simd_map_into(src, dst) {
        return;
    }
    /// The loop as a `pulp` op (see [`in_place`]).
    struct MapInto<'a, A>(&'a [f32], &'a mut [f32], A);
    impl<A: Activation> pulp::WithSimd for MapInto<'_, A> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _simd: S) {
            for (d, &x) in self.1.iter_mut().zip(self.0) {
                *d = self.2.apply(x);
            }
        }
    }
    super::cpu::dispatch(MapInto(src, dst, f));
}

/// GELU, tanh approximation: `x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Reference values from a high-precision erf.
        let cases = [
            (0.0, 0.0),
            (1e-5, 1.128_379_167_057_9e-5),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (1.5, 0.966_105_146_475_310_7),
            (1.999, 0.995_301_556_651_370_5),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
        ];
        for (z, want) in cases {
            let got = erf(z);
            assert!(
                ((got - want) / want.max(1e-300)).abs() < 1e-9,
                "erf({z}) = {got}, want {want}"
            );
            assert!((erf(-z) + want).abs() <= 1e-9 * want, "erf is odd");
        }
        let tails = [
            (2.0, 4.677_734_981_047_266e-3),
            (3.0, 2.209_049_699_858_544e-5),
            (5.0, 1.537_459_794_428_034_8e-12),
            (9.0, 4.137_031_746_513_81e-37),
        ];
        for (z, want) in tails {
            let got = erfc(z);
            assert!(
                ((got - want) / want).abs() < 1e-9,
                "erfc({z}) = {got}, want {want}"
            );
        }
        assert_eq!(erfc(12.0), 0.0);
        assert_eq!(erfc(-12.0), 2.0);
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.7 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(1.0), std::f32::consts::E);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(88.7) > 3.3e38 && exp(88.7).is_finite());
    }

    #[test]
    fn in_place_is_the_scalar_function() {
        let xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 700.0) * 0.021).collect();
        let mut ys = xs.clone();
        in_place(&mut ys, Gelu);
        for (x, y) in xs.iter().zip(&ys) {
            assert_eq!(y.to_bits(), gelu(*x).to_bits(), "gelu({x})");
        }
    }

    /// The exact GELU, from the f64 reference `erfc` (about 1e-10 relative).
    fn gelu_exact(x: f32) -> f64 {
        0.5 * x as f64 * erfc(-(x as f64) * std::f64::consts::FRAC_1_SQRT_2)
    }

    /// Worst (absolute error / max(1, |x|), relative error) of `f` against `exact` over
    /// `x` in `[lo, hi)`, stepping by `step`, relative only where `|exact| > 1e-30`.
    fn worst(
        f: impl Fn(f32) -> f32,
        exact: impl Fn(f32) -> f64,
        lo: f32,
        hi: f32,
        step: f32,
    ) -> (f64, f64) {
        let (mut abs, mut rel) = (0.0f64, 0.0f64);
        let mut x = lo;
        while x < hi {
            let (got, want) = (f(x) as f64, exact(x));
            abs = abs.max((got - want).abs() / (x.abs() as f64).max(1.0));
            if want.abs() > 1e-30 {
                rel = rel.max(((got - want) / want).abs());
            }
            x += step;
        }
        (abs, rel)
    }

    #[test]
    fn gelu_contract() {
        // The bounds stated on `gelu`.
        let (abs, rel) = worst(gelu, gelu_exact, -10.0, 10.0, 0.000_37);
        assert!(
            abs <= 1.2e-7 && rel <= 5e-7,
            "-10..10: abs {abs:e}, rel {rel:e}"
        );
        let (abs, _) = worst(gelu, gelu_exact, -20.0, 20.0, 0.001_3);
        assert!(abs <= 1.2e-7, "-20..20: abs {abs:e}");
        // Every f32 step of 2^-16 in [-1, 1]: where most activations are.
        let (abs, rel) = worst(gelu, gelu_exact, -1.0, 1.0, 1.0 / 65536.0);
        assert!(
            abs <= 1.2e-7 && rel <= 5e-7,
            "|x| <= 1: abs {abs:e}, rel {rel:e}"
        );
        assert_eq!(gelu(0.0), 0.0);
        assert_eq!(gelu(-30.0), -0.0);
        assert_eq!(gelu(30.0), 30.0);
        assert_eq!(gelu(f32::INFINITY), f32::INFINITY);
        assert_eq!(gelu(f32::NEG_INFINITY), -0.0);
        assert!(gelu(f32::NAN).is_nan());
        assert!(gelu(1e-30) > 0.0 && gelu(-1e-30) < 0.0);
    }

    #[test]
    fn tanh_is_accurate() {
        let exact = |x: f32| (x as f64).tanh();
        let (_, rel) = worst(tanh, exact, -12.0, 12.0, 0.000_31);
        assert!(rel <= 3.0 * f32::EPSILON as f64, "relative {rel:e}");
        let (_, rel) = worst(tanh, exact, -1e-3, 1e-3, 1.1e-7);
        assert!(rel <= 2.0 * f32::EPSILON as f64, "near 0: relative {rel:e}");
        assert_eq!(tanh(0.0), 0.0);
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-100.0), -1.0);
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert!(tanh(f32::NAN).is_nan());
    }

    #[test]
    fn sigmoid_and_silu_are_accurate() {
        let sig = |x: f32| 1.0 / (1.0 + (-(x as f64)).exp());
        let (_, rel) = worst(sigmoid, sig, -80.0, 80.0, 0.001_7);
        assert!(rel <= 4.0 * f32::EPSILON as f64, "sigmoid relative {rel:e}");
        let (_, rel) = worst(silu, |x| x as f64 * sig(x), -80.0, 80.0, 0.001_7);
        assert!(rel <= 4.0 * f32::EPSILON as f64, "silu relative {rel:e}");
    }

    #[test]
    fn activations() {
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-7);
        assert!((gelu(-3.0) - -0.004_049_694).abs() < 1e-9);
        // Deep in the tail: -x/2 · erfc(x/√2) with x = 8 is -4 · erfc(5.657) ≈ -4.9768e-15.
        let t = gelu(-8.0);
        assert!(
            ((t - -4.976_768_5e-15) / 4.976_768_5e-15).abs() < 4.5e-7,
            "{t}"
        );
        assert_eq!(gelu(f32::INFINITY), f32::INFINITY);
        assert!(gelu(f32::NAN).is_nan());
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(sigmoid(-200.0), 0.0);
        assert_eq!(sigmoid(200.0), 1.0);
        assert_eq!(silu(-200.0), 0.0);
        assert!(relu(f32::NAN).is_nan());
        assert_eq!(relu(-2.0), 0.0);
    }
}
