//! The attention block on vector registers, one loop for every `pulp` SIMD level that
//! can turn a square of its vectors around ([`Lanes`]: AVX-512 in `avx512.rs`, AVX2 in
//! `avx2.rs`). The block's [`QB`] queries fill `N` vectors of lanes (one 16-lane
//! vector on AVX-512; two 8-lane vectors on AVX2, or one when the block has at most 8
//! rows), so every step is a vector operation on whole registers (written with
//! `pulp`'s safe vector types, so no `unsafe` here).
//!
//! Every lane (query) goes through the same operations in the same order whatever the
//! vector width and however the keys are grouped: each score is `dh` fused
//! multiply-adds in the order of the head's elements, the maximum, the sum and the
//! context accumulate key by key, and a group of keys is padded with weight `-0.0`
//! times a row of `+0.0` (adding `-0.0` leaves every value as it is, the sign of a
//! zero included). So the AVX2 and AVX-512 blocks give the same bits (`mod.rs` tests
//! it), and differ from the portable loops (separate multiplies and adds, and
//! `math::exp`) by rounding only.
//!
//! Left to itself, LLVM unrolls the 16-lane loops of the portable path first and then
//! vectorises the loop over the head dimension instead, with gathers: 7× slower
//! than the unfused path. Explicit vectors keep the shape intended.

use pulp::Simd;

use super::{Block, Dst, Job, KB, MAX_HEAD_DIM, QB};

/// What the vector block needs of a SIMD level beyond `pulp`'s [`Simd`].
pub(super) trait Lanes: Simd {
    /// Transposes in place the square matrix whose row `i` is `r[i]` (`r` holds
    /// `Self::F32_LANES` vectors).
    fn transpose(self, r: &mut [Self::f32s]);
}

/// The row a padded key's value is read from: `+0.0`, at least one head long.
static ZEROS: [f32; MAX_HEAD_DIM] = [0.0; MAX_HEAD_DIM];

/// `e^x` for `x <= 0` (the softmax's `e^(score - max)`), every lane at once: the
/// reduction of `math::exp` (`x = k ln 2 + r`, Cody–Waite), its degree-7 polynomial,
/// `2^k` built in the exponent bits (one factor suffices: `k` is in `[-126, 0]`).
/// Below -87.33 the result is 0 (as `math::exp` flushes); `-inf` gives 0. Unlike
/// `math::exp` it rounds once per multiply-add (fused), so it may differ from it in
/// the last bits (`exp_nonpositive_is_close_to_math_exp` bounds it); each lane's
/// result is the same on every SIMD level.
#[inline(always)]
pub(super) fn exp_nonpositive<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
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

/// The vector of `S` in `x` (exactly one vector long).
#[inline(always)]
fn load<S: Simd>(x: &[f32]) -> S::f32s {
    S::as_simd_f32s(x).0[0]
}

/// `x` into `dst` (exactly one vector long).
#[inline(always)]
fn store<S: Simd>(dst: &mut [f32], x: S::f32s) {
    S::as_mut_simd_f32s(dst).0[0] = x;
}

