//! Row-wise normalisations over the last dim: [`softmax`], [`layer_norm`] and
//! [`rms_norm`].
//!
//! All three treat the input as `rows × n` (`n` the last dim) and are parallel across
//! rows. A chunk of rows is first copied from the input layout into its place in `dst`
//! (a `memcpy` when the input is contiguous, a strided gather otherwise), and then each
//! row is normalised in place, while it is hot in L1. The statistics are computed in f32
//! with several independent accumulators (layer norm uses two passes: the mean, then the
//! biased variance of the centred values, as PyTorch does). All three run compiled for
//! the tier's widest SIMD level (`pulp` ops through `cpu::dispatch`: `Norm` for layer
//! and RMS norms, `Softmax`, whose bits are the same on every level). The per-row
//! arithmetic is one `RowOp`, which the chains of `kernels::chain` also apply to rows
//! they computed.

use std::borrow::Cow;

use super::math;
use super::par::for_each_chunk;
use super::strided::{copy_runs, run, Walk};
use super::{check_dst, check_input, error, KernelError, Par};
use crate::ir::Layout;

/// Softmax over the last dim: `exp(x - max) / sum(exp(x - max))` per row (subtracting the
/// row max keeps it finite). `dst` has the input's element count.
pub fn softmax(src: &[f32], layout: &Layout, dst: &mut [f32], par: Par) -> Result<(), KernelError> {
    let kernel = "softmax";
    let n = row_len(kernel, src, layout, dst.len())?;
    let op = RowOp::Softmax;
    rows(src, layout, dst, n, &op, par);
    Ok(())
}

/// Layer norm over the last dim: `(x - mean) / sqrt(var + eps) * weight + bias`, with the
/// biased variance. `weight` and `bias` are 1-D of the last dim's size (any stride).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    src: &[f32],
    layout: &Layout,
    weight: &[f32],
    weight_layout: &Layout,
    bias: &[f32],
    bias_layout: &Layout,
    eps: f64,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "layer_norm";
    let n = row_len(kernel, src, layout, dst.len())?;
    let op = RowOp::layer_norm(weight, weight_layout, bias, bias_layout, eps, n)?;
    rows(src, layout, dst, n, &op, par);
    Ok(())
}

/// RMS norm over the last dim: `x / sqrt(mean(x²) + eps) * weight`. `weight` is 1-D of
/// the last dim's size (any stride).
pub(crate) fn rms_norm(
    src: &[f32],
    layout: &Layout,
    weight: &[f32],
    weight_layout: &Layout,
    eps: f64,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "rms_norm";
    let n = row_len(kernel, src, layout, dst.len())?;
    let op = RowOp::rms_norm(weight, weight_layout, eps, n)?;
    rows(src, layout, dst, n, &op, par);
    Ok(())
}

/// One of the row-wise normalisations with its parameters gathered into contiguous
/// vectors, ready to normalise rows in place: shared by the kernels above and by the
/// chains of `kernels::chain`, so a fused norm computes exactly what the plain one does.
#[derive(Clone, Debug)]
pub(crate) enum RowOp<'a> {
    /// Softmax of the row.
    Softmax,
    /// Layer norm with its weight, bias and epsilon (parameters borrowed when they
    /// are contiguous already).
    LayerNorm {
        w: Cow<'a, [f32]>,
        b: Cow<'a, [f32]>,
        eps: f32,
    },
    /// RMS norm with its weight and epsilon.
    RmsNorm { w: Cow<'a, [f32]>, eps: f32 },
}

