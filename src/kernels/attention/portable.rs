//! The attention block as plain loops over the [`QB`] query lanes: the path for CPUs
//! without AVX-512, and the reference the vector path is tested against.

use super::{Block, Dst, Job, KB, QB};
use crate::kernels::math;

impl Job<'_> {
    /// The portable body of [`Job::block`], inlined into a function compiled for the
    /// CPU's SIMD level (LLVM decides what vectorises). `D` is at least the head size.
    // Lanes are indexed across several arrays at once (`acc[l] += qt[d][l] * kd`): the
    // index loops are what vectorises.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    pub(super) fn block_portable<const D: usize>(&self, blk: Block, out: Dst) {
        let dh = self.dh;
        let qt: [[f32; QB]; D] = self.q_lanes(blk);
        let mut ot = [[0f32; QB]; D];
        let mut s = [[0f32; QB]; KB];
        let mut max = [f32::NEG_INFINITY; QB];
        let mut sum = [0f32; QB];
        // Only the keys some row of the block sees, in tiles from the first.
        let (mut j0, end) = self.block_keys(blk);
        let mut first = true;
        while j0 < end {
            let kn = KB.min(end - j0);
            let cut = self.cut(blk, j0, kn);
            // Scores of this key block.
            for (jj, sj) in s[..kn].iter_mut().enumerate() {
                let mut acc = [0f32; QB];
                for (d, &kd) in self.row(self.k, &self.kr, blk, j0 + jj).iter().enumerate() {
                    for l in 0..QB {
                        acc[l] += qt[d][l] * kd;
                    }
                }
                if let Some(bias) = self.bias_lanes(blk, j0 + jj) {
                    for l in 0..QB {
                        acc[l] += bias[l];
                    }
                }
                if cut {
                    self.mask_lanes(blk, j0 + jj, &mut acc);
                }
                *sj = acc;
            }
            // Online softmax: the new maximum, the rescale of what came before.
            let mut new_max = max;
            for sj in &s[..kn] {
                for l in 0..QB {
                    new_max[l] = new_max[l].max(sj[l]);
                }
            }
            let mut corr = [0f32; QB];
            for l in 0..QB {
                // exp(-inf - -inf) would be NaN: nothing was summed yet, so 0.
                corr[l] = if max[l] == f32::NEG_INFINITY {
                    0.0
                } else {
                    math::exp(max[l] - new_max[l])
                };
                sum[l] *= corr[l];
            }
            if !first {
                for o in ot[..dh].iter_mut() {
                    for l in 0..QB {
                        o[l] *= corr[l];
                    }
                }
            }
            max = new_max;
            for (jj, sj) in s[..kn].iter_mut().enumerate() {
                for l in 0..QB {
                    sj[l] = math::exp(sj[l] - max[l]);
                    sum[l] += sj[l];
                }
                let vrow = self.row(self.v, &self.vr, blk, j0 + jj);
                for (o, &vd) in ot[..dh].iter_mut().zip(vrow) {
                    for l in 0..QB {
                        o[l] += sj[l] * vd;
                    }
                }
            }
            j0 += kn;
            first = false;
        }
        let mut inv = sum.map(|x| 1.0 / x);
        self.zero_unseeing(blk, &mut inv);
        self.write_rows(&ot, &inv, blk.len, out);
    }
}
