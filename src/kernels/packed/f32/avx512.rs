//! The f32 tile on AVX-512: up to 14 rows by one panel of 32 columns, `R × 2`
//! accumulators, and per step of `k` two loads of the panel's row and a broadcast
//! and two fused multiply-adds a row; the loop in assembly.
//!
//! Written by hand because of the left operand's addresses: the compiler kept one
//! pointer a row and spent an integer add or `lea` on nearly every row of every step,
//! on the ports the multiplies need. Here four base pointers reach all 14 rows
//! through the scaled index (`row!`), so a step is two loads of the panel, a broadcast
//! and two multiplies a row, and five adds. Measured against the intrinsics loop it
//! replaced (the same instructions otherwise, and the same bits), alternated in one
//! process, medians of 11, one thread: 28 × 384 × 1152 175 → 185 GFLOP/s, 227 × 384 ×
//! 1152 161 → 174, 682 × 1536 × 384 160 → 175, 896 × 384 × 1536 142 → 153; two
//! threads, 896 × 384 × 1536 287 → 319.
//!
//! On the 2-core Zen 5 EPYC (two 512-bit FMA pipes a core; a loop of register-only
//! `vfmadd231ps` runs 259 GFLOP/s a core, 4.04 GHz), one thread, the loop with a
//! bias epilogue runs MiniLM's `[384, 384]` (a weight that stays in L2) and `[1536,
//! 384]` at 251–257 GFLOP/s, `[384, 1152]` and `[384, 1536]` at 230–247 (42 to 168
//! rows a call, more rows at the top of the range): 89–99% of the FMA peak.
//! The GELU epilogue costs 11% of the `[384, 1536]` product at 42 rows a call (238 →
//! 212 GFLOP/s), about 15 FMA-pipe operations a vector; applied two or fourteen rows
//! at a time it measured the same. Broadcasting the left element inside each
//! multiply-add (`{1to16}` memory operands: two loads a row instead of one, and room
//! for 15 rows) measured slower: 896 × 384 × 1152 225.6 → 194.5 and 218.2 → 189.2
//! GFLOP/s (the loads, 32 a step, not the multiplies, bound it). All in one process,
//! variants alternated, on a machine shared with builds (10th percentiles).

use super::{Operand, Step, Tile, L1_AHEAD};
use std::arch::asm;
use std::arch::x86_64::*;

/// Row `i` of a step: broadcast its element of the left operand (zmm30 and zmm31
/// by turns) and multiply it by the panel's two halves (zmm28, zmm29) into its
/// two accumulators (zmm `2i` and `2i + 1`). The rows are reached from four base
/// pointers, rows 0, 3, 5 and 10, and `lda` (bytes) scaled by 1, 2, 4 or 8.
macro_rules! row {
    ($x:literal, $at:literal, $c0:literal, $c1:literal) => {
        concat!(
            "vbroadcastss ",
            $x,
            ", dword ptr ",
            $at,
            "\n",
            "vfmadd231ps ",
            $c0,
            ", ",
            $x,
            ", zmm28\n",
            "vfmadd231ps ",
            $c1,
            ", ",
            $x,
            ", zmm29"
        )
    };
    (0) => {
        row!("zmm30", "[{p0}]", "zmm0", "zmm1")
    };
    (1) => {
        row!("zmm31", "[{p0} + {lda}]", "zmm2", "zmm3")
    };
    (2) => {
        row!("zmm30", "[{p0} + {lda} * 2]", "zmm4", "zmm5")
    };
    (3) => {
        row!("zmm31", "[{p3}]", "zmm6", "zmm7")
    };
    (4) => {
        row!("zmm30", "[{p0} + {lda} * 4]", "zmm8", "zmm9")
    };
    (5) => {
        row!("zmm31", "[{p3} + {lda} * 2]", "zmm10", "zmm11")
    };
    (6) => {
        row!("zmm30", "[{p5} + {lda}]", "zmm12", "zmm13")
    };
    (7) => {
        row!("zmm31", "[{p3} + {lda} * 4]", "zmm14", "zmm15")
    };
    (8) => {
        row!("zmm30", "[{p0} + {lda} * 8]", "zmm16", "zmm17")
    };
    (9) => {
        row!("zmm31", "[{p5} + {lda} * 4]", "zmm18", "zmm19")
    };
    (10) => {
        row!("zmm30", "[{p10}]", "zmm20", "zmm21")
    };
    (11) => {
        row!("zmm31", "[{p3} + {lda} * 8]", "zmm22", "zmm23")
    };
    (12) => {
        row!("zmm30", "[{p10} + {lda} * 2]", "zmm24", "zmm25")
    };
    (13) => {
        row!("zmm31", "[{p5} + {lda} * 8]", "zmm26", "zmm27")
    };
}