impl Job<'_> {
    /// The vector body of [`Job::block`], inlined into the function `Job::block` runs
    /// under `S::vectorize`: the block's rows in `N` vectors of `S` (`N` lanes'
    /// worth at least `blk.len`, at most [`QB`]), keys scored and accumulated `G` at a
    /// time (as many independent chains as the registers hold). `D` is at least the
    /// head size.
    #[inline(always)]
    pub(super) fn block_vector<S: Lanes, const D: usize, const N: usize, const G: usize>(
        &self,
        simd: S,
        blk: Block,
        out: Dst,
    ) {
        const { assert!(N >= 1 && G >= 1) };
        assert!(blk.len <= N * S::F32_LANES && N * S::F32_LANES <= QB);
        let dh = self.dh;
        let zero = simd.splat_f32s(0.0);
        // qt[n][d] holds element d of the block's queries of vector n (transposed and
        // scaled).
        let qt: [[S::f32s; D]; N] = if dh == D {
            self.q_vectors_transposed::<S, D, N>(simd, blk)
        } else {
            let lanes = self.q_lanes::<D>(blk);
            std::array::from_fn(|n| {
                let w = S::F32_LANES;
                std::array::from_fn(|d| load::<S>(&lanes[d][n * w..n * w + w]))
            })
        };
        let mut ot = [[zero; D]; N];
        let mut s = [[zero; N]; KB];
        let mut max = [simd.splat_f32s(f32::NEG_INFINITY); N];
        let mut sum = [zero; N];
        // Only the keys some row of the block sees, in tiles from the first; lanes
        // are masked only in the tiles the window cuts.
        let (mut j0, end) = self.block_keys(blk);
        let mut first = true;
        while j0 < end {
            let kn = KB.min(end - j0);
            let cut = self.cut(blk, j0, kn);
            // Scores, G keys at a time: G · N independent multiply-add chains (one would
            // wait on the FMA latency at every step) sharing each load of qt[n][d].
            let mut jj = 0;
            while jj < kn {
                let g = G.min(kn - jj);
                // Past `g`, the last key again (its scores are not kept).
                let rows: [&[f32]; G] = std::array::from_fn(|x| {
                    self.row(self.k, &self.kr, blk, j0 + jj + x.min(g - 1))
                });
                let mut acc = [[zero; N]; G];
                for d in 0..dh {
                    for x in 0..G {
                        let k = simd.splat_f32s(rows[x][d]);
                        for n in 0..N {
                            acc[x][n] = simd.mul_add_f32s(qt[n][d], k, acc[x][n]);
                        }
                    }
                }
                for (x, a) in acc[..g].iter().enumerate() {
                    s[jj + x] = match self.bias_lanes(blk, j0 + jj + x) {
                        Some(bias) => std::array::from_fn(|n| {
                            let w = S::F32_LANES;
                            simd.add_f32s(a[n], load::<S>(&bias[n * w..n * w + w]))
                        }),
                        None => *a,
                    };
                    if cut {
                        let w = S::F32_LANES;
                        let mut lanes = [0f32; QB];
                        for (n, &sn) in s[jj + x].iter().enumerate() {
                            store::<S>(&mut lanes[n * w..n * w + w], sn);
                        }
                        self.mask_lanes(blk, j0 + jj + x, &mut lanes);
                        s[jj + x] = std::array::from_fn(|n| load::<S>(&lanes[n * w..n * w + w]));
                    }
                }
                jj += g;
            }
            // e^(old max - new max); 0 while nothing was summed (old max -inf).
            let mut corr = [zero; N];
            for n in 0..N {
                let new_max = s[..kn].iter().fold(max[n], |m, x| simd.max_f32s(m, x[n]));
                corr[n] = exp_nonpositive(simd, simd.sub_f32s(max[n], new_max));
                sum[n] = simd.mul_f32s(sum[n], corr[n]);
                max[n] = new_max;
            }
            if !first {
                for (on, &c) in ot.iter_mut().zip(&corr) {
                    for o in on[..dh].iter_mut() {
                        *o = simd.mul_f32s(*o, c);
                    }
                }
            }
            // ot[n][d] += p[key][n] · v[key][d], G keys per pass over ot (one load and
            // store of ot[n][d] per G multiply-adds).
            let mut jj = 0;
            while jj < kn {
                let g = G.min(kn - jj);
                // Past `g`, weight -0 times a row of +0: adds -0, which changes nothing.
                let mut p = [[simd.splat_f32s(-0.0); N]; G];
                let rows: [&[f32]; G] = std::array::from_fn(|x| {
                    if x < g {
                        self.row(self.v, &self.vr, blk, j0 + jj + x)
                    } else {
                        &ZEROS[..dh]
                    }
                });
                for x in 0..g {
                    for n in 0..N {
                        p[x][n] = exp_nonpositive(simd, simd.sub_f32s(s[jj + x][n], max[n]));
                        sum[n] = simd.add_f32s(sum[n], p[x][n]);
                    }
                }
                for d in 0..dh {
                    let mut a: [S::f32s; N] = std::array::from_fn(|n| ot[n][d]);
                    for x in 0..G {
                        let v = simd.splat_f32s(rows[x][d]);
                        for n in 0..N {
                            a[n] = simd.mul_add_f32s(p[x][n], v, a[n]);
                        }
                    }
                    for n in 0..N {
                        ot[n][d] = a[n];
                    }
                }
                jj += g;
            }
            j0 += kn;
            first = false;
        }
        let mut inv = [0f32; QB];
        for (n, &sn) in sum.iter().enumerate() {
            let w = S::F32_LANES;
            store::<S>(
                &mut inv[n * w..n * w + w],
                simd.div_f32s(simd.splat_f32s(1.0), sn),
            );
        }
        self.zero_unseeing(blk, &mut inv);
        if dh == D {
            self.write_rows_transposed::<S, D, N>(simd, &mut ot, &inv, blk.len, out);
        } else {
            let mut lanes = [[0f32; QB]; D];
            for (d, l) in lanes.iter_mut().enumerate() {
                let w = S::F32_LANES;
                for (n, on) in ot.iter().enumerate() {
                    store::<S>(&mut l[n * w..n * w + w], on[d]);
                }
            }
            self.write_rows(&lanes, &inv, blk.len, out);
        }
    }

    /// [`Job::q_lanes`] for a head of exactly `D` elements (a multiple of the lanes),
    /// as `N` vectors of queries: their rows are loaded whole, scaled, and turned into
    /// lanes by [`Lanes::transpose`], a square of lanes at a time. The same products as
    /// `q_lanes`, so the same bits; written element by element, the compiler made the
    /// transposition of `q_lanes` into scattered stores, a fifth of the kernel's time
    /// at 28 queries on AVX-512. The rows are loaded and transposed in place in `qt`
    /// (on AVX-512 a separate 16-row array copied in afterwards was a `memcpy` call
    /// per 16 elements of the head; without it and the same copy in
    /// `write_rows_transposed`, 12 heads of 28 tokens on one thread took 20.9 µs
    /// instead of 25.2).
    #[inline(always)]
    fn q_vectors_transposed<S: Lanes, const D: usize, const N: usize>(
        &self,
        simd: S,
        blk: Block,
    ) -> [[S::f32s; D]; N] {
        let w = S::F32_LANES;
        let zero = simd.splat_f32s(0.0);
        let scale = simd.splat_f32s(self.scale);
        let mut qt = [[zero; D]; N];
        for (n, qn) in qt.iter_mut().enumerate() {
            let rows = blk.len.saturating_sub(n * w).min(w);
            for (c, square) in qn.chunks_exact_mut(w).enumerate() {
                for (t, r) in square.iter_mut().enumerate().take(rows) {
                    let at = self.qr.at(blk.b, blk.h, blk.i0 + n * w + t) + c * w;
                    *r = simd.mul_f32s(load::<S>(&self.q[at..at + w]), scale);
                }
                simd.transpose(square);
            }
        }
        qt
    }

    /// [`Job::write_rows`] for a head of exactly `D` elements, as vectors: a square of
    /// lanes at a time turned back into rows by [`Lanes::transpose`], each row scaled
    /// by its `inv` (the same products, so the same bits).
    #[inline(always)]
    fn write_rows_transposed<S: Lanes, const D: usize, const N: usize>(
        &self,
        simd: S,
        ot: &mut [[S::f32s; D]; N],
        inv: &[f32; QB],
        len: usize,
        out: Dst,
    ) {
        let w = S::F32_LANES;
        for (n, on) in ot.iter_mut().enumerate() {
            let rows = len.saturating_sub(n * w).min(w);
            for (c, square) in on.chunks_exact_mut(w).enumerate() {
                simd.transpose(square);
                for (t, r) in square.iter().enumerate().take(rows) {
                    let scaled = simd.mul_f32s(*r, simd.splat_f32s(inv[n * w + t]));
                    // SAFETY: this task writes the block's rows of its head (see `Dst`).
                    let row = unsafe { out.row(n * w + t) };
                    store::<S>(&mut row[c * w..c * w + w], scaled);
                }
            }
        }
    }
}
