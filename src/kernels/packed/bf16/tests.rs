//! Tests of the bf16 walks and the tiles that take an epilogue: the widening tiles'
//! (AVX2, the AVX-512 f32 tile over widened panels, NEON) bits against fused multiply-adds on the widened weight (with every
//! epilogue), their error bound against the f32 product; the `bfmmla` tile's bound
//! against the product of the rounded operands and its epilogue's bits; each run
//! directly whenever this CPU has it and through `matmul_packed` on the tier in use;
//! non-finite rows.

use super::super::f32::tests::{fused_in_order, in_four_parts, left_layouts};
use super::super::tests::{then, EpilogueOperands};
use super::super::{
    matmul_packed, matmul_packed_epilogue, Epilogue, Operand, PackedRhs, Panels, Step,
};
use super::widen::{STACK_MOST, WIDE_PANEL_ROWS};
use super::*;
use crate::kernels::testutil::*;
use crate::kernels::Par;
use crate::Layout;

/// The product of the matrix `al` reads from `a` by `packed` (bf16 pairs), followed
/// by `epilogue`, on `kernel`, in four parts as two threads would split it
/// (`in_four_parts`).
fn direct(
    kernel: Kernel,
    a: &[f32],
    al: &Layout,
    packed: &PackedRhs,
    epilogue: Epilogue<'_>,
) -> Vec<f32> {
    let Panels::Bf16(data) = &packed.panels else {
        panic!("a bf16 matrix in pairs")
    };
    in_four_parts(a, al, packed.n, |g, part, out| {
        let job = Job {
            kernel,
            data,
            epilogue,
            out,
        };
        part_on(job, g, part)
    })
}

/// Asserts that the product of `al` (`[m, k]` of `a`) by `packed`, followed by
/// `epilogue`, through `matmul_packed_epilogue` on one and two threads, is done and
/// has the bits `want`.
fn the_tier_gives(
    a: &[f32],
    al: &Layout,
    packed: &PackedRhs,
    epilogue: Epilogue<'_>,
    want: &[f32],
    what: &str,
) {
    for threads in [1, 2] {
        let mut out = vec![f32::NAN; want.len()];
        let par = Par { threads };
        let done = matmul_packed_epilogue(a, al, packed, epilogue, &mut out, par).unwrap();
        assert!(done, "{what}");
        assert!(same_bits(&out, want), "{what} threads {threads}");
    }
}

