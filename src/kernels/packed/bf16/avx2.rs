//! The bf16 tile on AVX2 with FMA: up to 6 rows by one 16-column half of a panel at a
//! time, the panel's bf16 pairs widened to f32 in registers and multiplied by the left
//! rows in f32, then the chain's epilogue (the f32 AVX2 tile's `finish`).
//!
//! A step multiplies one pair `q` of the half-panel (16 pairs, one cache line): it
//! loads the line's two vectors of 8 pairs and widens their low halves (`vpshufb`:
//! each pair's low 16 bits moved to the top, zeros below: the f32 of row `2q`),
//! broadcasts each row's element `2q` and multiplies it into the row's two
//! accumulators; then loads the line again, widens the high halves (`vpshufb` again:
//! row `2q + 1`) and does the same with elements `2q + 1`. So the sums are the f32
//! AVX2 tile's on the widened weight (one fused multiply-add per element of `k`, in
//! the order of `k`), bit for bit. Twelve accumulators, the two widened vectors and
//! two broadcast registers fill the 16 `ymm`; the second load of the line reads L1,
//! and the shuffles' controls come from memory. Per pair: 24 FMAs (ports 0 and 1 on
//! Intel), 4 shuffles (port 5), 8 loads beside the 12 broadcasts, against the f32
//! tile's 24 FMAs, 4 loads and 12 broadcasts over twice the weight bytes.
//!
//! The loop is assembly for the f32 AVX2 tile's reasons (module `packed::f32::avx2`,
//! whose `row!` it uses): two base pointers and the scaled index reach the six rows,
//! and two pairs (four elements of `k`) run per iteration with their offsets in the
//! addresses. An odd `k`'s last element (the low half of the last pair) is one more
//! step after the loop.
//!
//! **Measured** (`benches/lowp.rs`, `lowp_alternate`: a pass over MiniLM's 24 weights
//! alternated with the f32 AVX2 tile in one process, one thread's CPU time, 21 rounds,
//! this project's Skylake-SP forced to `avx2`): 12 rows 44.7 against 30.1 GFLOP/s, 28
//! rows 49.6 against 40.5, 96 rows 56.4 against 51.9, 896 rows 55.7 against 55.3. Parts
//! of many rows take the panel widened into a copy instead ([`widen_panel`], then the
//! f32 tile; `super::WIDE_PANEL_ROWS` has the figures).

use super::super::f32::avx2::{finish, row};
use super::{Wide, NR};
use crate::kernels::packed::f32::AVX2_ROWS;
use std::arch::asm;
use std::arch::x86_64::*;

/// How far ahead of the step being multiplied the tile asks for its half-panel's line
/// into L1 (as the f32 AVX2 tile).
const L1_AHEAD: usize = 1024;

/// The `vpshufb` controls that widen 8 pairs (each 128-bit lane's 4): the first 32
/// bytes move each pair's low half to the top of its lane (`x << 16`, row `2q`), the
/// next 32 keep its high half in place (`x & 0xffff0000`, row `2q + 1`); a set top bit
/// (`0x80`) writes a zero byte.
#[repr(C, align(64))]
struct Widen([u8; 64]);

/// The controls (see [`Widen`]).
static WIDEN: Widen = {
    let mut c = [0x80u8; 64];
    let mut i = 0;
    while i < 32 {
        // Byte i of a 16-byte lane's dword `d`: bytes 2, 3 of the result take the
        // source's bytes 0, 1 (low half) or 2, 3 (high half) of the same dword.
        let (lane_byte, d) = (i % 16, (i % 16) / 4);
        if lane_byte % 4 >= 2 {
            c[i] = (4 * d + lane_byte % 4 - 2) as u8;
            c[32 + i] = (4 * d + lane_byte % 4) as u8;
        }
        i += 1;
    }
    Widen(c)
};

/// The multiplies of one pair `$db` bytes on in the panel and `$da` bytes on in the
/// left rows (element `2q`; `$da1` is element `2q + 1`): the low halves by the rows'
/// elements `2q`, then the high halves by their elements `2q + 1`, and the hint for
/// the half-panel's line `L1_AHEAD` bytes on.
macro_rules! pair {
    ($db:literal, $da:literal, $da1:literal, $($r:tt)*) => {
        concat!(
            "vmovdqu ymm12, [{b} + ", $db, "]\n",
            "vmovdqu ymm13, [{b} + ", $db, " + 32]\n",
            "vpshufb ymm12, ymm12, [{c}]\n",
            "vpshufb ymm13, ymm13, [{c}]\n",
            "prefetcht0 [{b} + ", $db, " + {l1}]\n",
            $(row!($r, $da), "\n",)*
            "vmovdqu ymm12, [{b} + ", $db, "]\n",
            "vmovdqu ymm13, [{b} + ", $db, " + 32]\n",
            "vpshufb ymm12, ymm12, [{c} + 32]\n",
            "vpshufb ymm13, ymm13, [{c} + 32]\n",
            $(row!($r, $da1), "\n",)*
        )
    };
}

