//! The f32 tile: up to a tier's rows by one panel of [`NR`] columns, on AVX-512
//! (module `avx512`: 14 rows, `MR × 2` accumulators) or on AVX2 with FMA (module
//! `avx2`: 6 rows, the panel's two halves of 16 columns one after the other, 12
//! accumulators). Per step of `k` a tile loads the panel's vectors and broadcasts each
//! row's element of the left operand, read in place; every accumulator is one chain of
//! fused multiply-adds in the order of `k`, so both tiers give the same bits.
//!
//! This module owns what the tiers share: the walk over a part's panels and row blocks
//! ([`part`]), the bounds every tile relies on (checked once per tile), the next
//! panel's prefetch ([`NextPanel`]) and the epilogue's operands.
//!
//! While the row blocks of one panel multiply it, they ask for the **next panel**, a
//! cache line or two a step, into L2 ([`NextPanel`]): the first block of a panel reads
//! it from L3 or DRAM, and without the hint it waited on that stream while the blocks
//! after it found the panel in L2 and asked for nothing. Spread over the blocks, the
//! stream is as even as the arithmetic. Each step also asks for the current panel's
//! lines a little ahead into L1 ([`L1_AHEAD`] on AVX-512), so the loads of the panel,
//! now mostly from L2, do not wait on it either.
//!
//! Given an [`Epilogue`] (a bias, a residual, GELU: a chain's element-wise program
//! after its product), the tile applies it to its accumulators before it stores them,
//! each step the operation the program would do on the finished sums, so the bits are
//! the program's, without its pass over the output.

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

use super::{by_rows, Cols, Epilogue, Matrix, Operand, Out, Part, Step, MR, NR};
use crate::kernels::cpu;

/// The f32 tiles, one per instruction set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isa {
    /// 14 rows × 32 columns on AVX-512 (module `avx512`).
    Avx512,
    /// 6 rows × 16 columns, twice per panel, on AVX2 with FMA (module `avx2`).
    Avx2,
    /// Up to 14 rows, as groups of at most 6 by half a panel, on aarch64 NEON (module
    /// `neon`).
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Isa {
    /// The tile the tier in use runs, or `None` where none does (then nothing is
    /// packed in f32: `PackedRhs::pack` asks this).
    pub(super) fn here() -> Option<Isa> {
        #[cfg(target_arch = "aarch64")]
        if cpu::has_neon() {
            return Some(Isa::Neon);
        }
        if cpu::has_avx512() {
            Some(Isa::Avx512)
        } else if cpu::has_avx2() {
            Some(Isa::Avx2)
        } else {
            None
        }
    }

    /// The tile's name, for plan listings.
    pub(super) fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512 14x32",
            Isa::Avx2 => "avx2 6x16",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "neon 6x16",
        }
    }

    /// The most rows of one tile.
    pub(super) fn rows(self) -> usize {
        match self {
            Isa::Avx512 => MR,
            Isa::Avx2 => AVX2_ROWS,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => MR,
        }
    }

    /// Whether this CPU has the tile's instructions (whatever tier is forced: the
    /// tests run each tile the CPU has).
    fn runs(self) -> bool {
        match self {
            Isa::Avx512 => cpu::cpu_runs(cpu::Tier::Avx512),
            Isa::Avx2 => cpu::cpu_runs(cpu::Tier::Avx2),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => cpu::cpu_runs(cpu::Tier::Neon),
        }
    }
}

/// Rows of the AVX2 tile: 6 rows × 2 vectors of 8 columns are 12 of the 16 `ymm`
/// registers, with two for the panel's vectors and two for the broadcasts.
pub(super) const AVX2_ROWS: usize = 6;

/// Computes `part` of the product of `g` by the f32 panels `data`, followed by
/// `epilogue`, with the tile of the tier in use.
pub(super) fn part(g: Matrix<'_>, data: &[f32], epilogue: Epilogue<'_>, part: Part, out: Out) {
    let isa = Isa::here().expect("f32 panels are packed only where an f32 tile runs");
    part_on(isa, g, data, epilogue, part, out)
}

