//! Tests of the bf16 walk and the tiles that keep the left rows in f32 (the AVX2 tile,
//! and the AVX-512 f32 tile over widened panels): their bits against fused
//! multiply-adds on the widened weight (with every epilogue), run directly whenever
//! this CPU has their instructions and through `matmul_packed` on the tier in use;
//! their error bound against the f32 product; non-finite rows.

use super::super::f32::tests::fused_in_order;
use super::super::tests::{then, EpilogueOperands};
use super::super::{matmul_packed, matmul_packed_epilogue, PackedRhs, Panels, Step};
use super::*;
use crate::kernels::testutil::*;
use crate::kernels::Par;
use crate::Layout;

/// The product of the matrix `al` reads from `a` by `packed` (bf16 pairs), followed
/// by `epilogue`, on `kernel`, in four parts as two threads would split it (the first
/// and last rows, by the first and last panels), so tiles start at rows and panels
/// other than the first.
fn direct(
    kernel: Kernel,
    a: &[f32],
    al: &Layout,
    packed: &PackedRhs,
    epilogue: Epilogue<'_>,
) -> Vec<f32> {
    let (m, k, n) = (al.dims[0], al.dims[1], packed.n);
    let lda = if m > 1 { al.strides[0] } else { 0 };
    let cs = if k > 1 { al.strides[1] } else { 1 };
    let g = Matrix {
        a: &a[al.offset..al.offset + (m - 1) * lda + (k - 1) * cs + 1],
        lda,
        cs,
        k,
    };
    let Panels::Bf16(data) = &packed.panels else {
        panic!("a bf16 matrix in pairs")
    };
    let mut dst = vec![f32::NAN; m * n];
    let out = Out::new(&mut dst);
    let (rm, panels) = (m / 2, n.div_ceil(NR));
    let pm = panels / 2;
    for rows in [(0, rm), (rm, m)] {
        for panels in [(0, pm), (pm, panels)] {
            let part = Part { rows, panels, n };
            part_on(kernel, g, data, epilogue, part, out);
        }
    }
    dst
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

/// The kernels that keep the left rows in f32 (their results are the f32 tiles' over
/// the widened weight) which this CPU runs.
fn f32_kernels_here() -> impl Iterator<Item = Kernel> {
    [Kernel::Avx2, Kernel::Widened512]
        .into_iter()
        .filter(|k| k.runs_here())
}

/// Whether the tier in use multiplies bf16 weights on `kernel`.
fn tier_runs(kernel: Kernel) -> bool {
    Kernel::chosen(simd()) == kernel
}

/// Every row count a tile can have and beyond (1..=13: one to three blocks, uneven
/// ones), ragged `k` (odd: the last pair's low half alone; one; two) and `n`
/// (narrower than one half-panel, than two, several panels), left operands with
/// contiguous, padded (at an offset) and transposed rows, and every epilogue kind
/// (a bias, a residual, GELU, the adds' operands in both orders): the AVX2 tile and the
/// widened AVX-512 path give the bits of fused multiply-adds in the order of `k` over
/// the widened weight (the f32 tiles' arithmetic), then the steps; so does the tier's
/// path with one and two threads where it runs one of them. A residual too short is an
/// error.
#[test]
fn the_f32_tiles_give_the_bits_of_fused_multiply_adds_on_the_widened_weight() {
    for kernel in f32_kernels_here() {
        bits_of_fused_multiply_adds(kernel);
    }
}

/// [`the_f32_tiles_give_the_bits_of_fused_multiply_adds_on_the_widened_weight`] on
/// `kernel`.
fn bits_of_fused_multiply_adds(kernel: Kernel) {
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
            // Some values large enough for GELU's tails.
            let a: Vec<f32> = (0..m * (k + 5) + 3).map(|_| rng.f32() * 6.0).collect();
            let layouts = [
                Layout::contiguous(&[m, k]),
                Layout {
                    dims: vec![m, k].into(),
                    strides: vec![k + 5, 1].into(),
                    offset: 3,
                },
                Layout::contiguous(&[k, m]).permute(&[1, 0]),
            ];
            let ops = EpilogueOperands::new(&mut rng, m, n, 7);
            let (offset, stride) = (ops.offset, ops.stride);
            let [bias, bias_gelu, minilm] = ops.epilogues();
            let epilogues: [&[Step<'_>]; 4] = [&[], &bias, &bias_gelu, &minilm];
            for al in &layouts {
                let product = fused_in_order(&a, al, &w, k, n);
                for (e, epilogue) in epilogues.into_iter().enumerate() {
                    let want = then(&product, n, epilogue);
                    let out = direct(kernel, &a, al, &packed, epilogue);
                    let what = format!("{kernel:?}: m {m} k {k} n {n} layout {al:?} epilogue {e}");
                    assert!(same_bits(&out, &want), "{what}");
                    if !tier_runs(kernel) {
                        continue;
                    }
                    for threads in [1, 2] {
                        let mut out = vec![f32::NAN; m * n];
                        let par = Par { threads };
                        let done = matmul_packed_epilogue(&a, al, &packed, epilogue, &mut out, par)
                            .unwrap();
                        assert!(done, "{what}");
                        assert!(same_bits(&out, &want), "{what} threads {threads}");
                    }
                }
            }
            if tier_runs(kernel) {
                let short = [Step::Rows {
                    data: &ops.res[..offset + (m - 1) * stride + n - 1],
                    offset,
                    stride,
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
/// the product of the tiles that keep the left rows in f32 stays within `2⁻⁸ · Σ|a·b|`
/// of the exact one, plus the f32 sums' rounding (`k · 2⁻²⁴ · Σ|a·b|`), at MiniLM's
/// `k`.
#[test]
fn the_f32_tiles_stay_within_half_the_bound_of_rounding_both_operands() {
    for kernel in f32_kernels_here() {
        within_half_the_bound(kernel);
    }
}

/// [`the_f32_tiles_stay_within_half_the_bound_of_rounding_both_operands`] on `kernel`.
fn within_half_the_bound(kernel: Kernel) {
    let mut rng = Rng::new(96);
    let (m, k, n) = (7, 384, 40);
    let a: Vec<f32> = (0..m * k).map(|_| rng.f32() * 4.0 - 2.0).collect();
    let b: Vec<f32> = (0..k * n).map(|_| rng.f32() - 0.5).collect();
    let (al, bl) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    let packed = PackedRhs::pack_bf16_in(&b, &bl, false).unwrap();
    let out = direct(kernel, &a, &al, &packed, &[]);
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
    for kernel in f32_kernels_here() {
        let got = direct(kernel, &a, &al, &packed, &[]);
        assert!(same_or_nan(&got, &want), "{kernel:?}");
    }
    for threads in [1, 2] {
        let mut out = vec![0.0f32; m * n];
        matmul_packed(&a, &al, &packed, &mut out, Par { threads }).unwrap();
        if f32_kernels_here().any(tier_runs) {
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
        for kernel in f32_kernels_here() {
            let got = direct(kernel, &a, &al, &packed, &[]);
            assert!(same_bits(&got, &want), "{kernel:?} m {m}");
        }
    }
}
