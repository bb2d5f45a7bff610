//! The f32 tile on AVX2 with FMA: up to [`AVX2_ROWS`](super::AVX2_ROWS) (6) rows by one
//! half of a panel (16 columns, two `ymm` vectors) at a time, the panel's two halves
//! one after the other. Twelve accumulators, and per step of `k` two loads of the
//! half-panel's row (one cache line) and a broadcast and two fused multiply-adds a
//! row: the 16 `ymm` registers hold no taller or wider tile with its operands.
//!
//! The loop is in assembly for the reason the AVX-512 tile's is (module `avx512`): two
//! base pointers and the scaled index reach all six rows, so a step spends three
//! integer adds, not one a row. When the left operand's rows are contiguous (`cs ==
//! 1`, every activation of a model), four steps run per iteration with the steps'
//! offsets in the addresses, so four steps spend three adds.

use super::{Cols, Epilogue, Operand, Step, Tile, AVX2_ROWS};
use std::arch::asm;
use std::arch::x86_64::*;

/// How far ahead of the step being multiplied the tile asks for its half-panel's line
/// into L1.
const L1_AHEAD: usize = 1024;

/// Row `i` of a step `$d` steps on from the pointers (`$da` bytes of the left
/// operand, with `cs == 1`; "0" otherwise): broadcast its element (ymm14 and ymm15
/// by turns) and multiply it by the half-panel's two vectors (ymm12, ymm13) into its
/// two accumulators (ymm `2i` and `2i + 1`). The rows are reached from two base
/// pointers, rows 0 and 3, and `lda` (bytes) scaled by 1, 2 or 4.
macro_rules! row {
    ($x:literal, $at:literal, $da:literal, $c0:literal, $c1:literal) => {
        concat!(
            "vbroadcastss ",
            $x,
            ", dword ptr [",
            $at,
            " + ",
            $da,
            "]\n",
            "vfmadd231ps ",
            $c0,
            ", ",
            $x,
            ", ymm12\n",
            "vfmadd231ps ",
            $c1,
            ", ",
            $x,
            ", ymm13"
        )
    };
    (0, $da:literal) => {
        row!("ymm14", "{p0}", $da, "ymm0", "ymm1")
    };
    (1, $da:literal) => {
        row!("ymm15", "{p0} + {lda}", $da, "ymm2", "ymm3")
    };
    (2, $da:literal) => {
        row!("ymm14", "{p0} + {lda} * 2", $da, "ymm4", "ymm5")
    };
    (3, $da:literal) => {
        row!("ymm15", "{p3}", $da, "ymm6", "ymm7")
    };
    (4, $da:literal) => {
        row!("ymm14", "{p0} + {lda} * 4", $da, "ymm8", "ymm9")
    };
    (5, $da:literal) => {
        row!("ymm15", "{p3} + {lda} * 2", $da, "ymm10", "ymm11")
    };
}
// The bf16 tile (`packed::bf16::avx2`) multiplies its widened pairs with the same rows.
pub(in crate::kernels::packed) use row;

/// The multiplies of one step `$db` bytes on in the panel and `$da` bytes on in the
/// left rows: the half-panel's two vectors, the hint for its line `L1_AHEAD` bytes on,
/// the rows.
macro_rules! step {
    ($db:literal, $da:literal, $($r:tt)*) => {
        concat!(
            "vmovups ymm12, [{b} + ", $db, "]\n",
            "vmovups ymm13, [{b} + ", $db, " + 32]\n",
            "prefetcht0 [{b} + ", $db, " + {l1}]\n",
            $(row!($r, $da), "\n",)*
        )
    };
}