/// [`part`] with the tile of `isa`: panel by panel, and in each panel row block by row
/// block (so a panel stays in L2 while every row block reads it).
fn part_on(isa: Isa, g: Matrix<'_>, data: &[f32], epilogue: Epilogue<'_>, part: Part, out: Out) {
    let k = g.k;
    for pj in part.panels.0..part.panels.1 {
        let b = &data[pj * k * NR..(pj + 1) * k * NR];
        let next = b.as_ptr().wrapping_add(k * NR).cast::<u8>();
        let rows = (part.rows.0, part.rows.1 - part.rows.0);
        panel_on(
            isa,
            (g, 0),
            b,
            part.cols(pj),
            rows,
            epilogue,
            (next, 2 * k),
            part.n,
            out,
        );
    }
}

/// The row blocks of one panel `b` (columns `at`) on `isa`'s tile: rows
/// `first..first + count` of the product, whose row `base` is `g`'s first, each block
/// asking for its share of the `lines` cache lines of the next panel at `next`.
#[allow(clippy::too_many_arguments)]
pub(super) fn panel_on(
    isa: Isa,
    (g, base): (Matrix<'_>, usize),
    b: &[f32],
    at: Cols,
    (first, count): (usize, usize),
    epilogue: Epilogue<'_>,
    (next, lines): (*const u8, usize),
    n: usize,
    out: Out,
) {
    let k = g.k;
    let rows = isa.rows();
    let blocks = count.div_ceil(rows);
    // Each step of the AVX-512 tile reads the panel's two lines of a row of `k`; the
    // AVX2 tile reads one, twice as many steps.
    let steps = match isa {
        Isa::Avx2 => 2 * k,
        _ => k,
    };
    let mut bi = 0;
    Part::blocks_of(rows, first, count, |r0, h| {
        let t = Tile {
            a: &g.a[(r0 - base) * g.lda..],
            lda: g.lda,
            cs: g.cs,
            k,
            b,
            at,
            row0: r0,
            epilogue,
            next: NextPanel::share(next, lines, steps, bi, blocks),
        };
        bi += 1;
        tile(isa, &t, h, out.skip(r0 * n));
    });
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
    // Read by the x86 tiles, the only ones so far.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    next: NextPanel,
}

/// The cache lines of the next panel one row block asks for while it multiplies the
/// current panel: `per` lines a step from `at`, in its first `steps` steps. A panel
/// of `k` rows is `2k` lines; a lone block asks for as many lines a step as cover the
/// panel in its steps (two on AVX-512, whose step reads a row of the panel; one on
/// AVX2, whose step reads half of one), otherwise the first blocks ask for half that
/// (at least one line a step) until the panel is covered (on AVX-512 two blocks cover
/// it, on AVX2 one; the rest ask for nothing).
///
/// Measured against asking for the two lines 4 KiB ahead of the current step (what
/// every tile did before; the bf16 and int8 tiles still do), on this project's 2-core
/// Xeon: a pass over MiniLM's 24 weights at 28 rows (both schemes alternated in one
/// process, medians of 21) 125 → 146 GFLOP/s on one thread, 227 rows 128 → 137, 896
/// rows 131 → 135; all-MiniLM-L6-v2 one sentence a call (binaries alternated, 8
/// pairs): p50 paired ratio 0.966; batches of 32: 0.99 (5 pairs, no change).
///
/// On the 2-core Zen 5 EPYC, one thread, a pass over MiniLM's four weight shapes (a
/// bias, GELU after `[384, 1536]`), with and without the hint alternated in one
/// process (10th percentiles): without it 42 rows a call 241.0 → 238.3 GFLOP/s, 56
/// rows 239.0 → 232.9, 170 rows 238.7 → 229.9. Asking with `prefetcht0` or
/// `prefetcht2` instead, or having the last panel ask for the part's first (where the
/// next row panel of a chain starts), measured the same as this (within 1%).
#[derive(Clone, Copy)]
// Read by the x86 tiles, the only ones so far.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct NextPanel {
    /// The first line to ask for.
    pub(super) at: *const u8,
    /// Lines a step.
    pub(super) per: usize,
    /// Steps that ask for lines.
    pub(super) steps: usize,
}