/// One step of `k`: the panel's two vectors, the hint for its line `L1_AHEAD`
/// bytes on, the rows, and every pointer moved on a step.
macro_rules! step {
    ($($r:tt)*) => {
        concat!(
            "vmovups zmm28, [{b}]\n",
            "vmovups zmm29, [{b} + 64]\n",
            "prefetcht0 [{b} + {l1}]\n",
            "prefetcht0 [{b} + {l1} + 64]\n",
            $(row!($r), "\n",)*
            "add {b}, 128\n",
            "add {p0}, {cs}\n",
            "add {p3}, {cs}\n",
            "add {p5}, {cs}\n",
            "add {p10}, {cs}"
        )
    };
}

/// The whole loop for the rows listed: zero the 28 accumulators, `n1` steps that
/// also ask for the next panel's lines (`$next`: the hints and the move on), then
/// `n2` steps that do not; the accumulators come out in `acc0`, `acc1`.
macro_rules! steps {
    ($o:ident, [$($next:literal),*], $($r:tt)*) => {
        asm!(
            "vpxord zmm0, zmm0, zmm0", "vpxord zmm1, zmm1, zmm1",
            "vpxord zmm2, zmm2, zmm2", "vpxord zmm3, zmm3, zmm3",
            "vpxord zmm4, zmm4, zmm4", "vpxord zmm5, zmm5, zmm5",
            "vpxord zmm6, zmm6, zmm6", "vpxord zmm7, zmm7, zmm7",
            "vpxord zmm8, zmm8, zmm8", "vpxord zmm9, zmm9, zmm9",
            "vpxord zmm10, zmm10, zmm10", "vpxord zmm11, zmm11, zmm11",
            "vpxord zmm12, zmm12, zmm12", "vpxord zmm13, zmm13, zmm13",
            "vpxord zmm14, zmm14, zmm14", "vpxord zmm15, zmm15, zmm15",
            "vpxord zmm16, zmm16, zmm16", "vpxord zmm17, zmm17, zmm17",
            "vpxord zmm18, zmm18, zmm18", "vpxord zmm19, zmm19, zmm19",
            "vpxord zmm20, zmm20, zmm20", "vpxord zmm21, zmm21, zmm21",
            "vpxord zmm22, zmm22, zmm22", "vpxord zmm23, zmm23, zmm23",
            "vpxord zmm24, zmm24, zmm24", "vpxord zmm25, zmm25, zmm25",
            "vpxord zmm26, zmm26, zmm26", "vpxord zmm27, zmm27, zmm27",
            "test {n1}, {n1}",
            "jz 3f",
            ".p2align 5",
            "2:",
            $($next,)*
            step!($($r)*),
            "dec {n1}",
            "jnz 2b",
            "3:",
            "test {n2}, {n2}",
            "jz 5f",
            ".p2align 5",
            "4:",
            step!($($r)*),
            "dec {n2}",
            "jnz 4b",
            "5:",
            // Operands a short tile does not name.
            "/* {lda} {p3} {p5} {p10} {next} */",
            b = inout(reg) $o.b => _,
            p0 = inout(reg) $o.rows[0] => _,
            p3 = inout(reg) $o.rows[1] => _,
            p5 = inout(reg) $o.rows[2] => _,
            p10 = inout(reg) $o.rows[3] => _,
            lda = in(reg) $o.lda,
            cs = in(reg) $o.cs,
            n1 = inout(reg) $o.n1 => _,
            n2 = inout(reg) $o.n2 => _,
            next = inout(reg) $o.next => _,
            l1 = const L1_AHEAD,
            out("zmm0") $o.acc0[0], out("zmm1") $o.acc1[0],
            out("zmm2") $o.acc0[1], out("zmm3") $o.acc1[1],
            out("zmm4") $o.acc0[2], out("zmm5") $o.acc1[2],
            out("zmm6") $o.acc0[3], out("zmm7") $o.acc1[3],
            out("zmm8") $o.acc0[4], out("zmm9") $o.acc1[4],
            out("zmm10") $o.acc0[5], out("zmm11") $o.acc1[5],
            out("zmm12") $o.acc0[6], out("zmm13") $o.acc1[6],
            out("zmm14") $o.acc0[7], out("zmm15") $o.acc1[7],
            out("zmm16") $o.acc0[8], out("zmm17") $o.acc1[8],
            out("zmm18") $o.acc0[9], out("zmm19") $o.acc1[9],
            out("zmm20") $o.acc0[10], out("zmm21") $o.acc1[10],
            out("zmm22") $o.acc0[11], out("zmm23") $o.acc1[11],
            out("zmm24") $o.acc0[12], out("zmm25") $o.acc1[12],
            out("zmm26") $o.acc0[13], out("zmm27") $o.acc1[13],
            out("zmm28") _, out("zmm29") _, out("zmm30") _, out("zmm31") _,
            options(nostack),
        )
    };
}