impl<'a> RowOp<'a> {
    /// A layer norm over rows of `n`; checks the parameters' layouts.
    pub(crate) fn layer_norm(
        weight: &'a [f32],
        weight_layout: &Layout,
        bias: &'a [f32],
        bias_layout: &Layout,
        eps: f64,
        n: usize,
    ) -> Result<RowOp<'a>, KernelError> {
        let kernel = "layer_norm";
        Ok(RowOp::LayerNorm {
            w: vector(kernel, "weight", weight, weight_layout, n)?,
            b: vector(kernel, "bias", bias, bias_layout, n)?,
            eps: eps as f32,
        })
    }

    /// An RMS norm over rows of `n`; checks the weight's layout.
    pub(crate) fn rms_norm(
        weight: &'a [f32],
        weight_layout: &Layout,
        eps: f64,
        n: usize,
    ) -> Result<RowOp<'a>, KernelError> {
        Ok(RowOp::RmsNorm {
            w: vector("rms_norm", "weight", weight, weight_layout, n)?,
            eps: eps as f32,
        })
    }

    /// Work per element, for parallel splitting.
    pub(crate) fn cost(&self) -> usize {
        match self {
            RowOp::Softmax => 6,
            RowOp::LayerNorm { .. } => 8,
            RowOp::RmsNorm { .. } => 5,
        }
    }

    /// Normalises each row of `rows` (whole rows of the `n` the op was made for) in
    /// place; a layer or RMS norm picks its SIMD level once for all of them.
    pub(crate) fn apply_rows(&self, rows: &mut [f32], n: usize) {
        match self {
            RowOp::Softmax => super::cpu::dispatch(Softmax { rows, n }),
            RowOp::LayerNorm { w, b, eps } => super::cpu::dispatch(Norm {
                rows,
                w,
                b: Some(b),
                eps: *eps,
            }),
            RowOp::RmsNorm { w, eps } => super::cpu::dispatch(Norm {
                rows,
                w,
                b: None,
                eps: *eps,
            }),
        }
    }
}

/// Checks the input and `dst` of a row kernel; returns the row length (the last dim).
fn row_len(
    kernel: &str,
    src: &[f32],
    layout: &Layout,
    dst_len: usize,
) -> Result<usize, KernelError> {
    let numel = check_input(kernel, "src", src.len(), layout)?;
    let Some(&n) = layout.dims.last() else {
        return Err(error(kernel, "needs at least one dim, got a scalar"));
    };
    check_dst(kernel, dst_len, numel)?;
    Ok(n)
}

/// A 1-D parameter of length `n` as a contiguous slice (borrowed when it is one already).
fn vector<'a>(
    kernel: &str,
    what: &str,
    buf: &'a [f32],
    layout: &Layout,
    n: usize,
) -> Result<Cow<'a, [f32]>, KernelError> {
    check_input(kernel, what, buf.len(), layout)?;
    if layout.dims != [n] {
        return Err(error(
            kernel,
            format_args!(
                "{what} has dims {:?}, expected [{n}] (the last dim of the input)",
                layout.dims
            ),
        ));
    }
    let (off, stride) = (layout.offset, layout.strides[0]);
    Ok(match (n, stride) {
        (0, _) => Cow::Borrowed(&[]),
        (_, 1) => Cow::Borrowed(&buf[off..off + n]),
        (_, 0) => Cow::Owned(vec![buf[off]; n]),
        _ => Cow::Owned(run(buf, off, stride, n).copied().collect()),
    })
}

/// A layer norm (with a bias `b`) or an RMS norm (without) of each row of `rows` in
/// place (rows as long as `w`), as a `pulp` op: `Arch::dispatch` runs it compiled for
/// the CPU's widest SIMD level (the crate is otherwise built for baseline x86-64,
/// where these loops were 128-bit and bound by the latency of their adds).
///
/// Layer norm takes two passes, the mean and then the biased variance of the centred
/// values (as PyTorch does); the sums run on four independent vector accumulators;
/// `x · r · w (+ b)` is rounded as written (no fused multiply-add), in the vector head
/// and the scalar tail alike.
struct Norm<'r> {
    rows: &'r mut [f32],
    w: &'r [f32],
    b: Option<&'r [f32]>,
    eps: f32,
}