/// Whether `got` and `want` agree bit for bit, any NaN matching any NaN (which NaN an
/// operation on NaNs or infinities gives is not kept).
fn same_or_nan(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

/// Whether the tier in use multiplies bf16 weights on `kernel`.
fn tier_runs(kernel: Kernel) -> bool {
    Kernel::chosen(simd()) == kernel
}

/// The widening tiles this CPU has (AVX2, AVX-512 over widened panels, NEON),
/// whatever tier is forced.
fn widening() -> Vec<Kernel> {
    [Kernel::Avx2, Kernel::Widened512, Kernel::Neon]
        .into_iter()
        .filter(|k| k.runs_here())
        .collect()
}

/// Every row count a tile can have and beyond (1..=13: one to three blocks, uneven
/// ones), ragged `k` (odd: the last pair's low half alone; one; two) and `n`
/// (narrower than one half-panel, than two, several panels), left operands with
/// contiguous, padded (at an offset) and transposed rows, and every epilogue kind
/// (a bias, a residual, GELU, the adds' operands in both orders): each widening tile
/// this CPU has gives the bits of fused multiply-adds in the order of `k` over the
/// widened weight (the f32 tiles' arithmetic), then the steps, and so does the f32
/// tile of the tier in use over the unpacked (rounded) weight, where one runs; so does
/// the tier's bf16 path with one and two threads where it runs such a tile. A residual
/// too short is an error.
#[test]
fn the_widening_tiles_give_the_bits_of_fused_multiply_adds_on_the_widened_weight() {
    let kernels = widening();
    eprintln!("widening tiles checked: {kernels:?}");
    if kernels.is_empty() {
        return;
    }
    let mut rng = Rng::new(95);
    for m in (1..=13).chain([20]) {
        for (k, n) in [
            (1, 1),
            (2, 7),
            (3, 33),
            (6, 16),
            (17, 32),
            (70, 95),
            (9, 20),
        ] {
            let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
            let bl = Layout::contiguous(&[k, n]);
            let packed = PackedRhs::pack_bf16_in(&b, &bl, false).unwrap();
            let w = packed.unpack().unwrap();
            // The rounded weight in f32 panels, where the tier has an f32 tile.
            let f32_tile = PackedRhs::pack(&w, &bl);
            // Some values large enough for GELU's tails.
            let a: Vec<f32> = (0..m * (k + 5) + 3).map(|_| rng.f32() * 6.0).collect();
            let layouts = left_layouts(m, k);
            let ops = EpilogueOperands::new(&mut rng, m, n, 7);
            let (offset, stride) = (ops.offset, ops.stride);
            let [bias, bias_gelu, minilm] = ops.epilogues();
            let epilogues: [Epilogue<'_>; 4] = [&[], &bias, &bias_gelu, &minilm];
            for al in &layouts {
                let product = fused_in_order(&a, al, &w, k, n);
                for (e, epilogue) in epilogues.into_iter().enumerate() {
                    let want = then(&product, n, epilogue);
                    let what = format!("m {m} k {k} n {n} layout {al:?} epilogue {e}");
                    for &kernel in &kernels {
                        let out = direct(kernel, &a, al, &packed, epilogue);
                        assert!(same_bits(&out, &want), "{kernel:?} {what}");
                    }
                    if let Some(f32_tile) = &f32_tile {
                        the_tier_gives(&a, al, f32_tile, epilogue, &want, &what);
                    }
                    if kernels.iter().any(|&k| tier_runs(k)) {
                        the_tier_gives(&a, al, &packed, epilogue, &want, &what);
                    }
                }
            }
            if kernels.iter().any(|&k| tier_runs(k)) {
                let short = [Step::Add {
                    operand: Operand::Rows {
                        data: &ops.res[..offset + (m - 1) * stride + n - 1],
                        offset,
                        stride,
                    },
                    sum_first: true,
                }];
                let al = &layouts[0];
                let mut out = vec![0.0f32; m * n];
                let err = matmul_packed_epilogue(&a, al, &packed, &short, &mut out, Par::serial())
                    .unwrap_err();
                assert!(err.to_string().contains("a residual of"), "{err}");
            }
        }
    }
}

/// The stated bound: with the left operand in f32 and the weight rounded to bf16,
/// each widening tile's product stays within `2⁻⁸ · Σ|a·b|` of the exact one, plus
/// the f32 sums' rounding (`k · 2⁻²⁴ · Σ|a·b|`), at MiniLM's `k`.
#[test]
fn the_widening_tiles_stay_within_half_the_bound_of_rounding_both_operands() {
    let mut rng = Rng::new(96);
    let (m, k, n) = (7, 384, 40);
    let a: Vec<f32> = (0..m * k).map(|_| rng.f32() * 4.0 - 2.0).collect();
    let b: Vec<f32> = (0..k * n).map(|_| rng.f32() - 0.5).collect();
    let (al, bl) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    let packed = PackedRhs::pack_bf16_in(&b, &bl, false).unwrap();
    for kernel in widening() {
        within_half_the_bound(&direct(kernel, &a, &al, &packed, &[]), &a, &b, (m, k, n));
    }
}

/// Asserts that `out` (`m × n`) is within `2⁻⁸ · Σ|a·b|` plus `k · 2⁻²⁴ · Σ|a·b|` of
/// the exact product of `a` (`m × k`) by `b` (`k × n`), and far inside it.
fn within_half_the_bound(out: &[f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) {
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let terms = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64);
            let exact: f64 = terms.clone().sum();
            let mag: f64 = terms.map(f64::abs).sum();
            let err = (out[i * n + j] as f64 - exact).abs();
            let bound = (2f64.powi(-8) + k as f64 * 2f64.powi(-24)) * mag;
            assert!(err <= bound, "({i}, {j}): {err} > {bound}");
            worst = worst.max(err / mag);
        }
    }
    // Random weights' rounding errors cancel: far inside the bound.
    assert!(worst < 2f64.powi(-10), "{worst}");
}

