//! The attention block on AVX-512: one 16-lane vector holds the block's [`QB`]
//! queries, so every step is a vector operation on whole registers (written with
//! `pulp`'s safe vector types, so no `unsafe` here).
//!
//! Left to itself, LLVM unrolls the 16-lane loops of the portable path first and then
//! vectorises the loop over the head dimension instead, with gathers: 7× slower
//! than the unfused path. Explicit vectors keep the shape intended.

use pulp::x86::V4;
use pulp::{f32x16, Simd};

use super::{Job, KB, MAX_HEAD_DIM, QB};

// One vector is one block of queries.
const _: () = assert!(QB == 16);

/// `e^x` for `x <= 0` (the softmax's `e^(score - max)`), 16 lanes at once: the
/// reduction of `math::exp` (`x = k ln 2 + r`, Cody–Waite), its degree-7 polynomial,
/// `2^k` built in the exponent bits (one factor suffices: `k` is in `[-126, 0]`).
/// Below -87.33 the result is 0 (as `math::exp` flushes); `-inf` gives 0.
#[inline(always)]
fn exp_nonpositive(simd: V4, x: f32x16) -> f32x16 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0;
    let s = |v: f32| simd.splat_f32s(v);
    let xc = simd.min_f32s(simd.max_f32s(x, s(-87.33)), s(0.0));
    let t = simd.mul_add_f32s(xc, s(LOG2E), s(ROUND));
    let k = simd.sub_f32s(t, s(ROUND));
    let ki = simd.sub_u32s(
        simd.transmute_u32s_f32s(t),
        simd.splat_u32s(ROUND.to_bits()),
    );
    let r = simd.mul_add_f32s(k, s(-LN2_HI), xc);
    let r = simd.mul_add_f32s(k, s(-LN2_LO), r);
    let mut p = s(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = simd.mul_add_f32s(p, r, s(c));
    }
    // 2^k: the biased exponent k + 127 moved into bits 23..31 (a product by 2^23).
    let scale = simd.transmute_f32s_u32s(simd.mul_u32s(
        simd.add_u32s(ki, simd.splat_u32s(127)),
        simd.splat_u32s(1 << 23),
    ));
    let y = simd.mul_f32s(p, scale);
    simd.select_f32s(simd.less_than_f32s(x, s(-87.33)), s(0.0), y)
}

/// Keys scored (and accumulated) together.
const G: usize = 8;