impl pulp::WithSimd for Norm<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let Norm { rows, w, b, eps } = self;
        let (wh, wt) = S::as_simd_f32s(w);
        for row in rows.chunks_exact_mut(w.len()) {
            let n = row.len() as f32;
            if b.is_some() {
                let mean = sum_simd(simd, row, false) / n;
                let m = simd.splat_f32s(mean);
                let (head, tail) = S::as_mut_simd_f32s(row);
                head.iter_mut().for_each(|x| *x = simd.sub_f32s(*x, m));
                tail.iter_mut().for_each(|x| *x -= mean);
            }
            let r = 1.0 / (sum_simd(simd, row, true) / n + eps).sqrt();
            let rv = simd.splat_f32s(r);
            let (head, tail) = S::as_mut_simd_f32s(row);
            match b {
                Some(b) => {
                    let (bh, bt) = S::as_simd_f32s(b);
                    for ((x, &w), &b) in head.iter_mut().zip(wh).zip(bh) {
                        *x = simd.add_f32s(simd.mul_f32s(simd.mul_f32s(*x, rv), w), b);
                    }
                    for ((x, &w), &b) in tail.iter_mut().zip(wt).zip(bt) {
                        *x = *x * r * w + b;
                    }
                }
                None => {
                    for (x, &w) in head.iter_mut().zip(wh) {
                        *x = simd.mul_f32s(simd.mul_f32s(*x, rv), w);
                    }
                    for (x, &w) in tail.iter_mut().zip(wt) {
                        *x = *x * r * w;
                    }
                }
            }
        }
    }
}

/// The softmax of each row of `n` elements of `rows`, in place, as a `pulp` op:
/// `cpu::dispatch` runs it compiled for the tier's widest SIMD level, where the
/// compiler vectorises `math::exp` and the max and sum with their 8 independent lanes
/// (in the crate's baseline x86-64 code these loops were SSE2, four lanes). The
/// arithmetic is written for one element at a time, with no fused multiply-add, so
/// every level gives the same bits (`softmax_has_the_same_bits_on_every_level`).
struct Softmax<'r> {
    rows: &'r mut [f32],
    n: usize,
}

impl pulp::WithSimd for Softmax<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        for row in self.rows.chunks_exact_mut(self.n) {
            let max = max(row);
            for x in row.iter_mut() {
                *x = math::exp(*x - max);
            }
            let inv = 1.0 / sum(row);
            for x in row.iter_mut() {
                *x *= inv;
            }
        }
    }
}

/// The sum of `x` (of its squares with `squares`) on four independent vector
/// accumulators, then the scalar tail.
#[inline(always)]
fn sum_simd<S: pulp::Simd>(simd: S, x: &[f32], squares: bool) -> f32 {
    let (head, tail) = S::as_simd_f32s(x);
    let mut acc = [simd.splat_f32s(0.0); 4];
    let add = |a: S::f32s, v: S::f32s| {
        if squares {
            simd.mul_add_f32s(v, v, a)
        } else {
            simd.add_f32s(a, v)
        }
    };
    let chunks = head.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = add(*a, v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a = add(*a, v);
    }
    let total = simd.add_f32s(simd.add_f32s(acc[0], acc[1]), simd.add_f32s(acc[2], acc[3]));
    let tail: f32 = tail.iter().map(|&v| if squares { v * v } else { v }).sum();
    simd.reduce_sum_f32s(total) + tail
}

/// Copies the input rows into `dst` chunk by chunk and normalises each chunk's rows
/// of `n` elements in place with `op`.
fn rows(src: &[f32], layout: &Layout, dst: &mut [f32], n: usize, op: &RowOp<'_>, par: Par) {
    let walk = Walk::new(&layout.dims, [&layout.strides], [layout.offset]);
    for_each_chunk(dst, n, n * op.cost(), par, |first_row, out| {
        copy_runs(src, &walk, first_row * n, out);
        op.apply_rows(out, n);
    });
}

/// Sum with 8 independent accumulators (vectorises; error grows like `n / 8`, fine for
/// rows of a few thousand).
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    let tail: f32 = rest.iter().sum();
    (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]) + tail
}