impl NextPanel {
    /// Row block `bi` of `blocks`' share of the next panel's `lines` cache lines,
    /// which start at `next` (a pointer only hinted at, never read: past the last
    /// panel it points nowhere), for a block of `steps` steps.
    pub(super) fn share(
        next: *const u8,
        lines: usize,
        steps: usize,
        bi: usize,
        blocks: usize,
    ) -> NextPanel {
        let per = if blocks == 1 {
            lines.div_ceil(steps)
        } else {
            lines.div_ceil(2 * steps).max(1)
        };
        let start = (bi * steps * per).min(lines);
        NextPanel {
            at: next.wrapping_add(start * 64),
            per,
            steps: ((lines - start) / per).min(steps),
        }
    }

    /// The share left after `done` steps.
    #[cfg(any(test, target_arch = "x86_64"))]
    pub(super) fn after(self, done: usize) -> NextPanel {
        let done = done.min(self.steps);
        NextPanel {
            at: self.at.wrapping_add(done * self.per * 64),
            per: self.per,
            steps: self.steps - done,
        }
    }
}

/// How far ahead of the step being multiplied the AVX-512 tile asks for its own
/// panel's two lines into L1 (8 steps). With the next panel already coming into L2
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
/// 567.4 → 570.7, 573.3 → 571.9, 569.2 → 570.7. On the 2-core Zen 5 EPYC it neither
/// helps nor hurts (without it, alternated in one process: 42 to 448 rows a call, the
/// same GFLOP/s within 0.2%).
#[cfg(target_arch = "x86_64")]
const L1_AHEAD: usize = 1024;

/// Asserts that every step of `epilogue` holds the columns `at` of the product's rows
/// before `end` (the bounds a tile that applies it relies on).
pub(super) fn check_epilogue(epilogue: Epilogue<'_>, at: Cols, end: usize) {
    for step in epilogue {
        match *step {
            Step::Add {
                operand: Operand::Columns(values),
                ..
            } => assert!(values.len() >= at.j0 + at.width),
            Step::Add {
                operand:
                    Operand::Rows {
                        data,
                        offset,
                        stride,
                    },
                ..
            } => assert!(super::rows_end(offset + at.j0, stride, end, at.width)
                .is_some_and(|e| e <= data.len())),
            Step::Gelu => {}
        }
    }
}

/// `dst[i][j0..j0 + width] = a[i] · b` for the tile's `rows` rows, on `isa`.
fn tile(isa: Isa, t: &Tile<'_>, rows: usize, dst: Out) {
    macro_rules! call {
        ($r:literal) => {
            checked::<$r>(isa, t, dst)
        };
    }
    by_rows!(rows, call!())
}

