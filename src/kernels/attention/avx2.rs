//! The AVX2 level of the vector attention block (`vector.rs`): a block's [`QB`]
//! queries fill two 8-lane vectors (one when the block has at most 8 rows), and a
//! square of 8 vectors is turned around by [`transpose8`].

use pulp::f32x8;
use pulp::x86::V3;

use super::vector::Lanes;
use super::QB;

/// Lanes of one vector.
const W: usize = 8;

// Two vectors are one block of queries.
const _: () = assert!(QB == 2 * W);

impl Lanes for V3 {
    #[inline(always)]
    fn transpose(self, r: &mut [f32x8]) {
        transpose8(self, r.try_into().expect("8 vectors"));
    }
}

/// Transposes the 8 × 8 matrix whose row `i` is `r[i]`, in place, in three rounds of
/// in-lane and cross-lane shuffles: `unpacklo`/`unpackhi` interleave pairs of rows
/// (2 × 2 blocks of elements), `shuffle_ps` pairs of those (4 × 4 blocks within each
/// 128-bit half), and `permute2f128` swaps the off-diagonal halves.
#[inline(always)]
fn transpose8(simd: V3, r: &mut [f32x8; W]) {
    use pulp::bytemuck::cast;
    let avx = simd.avx;
    let x: [_; W] = r.map(cast);
    // t[2i] = (a0 b0 a1 b1 | a4 b4 a5 b5), t[2i + 1] = (a2 b2 a3 b3 | a6 b6 a7 b7) for
    // rows a = x[2i], b = x[2i + 1].
    let t: [_; W] = std::array::from_fn(|i| {
        let (a, b) = (x[i & !1], x[i | 1]);
        if i % 2 == 0 {
            avx._mm256_unpacklo_ps(a, b)
        } else {
            avx._mm256_unpackhi_ps(a, b)
        }
    });
    // u[4h + j] holds column j (and j + 4) of rows 4h..4h + 4.
    let u: [_; W] = std::array::from_fn(|i| {
        let (h, j) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + j / 2], t[4 * h + 2 + j / 2]);
        if j % 2 == 0 {
            avx._mm256_shuffle_ps::<0x44>(a, b)
        } else {
            avx._mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    // Row j of the result: the low halves of u[j] and u[4 + j] (columns 0..4), or
    // their high halves (columns 4..8).
    *r = std::array::from_fn(|i| {
        let (a, b) = (u[i % 4], u[4 + i % 4]);
        cast(if i < 4 {
            avx._mm256_permute2f128_ps::<0x20>(a, b)
        } else {
            avx._mm256_permute2f128_ps::<0x31>(a, b)
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose8_transposes() {
        let Some(simd) = crate::kernels::cpu::v3_of_cpu() else {
            return;
        };
        let m: [[f32; W]; W] = std::array::from_fn(|i| std::array::from_fn(|j| (i * W + j) as f32));
        let mut r: [f32x8; W] = m.map(pulp::bytemuck::cast);
        transpose8(simd, &mut r);
        let t: [[f32; W]; W] = r.map(pulp::bytemuck::cast);
        for i in 0..W {
            for j in 0..W {
                assert_eq!(t[i][j], m[j][i], "element ({i}, {j})");
            }
        }
    }
}