/// A row holding a NaN, or an infinity, gives NaNs or infinities in that row only, as
/// the f32 tile's arithmetic does (any NaN for any NaN); the other rows are exact to
/// the bit. On the tile directly and on the tier's path, one and two threads.
#[test]
fn non_finite_rows_stay_in_their_rows() {
    let mut rng = Rng::new(97);
    let (m, k, n) = (9, 21, 40);
    let b: Vec<f32> = (0..k * n).map(|_| rng.f32() - 0.5).collect();
    let bl = Layout::contiguous(&[k, n]);
    let packed = PackedRhs::pack_bf16_in(&b, &bl, false).unwrap();
    let w = packed.unpack().unwrap();
    let mut a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
    a[k + 4] = f32::NAN;
    a[4 * k + 20] = f32::INFINITY; // the odd k's last element: the tail step
    a[7 * k] = f32::NEG_INFINITY;
    let al = Layout::contiguous(&[m, k]);
    let want = fused_in_order(&a, &al, &w, k, n);
    for (i, row) in want.chunks(n).enumerate() {
        let finite = row.iter().all(|x| x.is_finite());
        assert_eq!(finite, ![1, 4, 7].contains(&i), "row {i}");
    }
    assert!(want[n..2 * n].iter().all(|x| x.is_nan()));
    for kernel in widening() {
        let out = direct(kernel, &a, &al, &packed, &[]);
        assert!(same_or_nan(&out, &want), "{kernel:?}");
    }
    if Kernel::Bfmmla.runs_here() {
        // The rounded left rows keep their NaN and infinities: the same rows fail.
        let out = direct(Kernel::Bfmmla, &a, &al, &packed, &[]);
        for (i, row) in out.chunks(n).enumerate() {
            let finite = row.iter().all(|x| x.is_finite());
            assert_eq!(finite, ![1, 4, 7].contains(&i), "bfmmla row {i}");
        }
    }
    for threads in [1, 2] {
        let mut out = vec![0.0f32; m * n];
        matmul_packed(&a, &al, &packed, &mut out, Par { threads }).unwrap();
        if widening().into_iter().any(tier_runs) {
            assert!(same_or_nan(&out, &want), "threads {threads}");
        }
        for (i, row) in out.chunks(n).enumerate() {
            let finite = row.iter().all(|x| x.is_finite());
            assert_eq!(finite, ![1, 4, 7].contains(&i), "row {i} threads {threads}");
        }
    }
}

/// The widening controls: the low half of each pair moved to the top, the high half
/// kept, zeros below, in every lane.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_widening_controls_move_each_half_to_the_top() {
    let c = &avx2::controls();
    for lane in 0..2 {
        for d in 0..4 {
            let at = 16 * lane + 4 * d;
            let base = (4 * d) as u8;
            assert_eq!(c[at..at + 4], [0x80, 0x80, base, base + 1]);
            assert_eq!(c[32 + at..32 + at + 4], [0x80, 0x80, base + 2, base + 3]);
        }
    }
}

