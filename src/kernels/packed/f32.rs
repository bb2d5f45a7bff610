//! The f32 tile: up to [`MR`] rows by one panel of [`NR`] columns, on AVX-512.
//!
//! `MR × 2` accumulators; per step of `k`, two vector loads of the panel and one
//! broadcast of each row's element of the left operand, read in place.
//!
//! While the row blocks of one panel multiply it, they ask for the **next panel**, a
//! cache line or two a step, into L2 ([`NextPanel`]): the first block of a panel reads
//! it from L3 or DRAM, and without the hint it waited on that stream while the blocks
//! after it found the panel in L2 and asked for nothing. Spread over the blocks, the
//! stream is as even as the arithmetic. Each step also asks for the current panel's
//! lines [`L1_AHEAD`] bytes on into L1, so the loads of the panel, now mostly from L2,
//! do not wait on it either.
//!
//! Given an [`Epilogue`] (a bias, a residual, GELU: a chain's element-wise program
//! after its product), the tile applies it to its accumulators before it stores them,
//! each step the operation the program would do on the finished sums, so the bits are
//! the program's, without its pass over the output.

use super::{by_rows, Cols, Epilogue, Matrix, Out, Part, Step, MR, NR};

/// Computes `part` of the product of `g` by the f32 panels `data`, followed by
/// `epilogue`: panel by panel, and in each panel row block by row block (so a panel
/// stays in L2 while every row block reads it).
pub(super) fn part(g: Matrix<'_>, data: &[f32], epilogue: Epilogue<'_>, part: Part, out: Out) {
    let k = g.k;
    let blocks = (part.rows.1 - part.rows.0).div_ceil(MR);
    for pj in part.panels.0..part.panels.1 {
        let b = &data[pj * k * NR..(pj + 1) * k * NR];
        let next = b.as_ptr().wrapping_add(k * NR).cast::<u8>();
        let at = part.cols(pj);
        let mut bi = 0;
        Part::blocks(part.rows.0, part.rows.1 - part.rows.0, |r0, h| {
            let t = Tile {
                a: &g.a[r0 * g.lda..],
                lda: g.lda,
                cs: g.cs,
                k,
                b,
                at,
                row0: r0,
                epilogue,
                next: NextPanel::share(next, k, bi, blocks),
            };
            bi += 1;
            tile(&t, h, out.skip(r0 * part.n));
        });
    }
}

/// One tile's operands: rows of `a` (element `(i, p)` at `i * lda + p * cs`), the
/// panel `b` (`k` rows of [`NR`]), where the results go (`at`; the tile's first row
/// is row `row0` of the product, which the epilogue's residuals are indexed by) and
/// what happens to them before.
struct Tile<'a> {
    a: &'a [f32],
    lda: usize,
    cs: usize,
    k: usize,
    b: &'a [f32],
    at: Cols,
    row0: usize,
    epilogue: Epilogue<'a>,
    // Read by the AVX-512 tile, the only one so far.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    next: NextPanel,
}

/// The cache lines of the next panel one row block asks for while it multiplies the
/// current panel: `per` lines a step from `at`, in its first `steps` steps. A panel
/// of `k` steps is `2k` lines (128 bytes a step); a lone block asks for two lines a
/// step, otherwise the first blocks ask for one line a step each until the panel is
/// covered (two blocks cover it; the rest ask for nothing).
///
/// Measured against asking for the two lines 4 KiB ahead of the current step (what
/// every tile did before; the bf16 and int8 tiles still do), on this project's 2-core
/// Xeon: a pass over MiniLM's 24 weights at 28 rows (both schemes alternated in one
/// process, medians of 21) 125 → 146 GFLOP/s on one thread, 227 rows 128 → 137, 896
/// rows 131 → 135; all-MiniLM-L6-v2 one sentence a call (binaries alternated, 8
/// pairs): p50 paired ratio 0.966; batches of 32: 0.99 (5 pairs, no change).
#[derive(Clone, Copy)]
// Read by the AVX-512 tile, the only one so far.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct NextPanel {
    at: *const u8,
    per: usize,
    steps: usize,
}

impl NextPanel {
    /// Row block `bi` of `blocks`' share of the next panel, which starts at `next` (a
    /// pointer only hinted at, never read: past the last panel it points nowhere).
    fn share(next: *const u8, k: usize, bi: usize, blocks: usize) -> NextPanel {
        let lines = 2 * k;
        let per = if blocks == 1 { 2 } else { 1 };
        let start = (bi * k * per).min(lines);
        NextPanel {
            at: next.wrapping_add(start * 64),
            per,
            steps: (lines - start) / per,
        }
    }
}