/// The whole loop of one half-panel for the rows listed: zero the 12 accumulators,
/// then four loops, each skipped when its count is 0: `u1` iterations of four steps
/// that also ask for the next panel's lines, `n1` single such steps, `u2` iterations of
/// four steps that do not, `n2` single steps. The four-step iterations hold for
/// `cs == 1` only. The accumulators come out in `acc0`, `acc1`.
macro_rules! steps {
    ($o:ident, $($r:tt)*) => {
        asm!(
            "vxorps ymm0, ymm0, ymm0", "vxorps ymm1, ymm1, ymm1",
            "vxorps ymm2, ymm2, ymm2", "vxorps ymm3, ymm3, ymm3",
            "vxorps ymm4, ymm4, ymm4", "vxorps ymm5, ymm5, ymm5",
            "vxorps ymm6, ymm6, ymm6", "vxorps ymm7, ymm7, ymm7",
            "vxorps ymm8, ymm8, ymm8", "vxorps ymm9, ymm9, ymm9",
            "vxorps ymm10, ymm10, ymm10", "vxorps ymm11, ymm11, ymm11",
            "test {u1}, {u1}",
            "jz 3f",
            ".p2align 5",
            "2:",
            "prefetcht1 [{next}]",
            "prefetcht1 [{next} + 64]",
            "prefetcht1 [{next} + 128]",
            "prefetcht1 [{next} + 192]",
            step!("0", "0", $($r)*),
            step!("128", "4", $($r)*),
            step!("256", "8", $($r)*),
            step!("384", "12", $($r)*),
            "add {next}, 256",
            "add {b}, 512",
            "add {p0}, 16",
            "add {p3}, 16",
            "dec {u1}",
            "jnz 2b",
            "3:",
            "test {n1}, {n1}",
            "jz 5f",
            ".p2align 5",
            "4:",
            "prefetcht1 [{next}]",
            step!("0", "0", $($r)*),
            "add {next}, 64",
            "add {b}, 128",
            "add {p0}, {cs}",
            "add {p3}, {cs}",
            "dec {n1}",
            "jnz 4b",
            "5:",
            "test {u2}, {u2}",
            "jz 7f",
            ".p2align 5",
            "6:",
            step!("0", "0", $($r)*),
            step!("128", "4", $($r)*),
            step!("256", "8", $($r)*),
            step!("384", "12", $($r)*),
            "add {b}, 512",
            "add {p0}, 16",
            "add {p3}, 16",
            "dec {u2}",
            "jnz 6b",
            "7:",
            "test {n2}, {n2}",
            "jz 9f",
            ".p2align 5",
            "8:",
            step!("0", "0", $($r)*),
            "add {b}, 128",
            "add {p0}, {cs}",
            "add {p3}, {cs}",
            "dec {n2}",
            "jnz 8b",
            "9:",
            // Operands a short tile does not name.
            "/* {lda} {p3} */",
            b = inout(reg) $o.b => _,
            p0 = inout(reg) $o.rows[0] => _,
            p3 = inout(reg) $o.rows[1] => _,
            lda = in(reg) $o.lda,
            cs = in(reg) $o.cs,
            u1 = inout(reg) $o.counts[0] => _,
            n1 = inout(reg) $o.counts[1] => _,
            u2 = inout(reg) $o.counts[2] => _,
            n2 = inout(reg) $o.counts[3] => _,
            next = inout(reg) $o.next => _,
            l1 = const L1_AHEAD,
            out("ymm0") $o.acc0[0], out("ymm1") $o.acc1[0],
            out("ymm2") $o.acc0[1], out("ymm3") $o.acc1[1],
            out("ymm4") $o.acc0[2], out("ymm5") $o.acc1[2],
            out("ymm6") $o.acc0[3], out("ymm7") $o.acc1[3],
            out("ymm8") $o.acc0[4], out("ymm9") $o.acc1[4],
            out("ymm10") $o.acc0[5], out("ymm11") $o.acc1[5],
            out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
            options(nostack),
        )
    };
}

/// The loop's operands, in bytes where they are strides.
struct Operands {
    b: *const f32,
    /// Rows 0 and 3 of the left operand (pointers only computed, never read, for rows
    /// a short tile does not have).
    rows: [*const f32; 2],
    lda: usize,
    cs: usize,
    /// The four loops' counts (see `steps!`).
    counts: [usize; 4],
    next: *const u8,
    acc0: [__m256; AVX2_ROWS],
    acc1: [__m256; AVX2_ROWS],
}

/// The counts of the four loops of `steps!` for `k` steps of which the first `n1` ask
/// for the next panel: by fours where the rows are contiguous (`cs == 1`).
fn counts(k: usize, n1: usize, cs: usize) -> [usize; 4] {
    let n2 = k - n1;
    if cs == 1 {
        [n1 / 4, n1 % 4, n2 / 4, n2 % 4]
    } else {
        [0, n1, 0, n2]
    }
}

/// The lanes of two 8-lane vectors that hold the first `w` of 16 columns, as masks
/// for `vmaskmovps`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lane_masks(w: usize) -> (__m256i, __m256i) {
    let w = _mm256_set1_epi32(w as i32);
    let lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let hi = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
    (_mm256_cmpgt_epi32(w, lo), _mm256_cmpgt_epi32(w, hi))
}

