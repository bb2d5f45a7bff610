//! Scalar math for the unary kernels: the activation functions, and an accurate `erf`.
//!
//! Rust's standard library has no stable `erf`, and the short textbook approximations
//! (Abramowitz–Stegun 7.1.26, error ~1e-7 absolute but much worse relative to small
//! results) are not good enough for the erf form of GELU, whose negative tail is a
//! product of `x` and a tiny `erfc`. So [`erfc`] evaluates, in f64, two Chebyshev
//! expansions fitted to the exact function (interpolation at Chebyshev nodes of
//! `math.erf`/`math.erfc` reference values):
//!
//! * for `|z| < 2`: `erf(z) / z` as a series in `t = z²` over `[0, 4]` (12 terms,
//!   relative error < 6e-11);
//! * for `2 <= z < 10`: `erfc(z) · e^(z²) · z` as a series in `u = 1/z` over
//!   `[0.1, 0.5]` (11 terms, relative error < 3e-11);
//! * for `z >= 10`, `erfc(z) < 3e-45`, below the smallest f32, so 0.
//!
//! Rounded to f32 the results are correctly rounded or off by one ulp.
//!
//! The GELU kernel evaluates the same expansions without branches (both computed, one
//! selected) in a loop compiled for the CPU's best SIMD level ([`gelu_in_place`]):
//! the scalar, branchy form was a third of all-MiniLM-L6-v2's run time.

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
#[cfg_attr(not(test), allow(dead_code))] // scalar reference (tests); gelu uses the branch-free form
fn chebyshev(c: &[f64], a: f64, b: f64, x: f64) -> f64 {
    let t = (2.0 * x - a - b) / (b - a);
    let (mut b1, mut b2) = (0.0, 0.0);
    for &cj in c[1..].iter().rev() {
        (b1, b2) = (2.0 * t * b1 - b2 + cj, b1);
    }
    t * b1 - b2 + c[0]
}

/// The error function, to about 1e-10 relative.
#[cfg_attr(not(test), allow(dead_code))] // scalar reference (tests); gelu uses the branch-free form
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
#[cfg_attr(not(test), allow(dead_code))] // scalar reference (tests); gelu uses the branch-free form
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
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer (no SSE4.1 needed).
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.33, 88.72);
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
    if x > 88.722_83 {
        f32::INFINITY
    } else if x < -87.33 {
        0.0
    } else {
        y
    }
}

/// `tanh x`.
#[inline]
pub(crate) fn tanh(x: f32) -> f32 {
    x.tanh()
}

/// `1 / (1 + e^-x)`; saturates cleanly to 0 and 1.
#[inline]
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
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// GELU, erf form: `x/2 · (1 + erf(x/√2))`, written as `x/2 · erfc(-x/√2)` so the
/// negative tail keeps its relative accuracy.
///
/// The same f64 Chebyshev expansions as [`erfc`], evaluated without branches or calls
/// (both expansions are computed and the right one selected; `e^(-z²)` by
/// [`exp_neg_f64`]), so that a loop over it vectorises: [`gelu_in_place`] compiles
/// that loop for the best SIMD level of the CPU (AVX-512 or AVX2 where present), where
/// the branchy scalar form was ~10 ns per element.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    let xd = x as f64;
    let z = -xd * std::f64::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    // |z| < 2: erfc(z) = 1 - z · (erf(z)/z), the series in t = z² over [0, 4].
    let small = 1.0 - z * chebyshev_inline(&ERF_SMALL, 0.0, 4.0, (z * z).min(4.0));
    // 2 <= |z| < 10: erfc(|z|) = series(1/|z|) · e^(-z²) / |z|; 0 beyond 10.
    let al = a.clamp(2.0, 10.0);
    let inv = 1.0 / al;
    let big = chebyshev_inline(&ERFC_LARGE, 0.1, 0.5, inv) * exp_neg_f64(-al * al) * inv;
    let big = if a >= 10.0 { 0.0 } else { big };
    let tail = if z > 0.0 { big } else { 2.0 - big };
    let e = if a < 2.0 { small } else { tail };
    (0.5 * xd * e) as f32
}