/// How far ahead of the step being multiplied a tile asks for its own panel's two
/// lines into L1 (8 steps). With the next panel already coming into L2
/// ([`NextPanel`]), measured in one process against no such hint: a pass over MiniLM's
/// 24 weights on one thread 14 rows 120 → 131 GFLOP/s, 20 rows 125 → 136, 36 rows 130
/// → 137, 227 rows 140 → 146, 896 rows 143 → 144 (medians of 21); all-MiniLM-L6-v2 one
/// sentence a call, the two alternated sentence by sentence over the corpus three
/// times: p50 3.28 → 3.18 ms, median paired ratio 0.974 (1 and 4 KiB: 0.971, 0.973).
/// 1 KiB rather than 2 since the arena is cache-line aligned and the epilogue runs in
/// the tile: alternated batch by batch in one process, batches of 32 on two kernel
/// threads 553.6 → 559.3 and 552.5 → 566.4 sentences/s (one thread 285.4 → 285.4),
/// one sentence a call p50 2.311 → 2.268 ms; binaries alternated, one sentence a call
/// p50 2.252 → 2.216, 2.248 → 2.205, 2.235 → 2.265 ms, batches of 32 on two streams
/// 567.4 → 570.7, 573.3 → 571.9, 569.2 → 570.7.
#[cfg(target_arch = "x86_64")]
const L1_AHEAD: usize = 1024;

/// `dst[i][j0..j0 + width] = a[i] · b` for the tile's `rows` rows.
fn tile(t: &Tile<'_>, rows: usize, dst: Out) {
    macro_rules! call {
        ($r:literal) => {
            checked::<$r>(t, dst)
        };
    }
    by_rows!(rows, call!())
}

