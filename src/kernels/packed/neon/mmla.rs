//! The register block of aarch64's 2 × 2 matrix multiply-accumulate instructions,
//! shared by the int8 `smmla` tile (`i8::neon`) and the bf16 `bfmmla` one
//! (`bf16::neon`).
//!
//! Both read their operands in **units** of 4 bytes of `k` (a quad of int8, a pair of
//! bf16) and take two units at a time: the first source holds two rows' 8 bytes (a row
//! in each 64-bit half), the second two columns' 8 bytes, and the instruction adds the
//! 2 × 2 block of sums `[r0·c0, r0·c1, r1·c0, r1·c1]` (i32 or f32). The packed panels
//! every tier shares hold a unit of 32 columns in 128 bytes (4 bytes a column), so a
//! half panel's unit is four vectors of 4 columns; two units' vectors are zipped
//! (`zip1`/`zip2` of 32-bit lanes) into the column pairs the instruction takes. The
//! left rows are the chunk's rows as the tiles quantise or round them (`units` units a
//! row, contiguous), read in pairs.

use std::arch::aarch64::*;

use super::ROWS;

/// A 2 × 2 matrix multiply-accumulate instruction (`smmla`, `bfmmla`).
pub(in crate::kernels::packed) trait Mmla {
    /// `acc + a · b` for `a` 2 rows × 8 bytes (a row in each half) and `b` 8 bytes × 2
    /// columns (a column in each half): `[a0·b0, a0·b1, a1·b0, a1·b1]`, as bits.
    ///
    /// # Safety
    ///
    /// The CPU has the instruction.
    unsafe fn mmla(acc: uint32x4_t, a: uint8x16_t, b: uint8x16_t) -> uint32x4_t;
}

/// Defines `$name`, the [`Mmla`] of the instruction `$insn` on operands in lanes of
/// `$lanes` (`16b` for int8, `8h` for bf16), in `asm!` (the instructions' intrinsics
/// are not stable Rust), compiled with the target feature `$feature`.
macro_rules! instruction {
    ($(#[$doc:meta])* $name:ident, $insn:literal, $lanes:literal, $feature:literal) => {
        $(#[$doc])*
        struct $name;

        impl $crate::kernels::packed::neon::mmla::Mmla for $name {
            #[inline]
            #[target_feature(enable = $feature)]
            unsafe fn mmla(
                acc: std::arch::aarch64::uint32x4_t,
                a: std::arch::aarch64::uint8x16_t,
                b: std::arch::aarch64::uint8x16_t,
            ) -> std::arch::aarch64::uint32x4_t {
                let mut acc = acc;
                // SAFETY: one instruction on registers, which the function's target
                // feature lets it encode and the caller's contract lets it run (the
                // CPU has it); it reads and writes nothing but them.
                unsafe {
                    std::arch::asm!(
                        concat!($insn, " {acc:v}.4s, {a:v}.", $lanes, ", {b:v}.", $lanes),
                        acc = inout(vreg) acc,
                        a = in(vreg) a,
                        b = in(vreg) b,
                        options(pure, nomem, nostack, preserves_flags),
                    );
                }
                acc
            }
        }
    };
}
pub(in crate::kernels::packed) use instruction;

/// The sums of `H` rows (1 to [`ROWS`]) by half a panel on `M`'s instruction, as four
/// vectors of 4 columns a row (bits of i32 or f32): the left rows at `a` (`row_bytes`
/// apart, `units` units each), the panel's half at `b` (unit `u`'s 64 bytes at `b +
/// 128 u`).
///
/// The rows go in pairs (a lone last row with a copy of itself, whose sums are
/// dropped), two units at a time; a last lone unit goes with zeros in the place of
/// the next. Per step the row pairs' vectors are loaded first (at most 3), then each
/// of the half's four vectors of columns is zipped with the next unit's into two
/// column pairs, multiplied into every row pair: 24 accumulators, 3 row vectors, 2
/// loaded and 2 zipped vectors, 31 of the 32 registers. At the end the 2 × 2 blocks
/// are unzipped into rows. Written for inlining into a function compiled with `M`'s
/// target feature.
///
/// # Safety
///
/// The CPU has `M`'s instruction; `1 <= H <= ROWS`; `units >= 1`; `a` is valid for
/// reading `H` rows of `units * 4` bytes, `row_bytes` apart; `b` for reading 64 bytes
/// at `b + 128 u` for every `u < units`.
#[inline(always)]
pub(in crate::kernels::packed) unsafe fn block<M: Mmla, const H: usize>(
    a: *const u8,
    row_bytes: usize,
    units: usize,
    b: *const u8,
) -> [[uint32x4_t; 4]; H] {
    const PAIRS: usize = ROWS / 2;
    let pairs = H.div_ceil(2);
    // SAFETY: (the whole function) the caller's contract; the loads below read rows
    // 0..H (`row` clamps a lone last row's partner to row H - 1) at bytes 4u..4u + 8
    // for u + 2 <= units (4u..4u + 4 for a last lone unit), and the panel's half of
    // units u < units.
    unsafe {
        let mut acc = [[vdupq_n_u32(0); 8]; PAIRS];
        let row = |r: usize| a.add(r.min(H - 1) * row_bytes);
        let mut u = 0;
        while u < units {
            let two = u + 1 < units;
            let mut x = [vdupq_n_u8(0); PAIRS];
            for (r, x) in x.iter_mut().enumerate().take(pairs) {
                let (r0, r1) = (row(2 * r).add(4 * u), row(2 * r + 1).add(4 * u));
                *x = if two {
                    vcombine_u8(vld1_u8(r0), vld1_u8(r1))
                } else {
                    let unit = |p: *const u8| u64::from(std::ptr::read_unaligned(p.cast::<u32>()));
                    vreinterpretq_u8_u64(vcombine_u64(vcreate_u64(unit(r0)), vcreate_u64(unit(r1))))
                };
            }
            for v in 0..4 {
                let lo = vreinterpretq_u32_u8(vld1q_u8(b.add(128 * u + 16 * v)));
                let hi = if two {
                    vreinterpretq_u32_u8(vld1q_u8(b.add(128 * (u + 1) + 16 * v)))
                } else {
                    vdupq_n_u32(0)
                };
                // Columns 4v and 4v + 1, then 4v + 2 and 4v + 3: each column's unit u
                // then unit u + 1.
                let c0 = vreinterpretq_u8_u32(vzip1q_u32(lo, hi));
                let c1 = vreinterpretq_u8_u32(vzip2q_u32(lo, hi));
                for (acc, &x) in acc.iter_mut().zip(&x).take(pairs) {
                    acc[2 * v] = M::mmla(acc[2 * v], x, c0);
                    acc[2 * v + 1] = M::mmla(acc[2 * v + 1], x, c1);
                }
            }
            u += 2;
        }
        let mut out = [[vdupq_n_u32(0); 4]; H];
        for (i, out) in out.iter_mut().enumerate() {
            let pair = &acc[i / 2];
            for (v, o) in out.iter_mut().enumerate() {
                // [r0·c0, r0·c1, r1·c0, r1·c1] and the same for columns 2 and 3.
                let x = vreinterpretq_u64_u32(pair[2 * v]);
                let y = vreinterpretq_u64_u32(pair[2 * v + 1]);
                let z = if i % 2 == 0 {
                    vzip1q_u64(x, y)
                } else {
                    vzip2q_u64(x, y)
                };
                *o = vreinterpretq_u32_u64(z);
            }
        }
        out
    }
}