impl Job<'_> {
    /// `scores + bias[b, h, i0.., j]` for the block's lanes.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn add_bias(
        &self,
        simd: V4,
        scores: f32x16,
        b: usize,
        h: usize,
        i0: usize,
        len: usize,
        j: usize,
    ) -> f32x16 {
        let Some(bias) = &self.bias else {
            return scores;
        };
        let [sb, sh, si, sj] = bias.strides;
        let base = bias.offset + b * sb + h * sh + j * sj;
        let add = if si == 0 {
            simd.splat_f32s(bias.data[base])
        } else {
            let mut lanes = [0f32; QB];
            for (t, x) in lanes.iter_mut().enumerate().take(len) {
                *x = bias.data[base + (i0 + t) * si];
            }
            pulp::bytemuck::cast(lanes)
        };
        simd.add_f32s(scores, add)
    }

    /// [`Job::block`] with the queries in one vector.
    #[inline]
    pub(super) fn block_avx512(
        &self,
        simd: V4,
        b: usize,
        h: usize,
        i0: usize,
        len: usize,
        out: &mut [f32],
    ) {
        /// The block as a `pulp` op: `Simd::vectorize` calls `with_simd` from a
        /// function compiled for AVX-512, and everything below is inlined into it.
        /// (A closure passed to `V4::vectorize` is not: every intrinsic then becomes a
        /// call, 40× slower.)
        struct Op<'a, 'b> {
            job: &'a Job<'b>,
            simd: V4,
            b: usize,
            h: usize,
            i0: usize,
            len: usize,
            out: &'a mut [f32],
        }
        impl pulp::WithSimd for Op<'_, '_> {
            type Output = ();
            #[inline(always)]
            fn with_simd<S: Simd>(self, _: S) {
                let (job, simd, b, h, i0, len, out) = (
                    self.job, self.simd, self.b, self.h, self.i0, self.len, self.out,
                );
                // Tiles sized for the head, as in the portable path.
                match job.dh {
                    0..=32 => job.body_avx512::<32>(simd, b, h, i0, len, out),
                    33..=64 => job.body_avx512::<64>(simd, b, h, i0, len, out),
                    65..=128 => job.body_avx512::<128>(simd, b, h, i0, len, out),
                    _ => job.body_avx512::<MAX_HEAD_DIM>(simd, b, h, i0, len, out),
                }
            }
        }
        <V4 as Simd>::vectorize(
            simd,
            Op {
                job: self,
                simd,
                b,
                h,
                i0,
                len,
                out,
            },
        )
    }

    /// The block's arithmetic; `D` is at least the head size.
    #[inline(always)]
    fn body_avx512<const D: usize>(
        &self,
        simd: V4,
        b: usize,
        h: usize,
        i0: usize,
        len: usize,
        out: &mut [f32],
    ) {
        let dh = self.dh;
        let zero = simd.splat_f32s(0.0);
        // q transposed and scaled: qt[d] holds element d of the block's queries.
        let mut q_lanes = [[0f32; QB]; D];
        for t in 0..len {
            let at = self.qr.at(b, h, i0 + t);
            for (lanes, &x) in q_lanes.iter_mut().zip(&self.q[at..at + dh]) {
                lanes[t] = x * self.scale;
            }
        }
        let qt: [f32x16; D] = q_lanes.map(pulp::bytemuck::cast);
        let mut ot = [zero; D];
        let mut s = [zero; KB];
        let mut max = simd.splat_f32s(f32::NEG_INFINITY);
        let mut sum = zero;
        let mut j0 = 0;
        while j0 < self.lk {
            let kn = KB.min(self.lk - j0);
            // Scores, G keys at a time: G independent multiply-add chains (one would
            // wait on the FMA latency at every step) sharing each load of qt[d].
            let mut jj = 0;
            while jj < kn {
                let g = G.min(kn - jj);
                let rows: [&[f32]; G] = std::array::from_fn(|x| {
                    let at = self.kr.at(b, h, j0 + jj + x.min(g - 1));
                    &self.k[at..at + dh]
                });
                let mut acc = [zero; G];
                for (d, q) in qt[..dh].iter().enumerate() {
                    for x in 0..G {
                        acc[x] = simd.mul_add_f32s(*q, simd.splat_f32s(rows[x][d]), acc[x]);
                    }
                }
                for (x, &a) in acc[..g].iter().enumerate() {
                    s[jj + x] = self.add_bias(simd, a, b, h, i0, len, j0 + jj + x);
                }
                jj += g;
            }
            let new_max = s[..kn].iter().fold(max, |m, &x| simd.max_f32s(m, x));
            // e^(old max - new max); 0 while nothing was summed (old max -inf).
            let corr = exp_nonpositive(simd, simd.sub_f32s(max, new_max));
            sum = simd.mul_f32s(sum, corr);
            if j0 > 0 {
                for o in ot[..dh].iter_mut() {
                    *o = simd.mul_f32s(*o, corr);
                }
            }
            max = new_max;
            // ot[d] += p[key] · v[key][d], G keys per pass over ot (one load and store
            // of ot[d] per G multiply-adds).
            let mut jj = 0;
            while jj < kn {
                let g = G.min(kn - jj);
                let mut p = [zero; G];
                let rows: [&[f32]; G] = std::array::from_fn(|x| {
                    let at = self.vr.at(b, h, j0 + jj + x.min(g - 1));
                    &self.v[at..at + dh]
                });
                for x in 0..g {
                    p[x] = exp_nonpositive(simd, simd.sub_f32s(s[jj + x], max));
                    sum = simd.add_f32s(sum, p[x]);
                }
                // Lanes past `g` have p = 0 and read a valid row: they add nothing.
                for (d, o) in ot[..dh].iter_mut().enumerate() {
                    let mut a = *o;
                    for x in 0..G {
                        a = simd.mul_add_f32s(p[x], simd.splat_f32s(rows[x][d]), a);
                    }
                    *o = a;
                }
                jj += g;
            }
            j0 += kn;
        }
        let inv: [f32; QB] = pulp::bytemuck::cast(simd.div_f32s(simd.splat_f32s(1.0), sum));
        let row = self.heads * dh;
        let ot: [[f32; QB]; D] = ot.map(pulp::bytemuck::cast);
        for t in 0..len {
            for (d, o) in out[t * row..t * row + dh].iter_mut().enumerate() {
                *o = ot[d][t] * inv[t];
            }
        }
    }
}