/// Replaces every `x` of `xs` by `gelu(x)`, with the loop compiled for the best SIMD
/// level this CPU has (runtime dispatch through `pulp`).
pub(crate) fn gelu_in_place(xs: &mut [f32]) {
    /// The loop as a `pulp` op: `with_simd` is inlined into a function compiled with
    /// the detected target features, so the body below vectorises for them.
    struct GeluOp<'a>(&'a mut [f32]);
    impl pulp::WithSimd for GeluOp<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _simd: S) {
            for x in self.0.iter_mut() {
                *x = gelu(*x);
            }
        }
    }
    pulp::Arch::new().dispatch(GeluOp(xs));
}

/// [`chebyshev`], always inlined (so that it vectorises inside a dispatched loop).
#[inline(always)]
fn chebyshev_inline<const N: usize>(c: &[f64; N], a: f64, b: f64, x: f64) -> f64 {
    // A product by the reciprocal (a constant) rather than a division: vector division
    // is slow, and the difference is an ulp of t.
    let t = (2.0 * x - a - b) * (1.0 / (b - a));
    let t2 = 2.0 * t;
    let (mut b1, mut b2) = (0.0, 0.0);
    let mut j = N - 1;
    while j >= 1 {
        (b1, b2) = (t2 * b1 - b2 + c[j], b1);
        j -= 1;
    }
    t * b1 - b2 + c[0]
}

/// `e^x` in f64 for `x` in `[-100, 0]`, without branches or calls: `x = k ln 2 + r`
/// (Cody–Waite, `|r| <= ln 2 / 2`), `e^r` by its degree-13 Taylor polynomial (truncation
/// `< 1e-16` relative), `2^k` built in the exponent bits.
#[inline(always)]
pub(crate) fn exp_neg_f64(x: f64) -> f64 {
    const LN2_HI: f64 = 0.693_147_180_369_123_8;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    // Adding and subtracting 1.5 * 2^52 rounds to the nearest integer.
    const ROUND: f64 = 6_755_399_441_055_744.0;
    let x = x.clamp(-100.0, 0.0);
    let t = x * std::f64::consts::LOG2_E + ROUND;
    let k = t - ROUND;
    let ki = (t.to_bits() as i64).wrapping_sub(ROUND.to_bits() as i64);
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // 1/n! for n = 0..=13.
    const C: [f64; 14] = [
        1.0,
        1.0,
        0.5,
        0.16666666666666666,
        0.041666666666666664,
        0.008333333333333333,
        0.001388888888888889,
        0.0001984126984126984,
        2.48015873015873e-05,
        2.7557319223985893e-06,
        2.755731922398589e-07,
        2.505210838544172e-08,
        2.08767569878681e-09,
        1.6059043836821613e-10,
    ];
    let mut p = C[13];
    let mut j = 12;
    loop {
        p = p * r + C[j];
        if j == 0 {
            break;
        }
        j -= 1;
    }
    p * f64::from_bits(((ki + 1023) as u64) << 52)
}

/// GELU, tanh approximation: `x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
#[inline]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
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
    fn exp_neg_f64_is_accurate() {
        let mut x = -100.0f64;
        while x <= 0.0 {
            let (got, want) = (exp_neg_f64(x), x.exp());
            assert!(
                (got - want).abs() <= 4e-16 * want,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert_eq!(exp_neg_f64(0.0), 1.0);
    }

    #[test]
    fn gelu_in_place_is_gelu() {
        let xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 700.0) * 0.021).collect();
        let mut ys = xs.clone();
        gelu_in_place(&mut ys);
        for (x, y) in xs.iter().zip(&ys) {
            assert_eq!(y.to_bits(), gelu(*x).to_bits(), "gelu({x})");
        }
    }

    #[test]
    fn gelu_matches_erfc() {
        let mut x = -14.0f32;
        while x < 6.0 {
            let want = 0.5 * x as f64 * erfc(-(x as f64) * std::f64::consts::FRAC_1_SQRT_2);
            let got = gelu(x) as f64;
            assert!(
                (got - want).abs() <= 1.2e-7 * want.abs() + 1e-45,
                "gelu({x}) = {got}, want {want}"
            );
            x += 0.00731;
        }
    }

    #[test]
    fn activations() {
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-7);
        assert!((gelu(-3.0) - -0.004_049_694).abs() < 1e-9);
        // Deep in the tail: -x/2 · erfc(x/√2) with x = 8 is -4 · erfc(5.657) ≈ -4.9768e-15.
        let t = gelu(-8.0);
        assert!(
            ((t - -4.976_768_5e-15) / 4.976_768_5e-15).abs() < 1e-6,
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