/// The loop's operands, in bytes where they are strides.
struct Operands {
    b: *const f32,
    /// Rows 0, 3, 5 and 10 of the left operand (pointers only computed, never
    /// read, for rows a short tile does not have).
    rows: [*const f32; 4],
    lda: usize,
    cs: usize,
    n1: usize,
    n2: usize,
    next: *const u8,
    acc0: [__m512; 14],
    acc1: [__m512; 14],
}

/// The tile on AVX-512: `R × 2` accumulators, one step of `k` per iteration.
///
/// # Safety
///
/// The CPU has AVX-512F; `1 <= R <= 14`; `t.k >= 1` and `t.b` holds at least
/// `t.k * NR` ([`super::NR`]) elements; `t.a` holds more than
/// `(R - 1) * t.lda + (t.k - 1) * t.cs`; `dst` is valid for writes of
/// `(R - 1) * ldc + j0 + width` elements (`t.at`), of which nobody else reads or
/// writes the tile's during the call, and `1 <= width <= NR`; every step of
/// `t.epilogue` has the tile's rows' columns `j0..j0 + width` inside its operand
/// (for a [`Operand::Rows`], rows `row0..row0 + R`).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    let a = t.a.as_ptr();
    let n1 = t.next.steps.min(t.k);
    let mut o = Operands {
        b: t.b.as_ptr(),
        rows: [0, 3, 5, 10].map(|i| a.wrapping_add(i * t.lda)),
        lda: t.lda * 4,
        cs: t.cs * 4,
        n1,
        n2: t.k - n1,
        next: t.next.at,
        acc0: [_mm512_setzero_ps(); 14],
        acc1: [_mm512_setzero_ps(); 14],
    };
    macro_rules! go {
        ($($r:tt)*) => {
            if t.next.per == 2 {
                steps!(o, ["prefetcht1 [{next}]", "prefetcht1 [{next} + 64]", "add {next}, 128"], $($r)*)
            } else {
                steps!(o, ["prefetcht1 [{next}]", "add {next}, 64"], $($r)*)
            }
        };
    }
    // SAFETY: step p (p < k = n1 + n2) reads the panel's b[p * NR..p * NR + 32],
    // inside `t.b` (k * NR elements), and a[i * lda + p * cs] for the listed rows
    // i < R only, inside `t.a` (whose last element is at (R - 1) * lda + (k - 1)
    // * cs or beyond); base pointers of rows past R are moved on but never read.
    // The prefetches are hints: they read nothing and cannot fault, whatever the
    // address. The asm writes only the registers it declares and no memory.
    unsafe {
        match R {
            1 => go!(0),
            2 => go!(0 1),
            3 => go!(0 1 2),
            4 => go!(0 1 2 3),
            5 => go!(0 1 2 3 4),
            6 => go!(0 1 2 3 4 5),
            7 => go!(0 1 2 3 4 5 6),
            8 => go!(0 1 2 3 4 5 6 7),
            9 => go!(0 1 2 3 4 5 6 7 8),
            10 => go!(0 1 2 3 4 5 6 7 8 9),
            11 => go!(0 1 2 3 4 5 6 7 8 9 10),
            12 => go!(0 1 2 3 4 5 6 7 8 9 10 11),
            13 => go!(0 1 2 3 4 5 6 7 8 9 10 11 12),
            14 => go!(0 1 2 3 4 5 6 7 8 9 10 11 12 13),
            _ => unreachable!("a tile has 1 to 14 rows"),
        }
    }
    let (mut acc0, mut acc1) = (o.acc0, o.acc1);
    let (m0, m1) = super::super::lane_masks(t.at.width);
    // The two halves of a row's `width` values from `at` (the masks read only the
    // first `width` lanes).
    let load = |at: *const f32| {
        // SAFETY: the CPU has AVX-512F (this function's contract), and every `at`
        // given is the first of a row's `width` operand columns, all inside the
        // operand (checked by `check_epilogue`); the masks read only those lanes.
        unsafe {
            (
                _mm512_maskz_loadu_ps(m0, at),
                _mm512_maskz_loadu_ps(m1, at.wrapping_add(16)),
            )
        }
    };
    let add = |acc: __m512, v: __m512, sum_first: bool| {
        if sum_first {
            _mm512_add_ps(acc, v)
        } else {
            _mm512_add_ps(v, acc)
        }
    };
    for step in t.epilogue {
        match *step {
            Step::Add {
                operand: Operand::Columns(values),
                sum_first,
            } => {
                // SAFETY: `values` holds the tile's columns j0..j0 + width (the
                // caller's contract).
                let (v0, v1) = unsafe { load(values.as_ptr().add(t.at.j0)) };
                for i in 0..R {
                    acc0[i] = add(acc0[i], v0, sum_first);
                    acc1[i] = add(acc1[i], v1, sum_first);
                }
            }
            Step::Add {
                operand:
                    Operand::Rows {
                        data,
                        offset,
                        stride,
                    },
                sum_first,
            } => {
                for i in 0..R {
                    let at = offset + (t.row0 + i) * stride + t.at.j0;
                    // SAFETY: row `row0 + i` of the matrix has the tile's columns
                    // j0..j0 + width inside `data` (the caller's contract).
                    let (v0, v1) = unsafe { load(data.as_ptr().add(at)) };
                    acc0[i] = add(acc0[i], v0, sum_first);
                    acc1[i] = add(acc1[i], v1, sum_first);
                }
            }
            Step::Gelu => {
                for i in 0..R {
                    [acc0[i], acc1[i]] = crate::kernels::math::gelu_v512([acc0[i], acc1[i]]);
                }
            }
        }
    }
    // SAFETY: the caller's contract: `dst` is valid for the tile's rows' columns
    // j0..j0 + width (at i * ldc + j0..), which no one else touches; the masks
    // write only the first `width` lanes.
    unsafe { super::super::store_rows!(R, acc0, acc1, t.at, dst) }
}