/// Checks the bounds the assembly relies on, then runs it for `R` rows.
fn checked<const R: usize>(t: &Tile<'_>, dst: Out) {
    // The bounds every access below relies on, checked once (a failed check is a bug of
    // this module, caught at the kernel boundary as a panic).
    let w = t.at;
    assert!(R >= 1 && R <= MR && w.width >= 1 && w.width <= NR);
    assert!(t.b.len() >= t.k * NR);
    assert!(t.k >= 1 && t.a.len() > (R - 1) * t.lda + (t.k - 1) * t.cs);
    assert!(dst.len >= (R - 1) * w.ldc + w.j0 + w.width);
    for step in t.epilogue {
        match *step {
            Step::Columns { values, .. } => assert!(values.len() >= w.j0 + w.width),
            Step::Rows {
                data,
                offset,
                stride,
                ..
            } => assert!(super::rows_end(offset + w.j0, stride, t.row0 + R, w.width)
                .is_some_and(|end| end <= data.len())),
            Step::Gelu => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            super::has_avx512(),
            "the f32 packed kernel runs only on AVX-512"
        );
        // SAFETY: AVX-512F is present (asserted), the asserts above are the bounds
        // `avx512::tile` documents, and this tile's elements of `dst` are written by no
        // one else (see `Out`).
        unsafe { avx512::tile::<R>(t, dst.ptr) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("PackedRhs::pack gives None without AVX-512");
}

/// The tile's loop in assembly.
///
/// Written by hand because of the left operand's addresses: the compiler kept one
/// pointer a row and spent an integer add or `lea` on nearly every row of every step,
/// on the ports the multiplies need. Here four base pointers reach all 14 rows
/// through the scaled index (`row!`), so a step is two loads of the panel, a broadcast
/// and two multiplies a row, and five adds. Measured against the intrinsics loop it
/// replaced (the same instructions otherwise, and the same bits), alternated in one
/// process, medians of 11, one thread: 28 × 384 × 1152 175 → 185 GFLOP/s, 227 × 384 ×
/// 1152 161 → 174, 682 × 1536 × 384 160 → 175, 896 × 384 × 1536 142 → 153; two
/// threads, 896 × 384 × 1536 287 → 319.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Step, Tile, L1_AHEAD};
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
    /// (for a [`Step::Rows`], rows `row0..row0 + R`).
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
            (
                _mm512_maskz_loadu_ps(m0, at),
                _mm512_maskz_loadu_ps(m1, at.wrapping_add(16)),
            )
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
                Step::Columns { values, sum_first } => {
                    // SAFETY: `values` holds the tile's columns j0..j0 + width (the
                    // caller's contract).
                    let (v0, v1) = unsafe { load(values.as_ptr().add(t.at.j0)) };
                    for i in 0..R {
                        acc0[i] = add(acc0[i], v0, sum_first);
                        acc1[i] = add(acc1[i], v1, sum_first);
                    }
                }
                Step::Rows {
                    data,
                    offset,
                    stride,
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
}

#[cfg(test)]
mod tests {
    use super::super::{has_avx512, matmul_packed, matmul_packed_epilogue, PackedRhs, Step, MR};
    use crate::kernels::testutil::*;
    use crate::kernels::Par;
    use crate::Layout;

    /// `a · b` as a scalar loop that fuses each multiply-add, `p` in order from 0:
    /// the tile's arithmetic exactly, so its results must have the same bits.
    fn fused_in_order(a: &[f32], al: &Layout, b: &[f32], k: usize, n: usize) -> Vec<f32> {
        let (m, rs, cs) = (al.dims[0], al.strides[0], al.strides[1]);
        let mut out = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).fold(0.0f32, |acc, p| {
                    a[al.offset + i * rs + p * cs].mul_add(b[p * n + j], acc)
                });
            }
        }
        out
    }

    /// Every row count a tile can have (each reached through its own base pointer and
    /// scaled index in the assembly), ragged panels, left operands with contiguous,
    /// padded and transposed rows, one and two threads: the same bits as the scalar
    /// loop, so a wrong row address or a skipped step cannot hide in a tolerance.
    #[test]
    fn every_row_of_every_tile_gives_the_bits_of_fused_multiply_adds() {
        if !has_avx512() {
            return;
        }
        let mut rng = Rng::new(93);
        for m in (1..=2 * MR + 2).chain([57]) {
            for (k, n) in [(1, 1), (3, 33), (17, 32), (70, 95)] {
                let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
                let packed = PackedRhs::pack(&b, &Layout::contiguous(&[k, n])).unwrap();
                let a: Vec<f32> = (0..m * (k + 5) + 3).map(|_| rng.f32()).collect();
                let layouts = [
                    Layout::contiguous(&[m, k]),
                    Layout {
                        dims: vec![m, k].into(),
                        strides: vec![k + 5, 1].into(),
                        offset: 3,
                    },
                    Layout::contiguous(&[k, m]).permute(&[1, 0]),
                ];
                for al in &layouts {
                    let want = fused_in_order(&a, al, &b, k, n);
                    for threads in [1, 2] {
                        let mut out = vec![f32::NAN; m * n];
                        matmul_packed(&a, al, &packed, &mut out, Par { threads }).unwrap();
                        let same = same_bits(&out, &want);
                        assert!(same, "m {m} k {k} n {n} layout {al:?} threads {threads}");
                    }
                }
            }
        }
    }

    /// An epilogue (a bias, a residual with padded rows at an offset, GELU, the adds'
    /// operands in both orders) applied in the tile gives the bits of the same steps
    /// applied after the product, for every tile height, ragged panels and rows split
    /// between threads (so tiles start at rows other than 0); a residual too short for
    /// the product is an error, not a read out of bounds.
    #[test]
    fn an_epilogue_in_the_tile_gives_the_bits_of_the_steps_after_the_product() {
        if !has_avx512() {
            return;
        }
        let mut rng = Rng::new(94);
        for m in (1..=2 * MR + 2).chain([57]) {
            for (k, n) in [(1, 5), (3, 33), (70, 95)] {
                let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
                let packed = PackedRhs::pack(&b, &Layout::contiguous(&[k, n])).unwrap();
                let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
                let al = Layout::contiguous(&[m, k]);
                let bias: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
                let (offset, stride) = (7, n + 3);
                let res: Vec<f32> = (0..offset + m * stride).map(|_| rng.f32()).collect();
                let rows = |sum_first| Step::Rows {
                    data: &res,
                    offset,
                    stride,
                    sum_first,
                };
                let columns = |sum_first| Step::Columns {
                    values: &bias,
                    sum_first,
                };
                let epilogues: [&[Step<'_>]; 3] = [
                    &[columns(true)],
                    &[columns(false), Step::Gelu],
                    &[columns(true), rows(false), Step::Gelu, rows(true)],
                ];
                let mut product = vec![0.0f32; m * n];
                matmul_packed(&a, &al, &packed, &mut product, Par::serial()).unwrap();
                for (e, epilogue) in epilogues.into_iter().enumerate() {
                    let want: Vec<f32> = product
                        .iter()
                        .enumerate()
                        .map(|(e, &x)| {
                            let (i, j) = (e / n, e % n);
                            epilogue.iter().fold(x, |acc, s| s.apply_scalar(acc, i, j))
                        })
                        .collect();
                    for threads in [1, 2] {
                        let mut out = vec![f32::NAN; m * n];
                        let par = Par { threads };
                        let done =
                            matmul_packed_epilogue(&a, &al, &packed, epilogue, &mut out, par)
                                .unwrap();
                        assert!(done);
                        let same = same_bits(&out, &want);
                        assert!(same, "m {m} k {k} n {n} epilogue {e} threads {threads}");
                    }
                }
                let short = [Step::Rows {
                    data: &res[..offset + (m - 1) * stride + n - 1],
                    offset,
                    stride,
                    sum_first: true,
                }];
                let mut out = vec![0.0f32; m * n];
                let err = matmul_packed_epilogue(&a, &al, &packed, &short, &mut out, Par::serial())
                    .unwrap_err();
                assert!(err.to_string().contains("a residual of"), "{err}");
            }
        }
    }
}