/// The whole loop of one half-panel for the rows listed: zero the 12 accumulators,
/// then four loops, each skipped when its count is 0: `u1` iterations of two pairs
/// that also ask for the next panel's lines, `n1` single such pairs, `u2` iterations
/// of two pairs that do not, `n2` single pairs. The accumulators come out in `acc0`,
/// `acc1`.
macro_rules! pairs {
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
            pair!("0", "0", "4", $($r)*),
            pair!("128", "8", "12", $($r)*),
            "add {next}, 128",
            "add {b}, 256",
            "add {p0}, 16",
            "add {p3}, 16",
            "dec {u1}",
            "jnz 2b",
            "3:",
            "test {n1}, {n1}",
            "jz 5f",
            "prefetcht1 [{next}]",
            pair!("0", "0", "4", $($r)*),
            "add {next}, 64",
            "add {b}, 128",
            "add {p0}, 8",
            "add {p3}, 8",
            "5:",
            "test {u2}, {u2}",
            "jz 7f",
            ".p2align 5",
            "6:",
            pair!("0", "0", "4", $($r)*),
            pair!("128", "8", "12", $($r)*),
            "add {b}, 256",
            "add {p0}, 16",
            "add {p3}, 16",
            "dec {u2}",
            "jnz 6b",
            "7:",
            "test {n2}, {n2}",
            "jz 9f",
            pair!("0", "0", "4", $($r)*),
            "9:",
            // Operands a short tile does not name.
            "/* {lda} {p3} */",
            b = inout(reg) $o.b => _,
            p0 = inout(reg) $o.rows[0] => _,
            p3 = inout(reg) $o.rows[1] => _,
            lda = in(reg) $o.lda,
            c = in(reg) WIDEN.0.as_ptr(),
            u1 = inout(reg) $o.counts[0] => _,
            n1 = in(reg) $o.counts[1],
            u2 = inout(reg) $o.counts[2] => _,
            n2 = in(reg) $o.counts[3],
            next = inout(reg) $o.next => _,
            l1 = const L1_AHEAD,
            out("ymm0") $o.acc0[0], out("ymm1") $o.acc1[0],
            out("ymm2") $o.acc0[1], out("ymm3") $o.acc1[1],
            out("ymm4") $o.acc0[2], out("ymm5") $o.acc1[2],
            out("ymm6") $o.acc0[3], out("ymm7") $o.acc1[3],
            out("ymm8") $o.acc0[4], out("ymm9") $o.acc1[4],
            out("ymm10") $o.acc0[5], out("ymm11") $o.acc1[5],
            out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
            options(nostack, readonly),
        )
    };
}

/// The loop's operands, in bytes where they are strides.
struct Operands {
    b: *const u32,
    /// Rows 0 and 3 of the left operand (pointers only computed, never read, for rows
    /// a short tile does not have).
    rows: [*const f32; 2],
    lda: usize,
    /// The four loops' counts (see `pairs!`).
    counts: [usize; 4],
    next: *const u8,
    acc0: [__m256; AVX2_ROWS],
    acc1: [__m256; AVX2_ROWS],
}

