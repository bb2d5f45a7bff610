//! The AVX-512 level of the vector attention block (`vector.rs`): one 16-lane vector
//! holds a block's [`QB`] queries, and a square of 16 vectors is turned around by
//! [`transpose16`].

use pulp::f32x16;
use pulp::x86::V4;

use super::vector::Lanes;
use super::QB;

// One vector is one block of queries.
const _: () = assert!(QB == 16);

impl Lanes for V4 {
    #[inline(always)]
    fn transpose(self, r: &mut [f32x16]) {
        transpose16(self, r.try_into().expect("16 vectors"));
    }
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