/// The `bfmmla` tile, run directly where the CPU has it (whatever tier is forced):
/// every row count 1..=13 and more (row pairs with a lone last row, uneven blocks),
/// `k` whose pairs are odd in number (`bfmmla`'s lone last pair) or even, odd column
/// counts (ragged halves), contiguous, padded and transposed left rows. Without an
/// epilogue each element is within `kp · 2⁻²² · Σ|ã·b̃|` of the exact product of the
/// rounded operands `ã`, `b̃` (module `neon`'s bound: two roundings to odd per pair);
/// with each epilogue kind, the bits of the product followed by the steps in scalar
/// code. The tier's path, where it runs this tile, on one and two threads: the same
/// bits as the tile run directly.
#[test]
fn the_bfmmla_tile_keeps_its_bound_and_applies_the_epilogue_with_the_programs_bits() {
    if !Kernel::Bfmmla.runs_here() {
        return;
    }
    eprintln!("the bfmmla tile runs here: checked");
    let rounded = |x: f32| to_f32(round(x)) as f64;
    let mut rng = Rng::new(98);
    for m in (1..=13).chain([20]) {
        for (k, n) in [(1, 1), (5, 7), (6, 33), (17, 32), (70, 95), (9, 20)] {
            let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
            let bl = Layout::contiguous(&[k, n]);
            let packed = PackedRhs::pack_bf16_in(&b, &bl, false).unwrap();
            let a: Vec<f32> = (0..m * (k + 5) + 3).map(|_| rng.f32() * 6.0).collect();
            let layouts = left_layouts(m, k);
            let ops = EpilogueOperands::new(&mut rng, m, n, 7);
            let [bias, bias_gelu, minilm] = ops.epilogues();
            let epilogues: [Epilogue<'_>; 3] = [&bias, &bias_gelu, &minilm];
            let kp = k.div_ceil(2) as f64;
            for al in &layouts {
                let at = |i: usize, p: usize| a[al.offset + i * al.strides[0] + p * al.strides[1]];
                let product = direct(Kernel::Bfmmla, &a, al, &packed, &[]);
                for i in 0..m {
                    for j in 0..n {
                        let terms = (0..k).map(|p| rounded(at(i, p)) * rounded(b[p * n + j]));
                        let exact: f64 = terms.clone().sum();
                        let mag: f64 = terms.map(f64::abs).sum();
                        let err = (product[i * n + j] as f64 - exact).abs();
                        let bound = kp * 2f64.powi(-22) * mag;
                        assert!(
                            err <= bound,
                            "m {m} k {k} n {n} layout {al:?} ({i}, {j}): {err} > {bound}"
                        );
                    }
                }
                for (e, epilogue) in epilogues.into_iter().enumerate() {
                    let want = then(&product, n, epilogue);
                    let out = direct(Kernel::Bfmmla, &a, al, &packed, epilogue);
                    let what = format!("m {m} k {k} n {n} layout {al:?} epilogue {e}");
                    assert!(same_bits(&out, &want), "{what}");
                    if tier_runs(Kernel::Bfmmla) {
                        the_tier_gives(&a, al, &packed, epilogue, &want, &what);
                    }
                }
            }
        }
    }
}

/// A `k` whose widened panel is larger than the stack copy holds (`STACK_MOST` / `NR`
/// rows) takes a copy on the heap: the same bits, on every kernel that widens panels,
/// with a part of one row (the AVX-512 path) and of many (the AVX2 one).
#[test]
fn a_panel_too_tall_for_the_stack_copy_is_widened_on_the_heap() {
    let mut rng = Rng::new(98);
    let (k, n) = (STACK_MOST / NR + 3, 40);
    let b: Vec<f32> = (0..k * n).map(|_| rng.f32() - 0.5).collect();
    let packed = PackedRhs::pack_bf16_in(&b, &Layout::contiguous(&[k, n]), false).unwrap();
    let w = packed.unpack().unwrap();
    for m in [2, WIDE_PANEL_ROWS * 2] {
        let a: Vec<f32> = (0..m * k).map(|_| rng.f32() - 0.5).collect();
        let al = Layout::contiguous(&[m, k]);
        let want = fused_in_order(&a, &al, &w, k, n);
        for kernel in widening() {
            let got = direct(kernel, &a, &al, &packed, &[]);
            assert!(same_bits(&got, &want), "{kernel:?} m {m}");
        }
    }
}