/// The tile on AVX2: `R × 2` accumulators per half-panel, two pairs of `k` per
/// iteration.
///
/// # Safety
///
/// The CPU has AVX2 and FMA; `1 <= R <= 6`; `t.k >= 1` and `t.b` holds at least
/// `ceil(t.k / 2) * NR` pairs; `t.a` holds more than `(R - 1) * t.lda + t.k - 1`
/// elements; `dst` is valid for writes of `(R - 1) * ldc + j0 + width` elements
/// (`t.at`), of which nobody else reads or writes the tile's during the call, and
/// `1 <= width <= NR`; every step of `t.epilogue` has the tile's rows' columns
/// `j0..j0 + width` inside its operand (for a `Operand::Rows`, rows `row0..row0 + R`).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const R: usize>(t: &Wide<'_>, dst: *mut f32) {
    let a = t.a.as_ptr();
    let whole = t.k / 2;
    let mut next = t.next;
    // The loops ask for one line of the next panel a step.
    debug_assert!(next.per == 1 || next.steps == 0);
    for half in 0..2 {
        let width = t.at.width.saturating_sub(16 * half).min(16);
        if width == 0 {
            break;
        }
        let n1 = next.steps.min(whole);
        let n2 = whole - n1;
        let mut o = Operands {
            b: t.b.as_ptr().wrapping_add(16 * half),
            rows: [0, 3].map(|i| a.wrapping_add(i * t.lda)),
            lda: t.lda * 4,
            counts: [n1 / 2, n1 % 2, n2 / 2, n2 % 2],
            next: next.at,
            acc0: [_mm256_setzero_ps(); AVX2_ROWS],
            acc1: [_mm256_setzero_ps(); AVX2_ROWS],
        };
        next = next.after(n1);
        // SAFETY: pair q (q < k / 2, the loops' counts add up to k / 2) reads the
        // half-panel's b[q * NR + 16 * half..][..16], inside `t.b` (ceil(k / 2) * NR
        // pairs), and a[i * lda + 2q], a[i * lda + 2q + 1] for the listed rows i < R
        // only, inside `t.a` (2q + 1 <= k - 1; the row's last element is at
        // (R - 1) * lda + k - 1 or before its end); `WIDEN` holds the 64 bytes read at
        // `c`. Base pointers of rows past R are moved on but never read. The prefetches
        // are hints: they read nothing and cannot fault, whatever the address. The asm
        // writes only the registers it declares and no memory.
        unsafe {
            match R {
                1 => pairs!(o, 0),
                2 => pairs!(o, 0 1),
                3 => pairs!(o, 0 1 2),
                4 => pairs!(o, 0 1 2 3),
                5 => pairs!(o, 0 1 2 3 4),
                6 => pairs!(o, 0 1 2 3 4 5),
                _ => unreachable!("an AVX2 tile has 1 to 6 rows"),
            }
        }
        if t.k % 2 == 1 {
            // SAFETY: pair `whole` = ceil(k / 2) - 1 is inside `t.b`; element k - 1 of
            // rows i < R inside `t.a` (the caller's bounds, as above).
            unsafe { last::<R>(t, half, &mut o.acc0, &mut o.acc1) };
        }
        // SAFETY: the caller's contract: the epilogue's operands and `dst` hold the
        // tile's rows' columns of `t.at` (this half's among them).
        unsafe { finish::<R>((t.epilogue, t.row0, t.at), half, o.acc0, o.acc1, dst) };
    }
}

/// The step of an odd `k`'s last element: the low halves of the last pair (whose high
/// halves are the packing's zeros) by each row's element `k - 1`.
///
/// # Safety
///
/// The CPU has AVX2 and FMA; `t.b` holds `ceil(t.k / 2) * NR` pairs, `half < 2`, and
/// `t.a` holds element `t.k - 1` of rows `0..R` (at `i * t.lda`).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn last<const R: usize>(
    t: &Wide<'_>,
    half: usize,
    acc0: &mut [__m256; AVX2_ROWS],
    acc1: &mut [__m256; AVX2_ROWS],
) {
    // SAFETY: the caller's contract: the 16 pairs of the last row of the half-panel
    // and the rows' elements k - 1 are inside `t.b` and `t.a`.
    unsafe {
        let w = t.b.as_ptr().add((t.k / 2) * NR + 16 * half);
        let lo0 = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_loadu_si256(w.cast())));
        let lo1 = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_loadu_si256(w.add(8).cast())));
        for i in 0..R {
            let x = _mm256_set1_ps(*t.a.as_ptr().add(i * t.lda + t.k - 1));
            acc0[i] = _mm256_fmadd_ps(x, lo0, acc0[i]);
            acc1[i] = _mm256_fmadd_ps(x, lo1, acc1[i]);
        }
    }
}

/// The widening controls' bytes (for the tests).
#[cfg(test)]
pub(super) fn controls() -> [u8; 64] {
    WIDEN.0
}

/// Widens the panel at `b` (`ceil(k / 2) * NR` pairs) into `k * NR` f32 at `wide`:
/// row `p` of the panel at `p * NR` (the low halves of pair row `q` are row `2q`, the
/// high halves row `2q + 1`).
///
/// # Safety
///
/// The CPU has AVX2; `b` is valid for reads of `ceil(k / 2) * NR` pairs and `wide`
/// for writes of `k * NR` elements.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn widen_panel(b: *const u32, k: usize, wide: *mut u32) {
    let top = _mm256_set1_epi32(0xffff_0000_u32 as i32);
    for q in 0..k.div_ceil(2) {
        for v in 0..NR / 8 {
            // SAFETY: q < ceil(k / 2): pairs q * NR + 8v.. + 8 are inside `b`; row 2q
            // (< k) and, when 2q + 1 < k, row 2q + 1 of `wide` are inside it.
            unsafe {
                let x = _mm256_loadu_si256(b.add(q * NR + 8 * v).cast());
                let lo = wide.add(2 * q * NR + 8 * v).cast();
                _mm256_storeu_si256(lo, _mm256_slli_epi32::<16>(x));
                if 2 * q + 1 < k {
                    let hi = wide.add((2 * q + 1) * NR + 8 * v).cast();
                    _mm256_storeu_si256(hi, _mm256_and_si256(x, top));
                }
            }
        }
    }
}