/// Checks the bounds the assembly relies on, then runs `isa`'s tile for `R` rows.
fn checked<const R: usize>(isa: Isa, t: &Tile<'_>, dst: Out) {
    // The bounds every access below relies on, checked once (a failed check is a bug of
    // this module, caught at the kernel boundary as a panic).
    let w = t.at;
    assert!(R >= 1 && R <= isa.rows() && w.width >= 1 && w.width <= NR);
    assert!(t.b.len() >= t.k * NR);
    assert!(t.k >= 1 && t.a.len() > (R - 1) * t.lda + (t.k - 1) * t.cs);
    assert!(dst.len >= (R - 1) * w.ldc + w.j0 + w.width);
    check_epilogue(t.epilogue, w, t.row0 + R);
    assert!(isa.runs(), "this CPU has no {isa:?} f32 tile");
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the CPU has AVX-512F (asserted), the asserts above are the bounds
        // the tiles document, and this tile's elements of `dst` are written by no one
        // else (see `Out`).
        Isa::Avx512 => unsafe { avx512::tile::<R>(t, dst.ptr) },
        // SAFETY: as for AVX-512 just above, the CPU having AVX2 and FMA.
        Isa::Avx2 => unsafe { avx2::tile::<R>(t, dst.ptr) },
    }
    #[cfg(target_arch = "aarch64")]
    match isa {
        // SAFETY: the asserts above are the bounds `neon::tile` documents (NEON is part
        // of every aarch64 target), and this tile's elements of `dst` are written by
        // no one else (see `Out`).
        Isa::Neon => unsafe { neon::tile::<R>(t, dst.ptr) },
        _ => unreachable!("only the NEON f32 tile runs on aarch64"),
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    unreachable!("PackedRhs::pack gives None without an f32 tile");
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{
        matmul_packed, matmul_packed_epilogue, pack_panels, PackedRhs, Panels, Step,
    };
    use super::*;
    use crate::kernels::testutil::*;
    use crate::kernels::Par;
    use crate::Layout;

    /// `a · b` as a scalar loop that fuses each multiply-add, `p` in order from 0:
    /// the tiles' arithmetic exactly, so their results must have the same bits.
    pub(in crate::kernels::packed) fn fused_in_order(
        a: &[f32],
        al: &Layout,
        b: &[f32],
        k: usize,
        n: usize,
    ) -> Vec<f32> {
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

    /// Three layouts of an `[m, k]` left operand in a buffer of `m * (k + 5) + 3`
    /// elements: contiguous rows, rows `k + 5` apart from offset 3, and the transpose
    /// of a contiguous `[k, m]` (column stride `m`).
    pub(in crate::kernels::packed) fn left_layouts(m: usize, k: usize) -> [Layout; 3] {
        [
            Layout::contiguous(&[m, k]),
            Layout {
                dims: vec![m, k].into(),
                strides: vec![k + 5, 1].into(),
                offset: 3,
            },
            Layout::contiguous(&[k, m]).permute(&[1, 0]),
        ]
    }

    /// The tiles this CPU has, whatever tier is forced.
    fn isas() -> Vec<Isa> {
        [
            Isa::Avx512,
            Isa::Avx2,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon,
        ]
        .into_iter()
        .filter(|i| i.runs())
        .collect()
    }

    /// The product of the matrix `al` reads from `a` by `packed`, followed by
    /// `epilogue`, on `isa`'s tile (see [`in_four_parts`]).
    fn direct(
        isa: Isa,
        a: &[f32],
        al: &Layout,
        packed: &PackedRhs,
        epilogue: Epilogue<'_>,
    ) -> Vec<f32> {
        let Panels::F32(data) = &packed.panels else {
            panic!("an f32 matrix")
        };
        in_four_parts(a, al, packed.n, |g, part, out| {
            part_on(isa, g, data, epilogue, part, out)
        })
    }

    /// The `[m, n]` product of the matrix `al` reads from `a` (`[m, k]`), each part
    /// computed by `run(g, part, out)`, in four parts as two threads would split it (the
    /// first and last rows, by the first and last panels), so tiles start at rows and
    /// panels other than the first; elements no part writes stay NaN.
    pub(in crate::kernels::packed) fn in_four_parts(
        a: &[f32],
        al: &Layout,
        n: usize,
        run: impl Fn(Matrix<'_>, Part, Out),
    ) -> Vec<f32> {
        let (m, k) = (al.dims[0], al.dims[1]);
        let lda = if m > 1 { al.strides[0] } else { 0 };
        let cs = if k > 1 { al.strides[1] } else { 1 };
        let g = Matrix {
            a: &a[al.offset..al.offset + (m - 1) * lda + (k - 1) * cs + 1],
            lda,
            cs,
            k,
        };
        let mut dst = vec![f32::NAN; m * n];
        let out = Out::new(&mut dst);
        let (rm, panels) = (m / 2, n.div_ceil(NR));
        let pm = panels / 2;
        for rows in [(0, rm), (rm, m)] {
            for panels in [(0, pm), (pm, panels)] {
                run(g, Part { rows, panels, n }, out);
            }
        }
        dst
    }

    /// Every row count a tile can have (each reached through its own base pointer and
    /// scaled index in the assembly), ragged panels (narrower than one AVX2 half and
    /// than two), left operands with contiguous (the AVX2 tile's four-step loop),
    /// padded and transposed rows, at an offset, on every tile this CPU has and on the
    /// tier's path with one and two threads: the same bits as the scalar loop, so a
    /// wrong row address or a skipped step cannot hide in a tolerance (and the tiles
    /// agree with each other to the bit).
    #[test]
    fn every_row_of_every_tile_gives_the_bits_of_fused_multiply_adds() {
        let mut rng = Rng::new(93);
        for m in (1..=2 * MR + 2).chain([57]) {
            for (k, n) in [(1, 1), (3, 33), (6, 7), (17, 32), (70, 95), (9, 20)] {
                let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
                let packed = pack_panels(&b, &Layout::contiguous(&[k, n])).unwrap();
                let a: Vec<f32> = (0..m * (k + 5) + 3).map(|_| rng.f32()).collect();
                let layouts = left_layouts(m, k);
                for al in &layouts {
                    let want = fused_in_order(&a, al, &b, k, n);
                    for isa in isas() {
                        let out = direct(isa, &a, al, &packed, &[]);
                        let same = same_bits(&out, &want);
                        assert!(same, "{isa:?} m {m} k {k} n {n} layout {al:?}");
                    }
                    if Isa::here().is_none() {
                        continue;
                    }
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
    /// applied after the product, for every tile height, ragged panels and halves,
    /// and tiles starting at rows other than 0, on every tile this CPU has and on the
    /// tier's path with rows split between threads; a residual too short for the
    /// product is an error, not a read out of bounds.
    #[test]
    fn an_epilogue_in_the_tile_gives_the_bits_of_the_steps_after_the_product() {
        let mut rng = Rng::new(94);
        for m in (1..=2 * MR + 2).chain([57]) {
            for (k, n) in [(1, 5), (3, 33), (70, 95), (4, 27)] {
                let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
                let packed = pack_panels(&b, &Layout::contiguous(&[k, n])).unwrap();
                // Some values large enough for GELU's tails.
                let a: Vec<f32> = (0..m * k).map(|_| rng.f32() * 6.0).collect();
                let al = Layout::contiguous(&[m, k]);
                let ops = super::super::tests::EpilogueOperands::new(&mut rng, m, n, 7);
                let (offset, stride) = (ops.offset, ops.stride);
                let epilogues = ops.epilogues();
                let product = fused_in_order(&a, &al, &b, k, n);
                for (e, epilogue) in epilogues.iter().enumerate() {
                    let want = super::super::tests::then(&product, n, epilogue);
                    for isa in isas() {
                        let out = direct(isa, &a, &al, &packed, epilogue);
                        let same = same_bits(&out, &want);
                        assert!(same, "{isa:?} m {m} k {k} n {n} epilogue {e}");
                    }
                    if Isa::here().is_none() {
                        continue;
                    }
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
                let short = [Step::Add {
                    operand: Operand::Rows {
                        data: &ops.res[..offset + (m - 1) * stride + n - 1],
                        offset,
                        stride,
                    },
                    sum_first: true,
                }];
                let mut out = vec![0.0f32; m * n];
                let err = matmul_packed_epilogue(&a, &al, &packed, &short, &mut out, Par::serial())
                    .unwrap_err();
                assert!(err.to_string().contains("a residual of"), "{err}");
            }
        }
    }

    /// How the next panel is shared out: on AVX-512 a lone block asks for two lines a
    /// step, two blocks one each for half the panel; on AVX2 (twice the steps) one
    /// line a step, the first block all of it. Every line is asked for once.
    #[test]
    fn the_next_panel_is_shared_out_once() {
        let k = 10;
        let base = std::ptr::null::<u8>();
        for (steps, blocks, want) in [
            (k, 1, vec![(0, 2, k)]),
            (k, 3, vec![(0, 1, k), (k, 1, k), (2 * k, 1, 0)]),
            (2 * k, 1, vec![(0, 1, 2 * k)]),
            (2 * k, 2, vec![(0, 1, 2 * k), (2 * k, 1, 0)]),
        ] {
            for (bi, &(start, per, n)) in want.iter().enumerate() {
                let s = NextPanel::share(base, 2 * k, steps, bi, blocks);
                assert_eq!((s.at as usize, s.per, s.steps), (start * 64, per, n));
            }
        }
        let s = NextPanel::share(base, 2 * k, 2 * k, 0, 1).after(k);
        assert_eq!((s.at as usize, s.steps), (k * 64, k));
    }
}
