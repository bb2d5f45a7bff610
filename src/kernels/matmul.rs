//! Batched matrix multiplication, delegated to the `gemm` crate.
//!
//! `gemm::gemm` takes raw pointers plus a row and a column stride for each operand, so
//! a transposed or otherwise strided input costs nothing: its layout's strides are
//! passed through as they are. The wrapper [`matmul`] earns the right to call `gemm` by checking, before the call, every fact
//! gemm relies on:
//!
//! 1. each input layout [fits](super::check_input) in its buffer, with checked
//!    arithmetic, so every `offset + i * row_stride + j * col_stride` gemm forms for
//!    `i < m, j < k` (or `k, n`) is an in-bounds index of that slice;
//! 2. `dst` has exactly `batch * m * n` elements and each matrix is written through a
//!    disjoint `m * n` chunk of it with strides `(n, 1)`;
//! 3. `dst` is a `&mut` slice, so it cannot alias the inputs (Rust guarantees it);
//! 4. every stride handed to gemm fits in `isize` (strides of size-1 dims, which gemm
//!    never multiplies by a non-zero index, are replaced by 1).
//!
//! Parallelism follows the product's [`Split`] (the plan's, or [`Split::of`] for a
//! direct call): by rows is gemm's own rayon splitting; by columns (a short product,
//! the tokens of one request) cuts the columns into one block per thread, each a
//! single-threaded gemm writing its columns of `dst` (`gemm_columns`; the blocks are
//! disjoint, which is what its `unsafe` relies on): MiniLM one sentence at a time ran
//! 17% faster so; a batch of small matrices is spread across the batch with rayon, one
//! single-threaded gemm per matrix.

use gemm::Parallelism;

use super::par::{for_each_chunk, Out, Split};
use super::strided::offset_of;
use super::{check_dst, check_input, error, KernelError, Par};
use crate::ir::Layout;

/// Multiplies `[b.., m, k] x [b.., k, n] -> [b.., m, n]`.
///
/// Both inputs have the same batch dims (already broadcast; a batch stride may be 0), and
/// any strides within a matrix (a transposed operand is read in place). `dst` receives the
/// result contiguously and must hold exactly `b * m * n` elements. `k == 0` gives zeros.
/// The product is split between threads by [`Split::of`] (a plan's product calls
/// [`matmul_split`] with the split it decided).
#[cfg(any(test, feature = "internals"))]
pub fn matmul(
    lhs: &[f32],
    lhs_layout: &Layout,
    rhs: &[f32],
    rhs_layout: &Layout,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    matmul_split(lhs, lhs_layout, rhs, rhs_layout, None, dst, par)
}

/// [`matmul`], split between threads as `split` says ([`Split::of`] when `None`).
pub(crate) fn matmul_split(
    lhs: &[f32],
    lhs_layout: &Layout,
    rhs: &[f32],
    rhs_layout: &Layout,
    split: Option<Split>,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "matmul";
    check_input(kernel, "lhs", lhs.len(), lhs_layout)?;
    check_input(kernel, "rhs", rhs.len(), rhs_layout)?;
    let (ld, rd) = (&lhs_layout.dims, &rhs_layout.dims);
    let rank = ld.len();
    if rank < 2
        || rd.len() != rank
        || ld[..rank - 2] != rd[..rank - 2]
        || ld[rank - 1] != rd[rank - 2]
    {
        return Err(error(
            kernel,
            format_args!("cannot multiply lhs dims {ld:?} by rhs dims {rd:?}: want [b.., m, k] x [b.., k, n]"),
        ));
    }
    let (m, k, n) = (ld[rank - 2], ld[rank - 1], rd[rank - 1]);
    let batch_dims = &ld[..rank - 2];
    let batch: usize = batch_dims.iter().product();
    let mn = m * n; // Cannot overflow: checked below against dst.len() via batch * m * n.
    let numel = batch
        .checked_mul(m)
        .and_then(|x| x.checked_mul(n))
        .ok_or_else(|| error(kernel, "output element count overflows"))?;
    check_dst(kernel, dst.len(), numel)?;
    if numel == 0 {
        return Ok(());
    }
    if k == 0 {
        dst.fill(0.0);
        return Ok(());
    }
    let stride = |l: &Layout, d: usize| -> isize {
        // Fits: for a dim of size > 1, (dims - 1) * stride <= max index < slice len <= isize::MAX.
        if l.dims[d] == 1 {
            1
        } else {
            l.strides[d] as isize
        }
    };
    let geom = Geometry {
        m,
        n,
        k,
        lhs_rs: stride(lhs_layout, rank - 2),
        lhs_cs: stride(lhs_layout, rank - 1),
        rhs_rs: stride(rhs_layout, rank - 2),
        rhs_cs: stride(rhs_layout, rank - 1),
    };
    let work = m.saturating_mul(n).saturating_mul(k);
    let split = split.unwrap_or_else(|| Split::of(batch, m, n, k));
    let lhs_base = |b: usize| {
        offset_of(
            batch_dims,
            &lhs_layout.strides[..rank - 2],
            lhs_layout.offset,
            b,
        )
    };
    let rhs_base = |b: usize| {
        offset_of(
            batch_dims,
            &rhs_layout.strides[..rank - 2],
            rhs_layout.offset,
            b,
        )
    };
    if par.threads > 1 && matches!(split, Split::Rows | Split::Columns) {
        for (b, out) in dst.chunks_exact_mut(mn).enumerate() {
            let (l, r) = (&lhs[lhs_base(b)..], &rhs[rhs_base(b)..]);
            if split == Split::Columns {
                gemm_columns(l, r, out, geom, par.threads);
            } else {
                gemm_one(l, r, out, geom, Parallelism::Rayon(par.threads));
            }
        }
    } else {
        for_each_chunk(dst, mn, work, par, |first, out| {
            for (i, out) in out.chunks_exact_mut(mn).enumerate() {
                let b = first + i;
                gemm_one(
                    &lhs[lhs_base(b)..],
                    &rhs[rhs_base(b)..],
                    out,
                    geom,
                    Parallelism::None,
                );
            }
        });
    }
    Ok(())
}

