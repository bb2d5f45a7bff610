//! The attention block on AVX-512: one 16-lane vector holds the block's [`QB`]
//! queries, so every step is a vector operation on whole registers (written with
//! `pulp`'s safe vector types, so no `unsafe` here).
//!
//! Left to itself, LLVM unrolls the 16-lane loops of the portable path first and then
//! vectorises the loop over the head dimension instead, with gathers: 7× slower
//! than the unfused path. Explicit vectors keep the shape intended.

use pulp::x86::V4;
use pulp::{f32x16, Simd};

use super::{Block, Dst, Job, KB, QB};

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
    /// The AVX-512 body of [`Job::block`], inlined into the function `Job::block`
    /// runs under `V4::vectorize`. `D` is at least the head size.
    #[inline(always)]
    pub(super) fn block_avx512<const D: usize>(&self, simd: V4, blk: Block, out: Dst) {
        let dh = self.dh;
        let zero = simd.splat_f32s(0.0);
        // qt[d] holds element d of the block's queries (transposed and scaled).
        let qt: [f32x16; D] = if self.dh == D {
            self.q_lanes_transposed::<D>(simd, blk)
        } else {
            self.q_lanes::<D>(blk).map(pulp::bytemuck::cast)
        };
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
                // Past `g`, the last key again (its scores are not kept).
                let rows: [&[f32]; G] = std::array::from_fn(|x| {
                    self.row(self.k, &self.kr, blk, j0 + jj + x.min(g - 1))
                });
                let mut acc = [zero; G];
                for (d, q) in qt[..dh].iter().enumerate() {
                    for x in 0..G {
                        acc[x] = simd.mul_add_f32s(*q, simd.splat_f32s(rows[x][d]), acc[x]);
                    }
                }
                for (x, &a) in acc[..g].iter().enumerate() {
                    s[jj + x] = match self.bias_lanes(blk, j0 + jj + x) {
                        Some(bias) => simd.add_f32s(a, pulp::bytemuck::cast(bias)),
                        None => a,
                    };
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
                    self.row(self.v, &self.vr, blk, j0 + jj + x.min(g - 1))
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
        if self.dh == D {
            self.write_rows_transposed(simd, &mut ot, &inv, blk.len, out);
        } else {
            self.write_rows(&ot.map(pulp::bytemuck::cast), &inv, blk.len, out);
        }
    }

    /// [`Job::q_lanes`] for a head of exactly `D` elements (a multiple of 16), as
    /// vectors: the block's rows are loaded whole, scaled, and turned into lanes by
    /// [`transpose16`], 16 elements of the head at a time. The same products as
    /// `q_lanes`, so the same bits; written element by element, the compiler made
    /// the transposition of `q_lanes` into scattered stores, a fifth of the kernel's
    /// time at 28 queries. The rows are loaded and transposed in place in `qt` (a
    /// separate 16-row array copied in afterwards was a `memcpy` call per 16 elements
    /// of the head; without it and the same copy in `write_rows_transposed`, 12 heads
    /// of 28 tokens on one thread took 20.9 µs instead of 25.2).
    #[inline(always)]
    fn q_lanes_transposed<const D: usize>(&self, simd: V4, blk: Block) -> [f32x16; D] {
        let zero = simd.splat_f32s(0.0);
        let scale = simd.splat_f32s(self.scale);
        let mut qt = [zero; D];
        for (c, lanes) in qt.chunks_exact_mut(QB).enumerate() {
            let rows: &mut [f32x16; QB] = lanes.try_into().expect("QB lanes");
            for (t, r) in rows.iter_mut().enumerate().take(blk.len) {
                let at = self.qr.at(blk.b, blk.h, blk.i0 + t) + c * QB;
                *r = simd.mul_f32s(load16(&self.q[at..at + QB]), scale);
            }
            transpose16(simd, rows);
        }
        qt
    }

    /// [`Job::write_rows`] for a head of exactly `D` elements, as vectors: 16 elements
    /// of the head at a time, the lanes turned back into rows by [`transpose16`], each
    /// row scaled by its `inv` (the same products, so the same bits).
    #[inline(always)]
    fn write_rows_transposed<const D: usize>(
        &self,
        simd: V4,
        ot: &mut [f32x16; D],
        inv: &[f32; QB],
        len: usize,
        out: Dst,
    ) {
        for (c, lanes) in ot.chunks_exact_mut(QB).enumerate() {
            let rows: &mut [f32x16; QB] = lanes.try_into().expect("QB lanes");
            transpose16(simd, rows);
            for (t, r) in rows.iter().enumerate().take(len) {
                let scaled = simd.mul_f32s(*r, simd.splat_f32s(inv[t]));
                // SAFETY: this task writes the block's rows of its head (see `Dst`).
                let row = unsafe { out.row(t) };
                let dst: &mut [f32; QB] = (&mut row[c * QB..c * QB + QB]).try_into().expect("QB");
                *dst = pulp::bytemuck::cast(scaled);
            }
        }
    }
}