/// The tile on AVX2: `R × 2` accumulators per half-panel, one step of `k` per
/// iteration (four where the rows are contiguous).
///
/// # Safety
///
/// The CPU has AVX2 and FMA; `1 <= R <= 6`; `t.k >= 1` and `t.b` holds at least
/// `t.k * NR` ([`super::NR`]) elements; `t.a` holds more than
/// `(R - 1) * t.lda + (t.k - 1) * t.cs`; `dst` is valid for writes of
/// `(R - 1) * ldc + j0 + width` elements (`t.at`), of which nobody else reads or
/// writes the tile's during the call, and `1 <= width <= NR`; every step of
/// `t.epilogue` has the tile's rows' columns `j0..j0 + width` inside its operand (for
/// a [`Operand::Rows`], rows `row0..row0 + R`).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile<'_>, dst: *mut f32) {
    let a = t.a.as_ptr();
    let mut next = t.next;
    // The loops ask for one line of the next panel a step.
    debug_assert!(next.per == 1 || next.steps == 0);
    for half in 0..2 {
        let width = t.at.width.saturating_sub(16 * half).min(16);
        if width == 0 {
            break;
        }
        let n1 = next.steps.min(t.k);
        let mut o = Operands {
            b: t.b.as_ptr().wrapping_add(16 * half),
            rows: [0, 3].map(|i| a.wrapping_add(i * t.lda)),
            lda: t.lda * 4,
            cs: t.cs * 4,
            counts: counts(t.k, n1, t.cs),
            next: next.at,
            acc0: [_mm256_setzero_ps(); AVX2_ROWS],
            acc1: [_mm256_setzero_ps(); AVX2_ROWS],
        };
        next = next.after(n1);
        // SAFETY: step p (p < k, the loops' counts add up to k) reads the half-panel's
        // b[p * NR + 16 * half..][..16], inside `t.b` (k * NR elements), and
        // a[i * lda + p * cs] for the listed rows i < R only, inside `t.a` (whose last
        // element is at (R - 1) * lda + (k - 1) * cs or beyond); the four-step loops
        // run only for cs == 1, where step p + d is d * 4 bytes on. Base pointers of
        // rows past R are moved on but never read. The prefetches are hints: they read
        // nothing and cannot fault, whatever the address. The asm writes only the
        // registers it declares and no memory.
        unsafe {
            match R {
                1 => steps!(o, 0),
                2 => steps!(o, 0 1),
                3 => steps!(o, 0 1 2),
                4 => steps!(o, 0 1 2 3),
                5 => steps!(o, 0 1 2 3 4),
                6 => steps!(o, 0 1 2 3 4 5),
                _ => unreachable!("an AVX2 tile has 1 to 6 rows"),
            }
        }
        // SAFETY: the caller's contract: the epilogue's operands and `dst` hold the
        // tile's rows' columns of `t.at` (this half's among them).
        unsafe { finish::<R>((t.epilogue, t.row0, t.at), half, o.acc0, o.acc1, dst) };
    }
}

/// Applies `epilogue` to the accumulators of half `half` of a panel and stores them:
/// columns `j0 + 16 * half..` of `at` (at most 16, as many as the panel has there) of
/// the tile's `R` rows, the first of which is row `row0` of the product (which a
/// [`Operand::Rows`] is indexed by). The bf16 tile (`packed::bf16::avx2`) ends with it
/// too.
///
/// # Safety
///
/// As for [`tile`]: `dst` and every epilogue operand hold the columns `at` of the
/// tile's rows, and the half holds columns (`16 * half < at.width`).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(in crate::kernels::packed) unsafe fn finish<const R: usize>(
    (epilogue, row0, at): (Epilogue<'_>, usize, Cols),
    half: usize,
    mut acc0: [__m256; AVX2_ROWS],
    mut acc1: [__m256; AVX2_ROWS],
    dst: *mut f32,
) {
    let (j0, ldc) = (at.j0 + 16 * half, at.ldc);
    let width = at.width.saturating_sub(16 * half).min(16);
    let full = width == 16;
    let (m0, m1) = lane_masks(width);
    // The two vectors of `width` values from `at` (masked, reading only the first
    // `width` lanes, when the half is ragged).
    let load = |at: *const f32| {
        // SAFETY: the caller's `at` has `width` readable f32.
        unsafe {
            if full {
                (_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8)))
            } else {
                (
                    _mm256_maskload_ps(at, m0),
                    _mm256_maskload_ps(at.wrapping_add(8), m1),
                )
            }
        }
    };
    let add = |acc: __m256, v: __m256, sum_first: bool| {
        if sum_first {
            _mm256_add_ps(acc, v)
        } else {
            _mm256_add_ps(v, acc)
        }
    };
    for step in epilogue {
        match *step {
            Step::Add {
                operand: Operand::Columns(values),
                sum_first,
            } => {
                let (v0, v1) = load(values.as_ptr().wrapping_add(j0));
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
                    let at = offset + (row0 + i) * stride + j0;
                    let (v0, v1) = load(data.as_ptr().wrapping_add(at));
                    acc0[i] = add(acc0[i], v0, sum_first);
                    acc1[i] = add(acc1[i], v1, sum_first);
                }
            }
            Step::Gelu => {
                for i in 0..R {
                    [acc0[i], acc1[i]] = crate::kernels::math::gelu_v256([acc0[i], acc1[i]]);
                }
            }
        }
    }
    for i in 0..R {
        let row = dst.wrapping_add(i * ldc + j0);
        // SAFETY: the caller's contract: `dst` holds columns j0..j0 + width of the
        // tile's rows, which no one else touches; the masks write only the first
        // `width` lanes.
        unsafe {
            if full {
                _mm256_storeu_ps(row, acc0[i]);
                _mm256_storeu_ps(row.add(8), acc1[i]);
            } else {
                _mm256_maskstore_ps(row, m0, acc0[i]);
                _mm256_maskstore_ps(row.wrapping_add(8), m1, acc1[i]);
            }
        }
    }
}