/// Column blocks start at multiples of this (a whole number of vectors).
const COLUMN_ALIGN: usize = 16;

/// One short product ([`Split::Columns`]) over `threads` threads, each computing a block of
/// the columns with a single-threaded gemm. The rows of one request (a sentence of a
/// few dozen tokens) are too few for gemm's own split, which scaled poorly: by
/// columns each thread reads (and packs) only its part of `rhs`, the weight.
fn gemm_columns(lhs: &[f32], rhs: &[f32], dst: &mut [f32], g: Geometry, threads: usize) {
    // `dst` is written by the tasks of `split` at disjoint column ranges (each column
    // belongs to one range), through the split's shared output handle.
    fn split(lhs: &[f32], rhs: &[f32], dst: Out, g: Geometry, cols: (usize, usize), pieces: usize) {
        let (c0, c1) = cols;
        let width = c1 - c0;
        if pieces > 1 && width >= 2 * COLUMN_ALIGN {
            let mid = c0
                + (width / 2)
                    .next_multiple_of(COLUMN_ALIGN)
                    .min(width - COLUMN_ALIGN);
            rayon::join(
                || split(lhs, rhs, dst, g, (c0, mid), pieces / 2),
                || split(lhs, rhs, dst, g, (mid, c1), pieces - pieces / 2),
            );
            return;
        }
        // SAFETY: columns c0..c1 < n of every row of the m x n output: inside `dst`
        // (which holds m * n elements, `debug_assert`ed by `gemm_columns`), written by
        // this task alone (the ranges of `split` are disjoint) and not read until
        // `gemm_columns` returns; `rhs` is read from column c0 on, within the checked
        // layout (see `gemm_raw`).
        unsafe {
            gemm_raw(
                lhs.as_ptr(),
                rhs.as_ptr().offset(c0 as isize * g.rhs_cs),
                dst.ptr.add(c0),
                Geometry { n: width, ..g },
                g.n,
                Parallelism::None,
            )
        }
    }
    debug_assert_eq!(dst.len(), g.m * g.n);
    split(lhs, rhs, Out::new(dst), g, (0, g.n), threads);
    super::teardown::after_gemm();
}

/// Sizes and strides of one product (strides in elements).
#[derive(Clone, Copy)]
struct Geometry {
    m: usize,
    n: usize,
    k: usize,
    lhs_rs: isize,
    lhs_cs: isize,
    rhs_rs: isize,
    rhs_cs: isize,
}