/// The 16 floats of `x` (exactly 16 long) as a vector.
#[inline(always)]
fn load16(x: &[f32]) -> f32x16 {
    let a: &[f32; QB] = x.try_into().expect("16 floats");
    pulp::bytemuck::cast(*a)
}

/// Transposes the 16 × 16 matrix whose row `i` is `r[i]`, in place: four rounds of
/// two-source permutations, round `s` (8, 4, 2, 1) swapping the off-diagonal `s × s`
/// blocks of every `2s × 2s` block (bit `s` of the row index with bit `s` of the
/// column index); the rounds commute, and together they swap every row bit with its
/// column bit.
#[inline(always)]
fn transpose16(simd: V4, r: &mut [f32x16; QB]) {
    // Lane j of the first result of a pair takes a[j] where bit s of j is clear, else
    // b[j - s]; the second takes a[j + s] where it is clear, else b[j] (b's lanes are
    // numbered from 16 in a two-source index).
    const fn index(s: usize, first: bool) -> [u32; QB] {
        let mut idx = [0u32; QB];
        let mut j = 0;
        while j < QB {
            idx[j] = match (j & s == 0, first) {
                (true, true) => j,
                (false, true) => QB + j - s,
                (true, false) => j + s,
                (false, false) => QB + j,
            } as u32;
            j += 1;
        }
        idx
    }
    /// Round `S`, its index vectors constants and its loop unrolled (a loop over a
    /// table of the rounds copied the 544-byte table to the stack on every call,
    /// `memcpy`, and permuted by indices loaded from there).
    #[inline(always)]
    fn round<const S: usize>(simd: V4, r: &mut [f32x16; QB]) {
        let first = pulp::bytemuck::cast(const { index(S, true) });
        let second = pulp::bytemuck::cast(const { index(S, false) });
        for i in 0..QB {
            if i & S == 0 {
                let a = pulp::bytemuck::cast(r[i]);
                let b = pulp::bytemuck::cast(r[i + S]);
                r[i] = pulp::bytemuck::cast(simd.avx512f._mm512_permutex2var_ps(a, first, b));
                r[i + S] = pulp::bytemuck::cast(simd.avx512f._mm512_permutex2var_ps(a, second, b));
            }
        }
    }
    round::<8>(simd, r);
    round::<4>(simd, r);
    round::<2>(simd, r);
    round::<1>(simd, r);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose16_transposes() {
        let Some(simd) = crate::kernels::cpu::v4() else {
            return;
        };
        let m: [[f32; QB]; QB] =
            std::array::from_fn(|i| std::array::from_fn(|j| (i * QB + j) as f32));
        let mut r: [f32x16; QB] = m.map(pulp::bytemuck::cast);
        transpose16(simd, &mut r);
        let t: [[f32; QB]; QB] = r.map(pulp::bytemuck::cast);
        for i in 0..QB {
            for j in 0..QB {
                assert_eq!(t[i][j], m[j][i], "element ({i}, {j})");
            }
        }
    }
}