/// The largest element (ignoring NaN, which then spreads through the row anyway), with
/// 8 independent lanes so the loop vectorises.
#[inline(always)]
fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    rest.iter()
        .chain(&acc)
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::*;

    /// Rows of the input, gathered naively, as f64.
    fn naive_rows(buf: &[f32], l: &Layout) -> Vec<Vec<f64>> {
        let n = *l.dims.last().unwrap();
        let flat = gather(buf, l);
        if n == 0 {
            return Vec::new();
        }
        flat.chunks(n)
            .map(|r| r.iter().map(|&x| x as f64).collect())
            .collect()
    }

    fn random_case(rng: &mut Rng, case: usize) -> (Vec<f32>, Layout) {
        let rank = 1 + case % 4;
        let mut dims = rng.dims(rank, 6);
        if case.is_multiple_of(5) {
            dims[rank - 1] = 50 + rng.below(100);
        }
        random_layout(rng, &dims, |r| r.f32() * 4.0)
    }

    #[test]
    fn softmax_matches_naive() {
        let mut rng = Rng::new(20);
        for case in 0..200 {
            let (buf, l) = random_case(&mut rng, case);
            let want: Vec<f32> = naive_rows(&buf, &l)
                .iter()
                .flat_map(|r| {
                    let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let s: f64 = r.iter().map(|x| (x - m).exp()).sum();
                    r.iter()
                        .map(move |x| ((x - m).exp() / s) as f32)
                        .collect::<Vec<_>>()
                })
                .collect();
            for par in pars() {
                let mut out = vec![0.0; want.len()];
                softmax(&buf, &l, &mut out, par).unwrap();
                assert_close(&out, &want, 1e-6);
            }
        }
        // Large logits stay finite.
        let mut out = [0.0; 2];
        softmax(
            &[1000.0, 1000.0],
            &Layout::contiguous(&[2]),
            &mut out,
            Par::serial(),
        )
        .unwrap();
        assert_eq!(out, [0.5, 0.5]);
    }

    #[test]
    fn norms_match_naive() {
        let mut rng = Rng::new(21);
        for case in 0..200 {
            let (buf, l) = random_case(&mut rng, case);
            let n = *l.dims.last().unwrap();
            let (wb, wl) = rand_f32(&mut rng, &[n]);
            let (bb, bl) = rand_f32(&mut rng, &[n]);
            let w = gather(&wb, &wl);
            let b = gather(&bb, &bl);
            let eps = 1e-5;
            let mut want_ln = Vec::new();
            let mut want_rms = Vec::new();
            for r in naive_rows(&buf, &l) {
                let mean = r.iter().sum::<f64>() / n as f64;
                let var = r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
                let ms = r.iter().map(|x| x * x).sum::<f64>() / n as f64;
                for (i, x) in r.iter().enumerate() {
                    want_ln
                        .push(((x - mean) / (var + eps).sqrt() * w[i] as f64 + b[i] as f64) as f32);
                    want_rms.push((x / (ms + eps).sqrt() * w[i] as f64) as f32);
                }
            }
            for par in pars() {
                let mut out = vec![0.0; want_ln.len()];
                layer_norm(&buf, &l, &wb, &wl, &bb, &bl, eps, &mut out, par).unwrap();
                // A row that is constant (broadcast along the last dim) has variance 0,
                // and the f32 rounding of its mean is amplified by 1/sqrt(eps) ~ 316.
                assert_close(&out, &want_ln, 1e-3);
                rms_norm(&buf, &l, &wb, &wl, eps, &mut out, par).unwrap();
                assert_close(&out, &want_rms, 1e-5);
            }
        }
    }

    /// `op` run through each SIMD level this CPU has (whatever tier the environment
    /// forces): pulp's scalar form, then AVX2 and AVX-512 where they run, each with
    /// its name.
    fn on_every_level<Op: pulp::WithSimd + Clone>(op: Op) -> Vec<(&'static str, Op::Output)> {
        use pulp::Simd;
        #[allow(unused_mut)] // (one level off x86-64)
        let mut out = vec![("scalar", pulp::Scalar::new().vectorize(op.clone()))];
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(simd) = crate::kernels::cpu::v3_of_cpu() {
                out.push(("avx2", <pulp::x86::V3 as Simd>::vectorize(simd, op.clone())));
            }
            if let Some(simd) = crate::kernels::cpu::v4_of_cpu() {
                out.push(("avx512", <pulp::x86::V4 as Simd>::vectorize(simd, op)));
            }
        }
        out
    }

    /// Rows of a few lengths (below a vector, between vector multiples, long), with
    /// logits up to ±40, a masked -1e9, -inf and a row with a NaN.
    fn rows_of_every_length(rng: &mut Rng) -> Vec<(usize, Vec<f32>)> {
        let mut cases = Vec::new();
        for n in [1, 3, 8, 13, 16, 31, 64, 100, 384, 1000] {
            let mut x: Vec<f32> = (0..3 * n).map(|_| (rng.f32() - 0.5) * 80.0).collect();
            x[rng.below(3 * n)] = -1e9;
            x[rng.below(3 * n)] = f32::NEG_INFINITY;
            if n > 8 {
                x[2 * n + 5] = f32::NAN;
            }
            cases.push((n, x));
        }
        cases
    }

    /// The softmax's loops give the same bits on every SIMD level (scalar, AVX2,
    /// AVX-512, run directly whatever tier is forced): the same per-element
    /// operations, only vectorised.
    #[test]
    fn softmax_has_the_same_bits_on_every_level() {
        #[derive(Clone)]
        struct Rows(Vec<f32>, usize);
        impl pulp::WithSimd for Rows {
            type Output = Vec<f32>;
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(mut self, simd: S) -> Vec<f32> {
                let rows = &mut self.0;
                Softmax { rows, n: self.1 }.with_simd(simd);
                self.0
            }
        }
        let mut rng = Rng::new(22);
        for (n, x) in rows_of_every_length(&mut rng) {
            let x_rows = x.clone();
            let levels = on_every_level(Rows(x, n));
            let (_, scalar) = &levels[0];
            // The rows with a finite input (the random -inf may fill a row of one).
            for r in 0..2 {
                if x_rows[r * n..(r + 1) * n].iter().any(|v| v.is_finite()) {
                    let row = &scalar[r * n..(r + 1) * n];
                    assert!(row.iter().all(|v| v.is_finite()), "n {n} row {r}");
                }
            }
            for (name, got) in &levels[1..] {
                assert!(same_bits(got, scalar), "n {n}: {name} differs from scalar");
            }
        }
    }

    /// Layer and RMS norms on every SIMD level this CPU has (run directly, whatever
    /// tier is forced) are within 1e-5 of the f64 reference (relative, plus 1e-5
    /// absolute): the vector head and the scalar tail of each row, rows of lengths
    /// around the vector widths.
    #[test]
    fn norms_match_the_f64_reference_on_every_level() {
        #[derive(Clone)]
        struct Rows<'a>(Vec<f32>, &'a [f32], Option<&'a [f32]>);
        impl pulp::WithSimd for Rows<'_> {
            type Output = Vec<f32>;
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(mut self, simd: S) -> Vec<f32> {
                let (rows, w, b) = (&mut self.0, self.1, self.2);
                Norm {
                    rows,
                    w,
                    b,
                    eps: 1e-5,
                }
                .with_simd(simd);
                self.0
            }
        }
        let mut rng = Rng::new(23);
        for n in [1, 5, 8, 15, 16, 17, 33, 384, 1000] {
            let x: Vec<f32> = (0..4 * n).map(|_| (rng.f32() - 0.3) * 6.0).collect();
            let w: Vec<f32> = (0..n).map(|_| rng.f32() + 0.5).collect();
            let b: Vec<f32> = (0..n).map(|_| rng.f32() - 0.5).collect();
            let (mut want_ln, mut want_rms) = (Vec::new(), Vec::new());
            for r in x.chunks(n) {
                let r: Vec<f64> = r.iter().map(|&v| v as f64).collect();
                let nf = n as f64;
                let mean = r.iter().sum::<f64>() / nf;
                let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / nf;
                let ms = r.iter().map(|v| v * v).sum::<f64>() / nf;
                for (i, v) in r.iter().enumerate() {
                    let (wi, bi) = (w[i] as f64, b[i] as f64);
                    want_ln.push(((v - mean) / (var + 1e-5).sqrt() * wi + bi) as f32);
                    want_rms.push((v / (ms + 1e-5).sqrt() * wi) as f32);
                }
            }
            for (name, got) in on_every_level(Rows(x.clone(), &w, Some(&b))) {
                eprintln!("layer norm n {n} on {name}");
                assert_close(&got, &want_ln, 1e-5);
            }
            for (name, got) in on_every_level(Rows(x.clone(), &w, None)) {
                eprintln!("rms norm n {n} on {name}");
                assert_close(&got, &want_rms, 1e-5);
            }
        }
    }

    /// The norms' and softmax's `cpu::dispatch` runs them at the width of the tier in
    /// use: 16 lanes on `avx512` and above, 8 on `avx2` (and `avx2-vnni`), pulp's
    /// scalar form on `portable`.
    #[test]
    fn the_row_ops_run_at_the_width_of_the_tier() {
        use crate::kernels::cpu::{tier, Tier};
        struct Width;
        impl pulp::WithSimd for Width {
            type Output = usize;
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, _: S) -> usize {
                S::F32_LANES
            }
        }
        let want = match tier() {
            Tier::Portable => 1,
            Tier::Avx2 | Tier::Avx2Vnni => 8,
            Tier::Avx512 | Tier::Avx512Vnni | Tier::Amx => 16,
            Tier::Neon | Tier::NeonDotprod | Tier::NeonI8mm | Tier::Sve => 4,
        };
        assert_eq!(
            crate::kernels::cpu::dispatch(Width),
            want,
            "tier {}",
            tier()
        );
    }

    #[test]
    fn errors() {
        let x = [1.0f32; 6];
        let l = Layout::contiguous(&[2, 3]);
        let w = [1.0f32; 3];
        let wl = Layout::contiguous(&[3]);
        let mut out = [0.0; 6];
        assert!(softmax(&x, &l, &mut out[..5], Par::serial()).is_err());
        assert!(softmax(&x[..5], &l, &mut out, Par::serial()).is_err());
        let e = softmax(&x, &Layout::contiguous(&[]), &mut out[..1], Par::serial()).unwrap_err();
        assert!(e.0.contains("scalar"), "{e}");
        let e = rms_norm(
            &x,
            &l,
            &w,
            &Layout::contiguous(&[2]),
            1e-5,
            &mut out,
            Par::serial(),
        )
        .unwrap_err();
        assert!(e.0.contains("weight") && e.0.contains("[3]"), "{e}");
        assert!(rms_norm(&x, &l, &w[..2], &wl, 1e-5, &mut out, Par::serial()).is_err());
        assert!(layer_norm(&x, &l, &w, &wl, &w[..2], &wl, 1e-5, &mut out, Par::serial()).is_err());
        assert!(layer_norm(
            &x,
            &l,
            &w,
            &wl,
            &w,
            &Layout::contiguous(&[3, 1]),
            1e-5,
            &mut out,
            Par::serial()
        )
        .is_err());
        layer_norm(&x, &l, &w, &wl, &w, &wl, 1e-5, &mut out, Par::serial()).unwrap();
        assert_eq!(out, [1.0; 6]);
        // Empty rows are fine.
        softmax(&x, &Layout::contiguous(&[2, 0]), &mut [], Par::serial()).unwrap();
    }
}