/// One product `dst = lhs x rhs` where `lhs` and `rhs` start at the matrices' `[0, 0]`
/// elements and `dst` is exactly `m * n` contiguous elements.
///
/// The caller ([`matmul`]) has checked that every element `lhs[i * lhs_rs + p * lhs_cs]`
/// (`i < m`, `p < k`) and `rhs[p * rhs_rs + j * rhs_cs]` (`p < k`, `j < n`) is inside the
/// slices, since the full batched layouts fit their buffers.
fn gemm_one(lhs: &[f32], rhs: &[f32], dst: &mut [f32], g: Geometry, parallelism: Parallelism) {
    debug_assert_eq!(dst.len(), g.m * g.n);
    debug_assert!(g.m > 0 && g.n > 0 && g.k > 0);
    // SAFETY: gemm reads lhs at `i * lhs_rs + p * lhs_cs` for i < m, p < k, and rhs at
    // `p * rhs_rs + j * rhs_cs` for p < k, j < n; `matmul` checked (check_input, with
    // checked arithmetic) that these are inside the input slices, which start at the
    // matrices' first elements (strides of size-1 dims were replaced by 1 but are only
    // ever multiplied by 0). It writes dst at `i * n + j`, inside `dst`, which holds
    // exactly m * n elements. `dst` is a unique `&mut` borrow, so it aliases neither
    // input, and the slices outlive the call (gemm returns after all its threads finish).
    // `read_dst = false` means dst's old contents are never read (alpha is ignored),
    // and beta = 1 gives `dst = lhs x rhs`.
    unsafe {
        gemm_raw(
            lhs.as_ptr(),
            rhs.as_ptr(),
            dst.as_mut_ptr(),
            g,
            g.n,
            parallelism,
        )
    }
    // gemm's thread-locals exist now: mark teardown before they are destroyed.
    super::teardown::after_gemm();
}

/// `gemm::gemm` for `dst = lhs x rhs` with `dst` row-major at row stride `dst_rs`.
///
/// # Safety
///
/// `lhs[i * lhs_rs + p * lhs_cs]` (`i < m`, `p < k`) and `rhs[p * rhs_rs + j * rhs_cs]`
/// (`p < k`, `j < n`) must be readable, `dst[i * dst_rs + j]` (`i < m`, `j < n`)
/// writable and not read or written by anyone else during the call, and none of
/// them may alias.
unsafe fn gemm_raw(
    lhs: *const f32,
    rhs: *const f32,
    dst: *mut f32,
    g: Geometry,
    dst_rs: usize,
    parallelism: Parallelism,
) {
    // SAFETY: the caller's contract is gemm's. `read_dst = false`: dst's old contents
    // are never read (alpha is ignored), and beta = 1 gives `dst = lhs x rhs`.
    unsafe {
        gemm::gemm(
            g.m,
            g.n,
            g.k,
            dst,
            1,
            dst_rs as isize,
            false,
            lhs,
            g.lhs_cs,
            g.lhs_rs,
            rhs,
            g.rhs_cs,
            g.rhs_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::par::SHORT_M;
    use crate::kernels::testutil::*;

    fn naive(lb: &[f32], l: &Layout, rb: &[f32], r: &Layout) -> Vec<f32> {
        let rank = l.dims.len();
        let k = l.dims[rank - 1];
        let mut out_dims = l.dims;
        out_dims[rank - 1] = r.dims[rank - 1];
        indices(&out_dims)
            .iter()
            .map(|idx| {
                let mut li = idx.clone();
                let mut ri = idx.clone();
                let mut acc = 0.0f64;
                for p in 0..k {
                    li[rank - 1] = p;
                    ri[rank - 2] = p;
                    acc += at(lb, l, &li) as f64 * at(rb, r, &ri) as f64;
                }
                acc as f32
            })
            .collect()
    }

    #[test]
    fn matches_naive_on_strided_batches() {
        let mut rng = Rng::new(40);
        for case in 0..150 {
            let rank = 2 + case % 3;
            let mut batch = rng.dims(rank - 2, 3);
            let (m, k, n) = if case % 10 == 0 {
                (20 + rng.below(20), 30 + rng.below(20), 17 + rng.below(20))
            } else {
                (1 + rng.below(6), rng.below(6), 1 + rng.below(6))
            };
            let mut ld = batch.clone();
            ld.extend([m, k]);
            batch.extend([k, n]);
            let (lb, ll) = rand_f32(&mut rng, &ld);
            let (rb, rl) = rand_f32(&mut rng, &batch);
            let want = naive(&lb, &ll, &rb, &rl);
            for par in pars() {
                let mut out = vec![f32::NAN; want.len()];
                matmul(&lb, &ll, &rb, &rl, &mut out, par).unwrap();
                assert_close(&out, &want, 1e-5);
            }
        }
    }

    #[test]
    fn transposed_inputs_and_large_sizes() {
        let mut rng = Rng::new(41);
        let (m, k, n) = (70, 65, 90);
        let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
        // lhs stored as [k, m] and read transposed; rhs stored as [n, k] and read transposed.
        let at_ = Layout::contiguous(&[k, m]).permute(&[1, 0]);
        let bt = Layout::contiguous(&[n, k]).permute(&[1, 0]);
        let want = naive(&a, &at_, &b, &bt);
        for par in pars() {
            let mut out = vec![0.0; m * n];
            matmul(&a, &at_, &b, &bt, &mut out, par).unwrap();
            assert_close(&out, &want, 1e-5);
        }
    }

    #[test]
    fn every_split_matches() {
        // Whatever split a plan decides, on any shape: by columns takes
        // `gemm_columns` (column blocks of uneven widths), by rows gemm's own split; a
        // transposed rhs (column stride k) and a batch of two.
        let mut rng = Rng::new(43);
        for (m, k, n) in [(1, 8, 33), (28, 40, 50), (SHORT_M, 17, 161)] {
            let a: Vec<f32> = (0..2 * m * k).map(|_| rng.f32()).collect();
            let b: Vec<f32> = (0..2 * k * n).map(|_| rng.f32()).collect();
            let al = Layout::contiguous(&[2, m, k]);
            let bt = Layout::contiguous(&[2, n, k]).permute(&[0, 2, 1]);
            let want = naive(&a, &al, &b, &bt);
            for split in [Split::Serial, Split::Batch, Split::Rows, Split::Columns] {
                for threads in [1, 2, 3, 4] {
                    let mut out = vec![f32::NAN; 2 * m * n];
                    let par = Par { threads };
                    matmul_split(&a, &al, &b, &bt, Some(split), &mut out, par).unwrap();
                    assert_close(&out, &want, 1e-5);
                }
            }
        }
    }

    #[test]
    fn shape_and_bounds_errors() {
        let a = vec![1.0f32; 6];
        let l23 = Layout::contiguous(&[2, 3]);
        let l32 = Layout::contiguous(&[3, 2]);
        let mut out = vec![0.0; 4];
        matmul(&a, &l23, &a, &l32, &mut out, Par::serial()).unwrap();
        assert_eq!(out, [3.0; 4]);
        // Wrong dst size: too small and too large.
        let e = matmul(&a, &l23, &a, &l32, &mut out[..3], Par::serial()).unwrap_err();
        assert!(e.0.contains("dst has 3"), "{e}");
        let mut big = vec![0.0; 5];
        assert!(matmul(&a, &l23, &a, &l32, &mut big, Par::serial()).is_err());
        // Layouts that reach past their buffers.
        assert!(matmul(&a[..5], &l23, &a, &l32, &mut out, Par::serial()).is_err());
        let past = Layout { offset: 1, ..l32 };
        let e = matmul(&a, &l23, &a, &past, &mut out, Par::serial()).unwrap_err();
        assert!(e.0.contains("rhs") && e.0.contains("index 6"), "{e}");
        let huge = Layout {
            dims: vec![2, 3].into(),
            strides: vec![usize::MAX / 2, 1].into(),
            offset: 0,
        };
        assert!(matmul(&a, &huge, &a, &l32, &mut out, Par::serial()).is_err());
        // Mismatched shapes.
        assert!(matmul(&a, &l23, &a, &l23, &mut out, Par::serial()).is_err());
        assert!(matmul(
            &a,
            &Layout::contiguous(&[6]),
            &a,
            &l32,
            &mut out,
            Par::serial()
        )
        .is_err());
        let b3 = Layout::contiguous(&[1, 2, 3]);
        assert!(matmul(&a, &b3, &a, &l32, &mut out, Par::serial()).is_err());
        // k == 0 gives zeros; empty outputs are fine.
        let mut z = vec![7.0; 4];
        matmul(
            &a,
            &Layout::contiguous(&[2, 0]),
            &a,
            &Layout::contiguous(&[0, 2]),
            &mut z,
            Par::serial(),
        )
        .unwrap();
        assert_eq!(z, [0.0; 4]);
        matmul(
            &a,
            &Layout::contiguous(&[0, 3]),
            &a,
            &l32,
            &mut [],
            Par::serial(),
        )
        .unwrap();
    }

    #[test]
    fn broadcast_operands() {
        // Batch stride 0 on rhs, and a stride-0 dim inside a matrix.
        let lhs: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let ll = Layout::contiguous(&[2, 2, 3]);
        let rhs = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let rl = Layout::contiguous(&[3, 2])
            .broadcast_as(&[2, 3, 2])
            .unwrap();
        let want = naive(&lhs, &ll, &rhs, &rl);
        let mut out = vec![0.0; 8];
        matmul(&lhs, &ll, &rhs, &rl, &mut out, Par { threads: 2 }).unwrap();
        assert_eq!(out, want);
        let col = Layout::contiguous(&[3, 1]).broadcast_as(&[3, 4]).unwrap();
        let want = naive(&lhs, &Layout::contiguous(&[2, 3]), &rhs, &col);
        let mut out = vec![0.0; 8];
        matmul(
            &lhs,
            &Layout::contiguous(&[2, 3]),
            &rhs,
            &col,
            &mut out,
            Par::serial(),
        )
        .unwrap();
        assert_eq!(out, want);
    }
}
