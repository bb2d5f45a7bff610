//! Matrix products against a right operand packed once: the weights of a model.
//!
//! `gemm` packs both operands on every call. For the rows of one request (a few dozen
//! tokens) packing the weight costs as much as multiplying by it, and the weight is
//! read twice (strided, then packed) from DRAM: MiniLM's 24 weights are 42.5 MB, more
//! than the L3. A [`PackedRhs`] holds a `[k, n]` operand once in the layout the
//! microkernel streams: **panels** of [`NR`] columns, each `k` rows of `NR` contiguous
//! floats (the last panel padded with zeros), so a product reads the weight exactly
//! once, front to back, which the hardware prefetcher follows.
//!
//! The microkernel computes a tile of up to [`MR`] rows by [`NR`] columns of the
//! output: `MR × 2` AVX-512 accumulators, and per step of `k` two vector loads of the
//! panel and one broadcast of each row's element of the left operand (read in place:
//! only its rows' current cache lines are live, so it needs no packing). A product
//! walks the panels, and for each panel the row blocks (so a panel stays in L2 while
//! every row block reads it); the rows are cut into blocks as even as possible (20 rows
//! are two blocks of 10, not 14 + 6).
//!
//! Measured on this project's 2-core AVX-512 EPYC (thread CPU time, one thread, a
//! MiniLM-shaped pass over all 24 weights): 28 rows 5.9 ms against gemm's 11.1 ms,
//! 128 rows 25.4 ms against 29.6 ms, 896 rows 183.7 against 184.7 ms.
//!
//! Packing needs AVX-512 ([`PackedRhs::pack`] gives `None` without it, and the caller
//! uses `gemm` on the original operand). `unsafe` is confined to the microkernel's
//! loads and stores, whose bounds [`tile`] checks once before its loop, and to the
//! column split of one output between threads (disjoint columns).

use super::{check_input, error, KernelError, Par};
use crate::ir::Layout;

/// Columns of one panel (two AVX-512 vectors).
pub const NR: usize = 32;
/// Most rows of one tile (`MR × 2` accumulators of the 32 vector registers).
pub const MR: usize = 14;

/// A `[k, n]` f32 matrix packed into panels of [`NR`] columns, for products
/// `[.., m, k] × [k, n]` ([`matmul_packed`]). Made once per weight (the engine keeps it
/// beside the weight's buffer).
#[derive(Debug)]
pub struct PackedRhs {
    k: usize,
    n: usize,
    /// The layout it was packed from (a 2-D view of its buffer), to check a reader's.
    source: (usize, usize, usize),
    /// `ceil(n / NR)` panels of `k * NR` elements.
    data: Vec<f32>,
}

impl PackedRhs {
    /// Packs the `[k, n]` matrix that `layout` reads from `src` (any strides and
    /// offset), or `None` when this CPU has no AVX-512 (the packed kernel's only path),
    /// when the layout is not 2-D or does not fit `src`, or when the memory cannot be
    /// had (then the caller multiplies by the original as before).
    pub fn pack(src: &[f32], layout: &Layout) -> Option<PackedRhs> {
        if !has_avx512()
            || layout.dims.len() != 2
            || check_input("pack", "rhs", src.len(), layout).is_err()
        {
            return None;
        }
        let (k, n) = (layout.dims[0], layout.dims[1]);
        if k == 0 || n == 0 {
            return None;
        }
        let (rs, cs) = (layout.strides[0], layout.strides[1]);
        let panels = n.div_ceil(NR);
        let len = panels.checked_mul(k)?.checked_mul(NR)?;
        let mut data = Vec::new();
        data.try_reserve_exact(len).ok()?;
        data.resize(len, 0.0);
        for (pj, panel) in data.chunks_exact_mut(k * NR).enumerate() {
            let j0 = pj * NR;
            let w = NR.min(n - j0);
            for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
                let base = layout.offset + p * rs + j0 * cs;
                if cs == 1 {
                    row[..w].copy_from_slice(&src[base..base + w]);
                } else {
                    for (jj, x) in row[..w].iter_mut().enumerate() {
                        *x = src[base + jj * cs];
                    }
                }
            }
        }
        Some(PackedRhs {
            k,
            n,
            source: (layout.offset, rs, cs),
            data,
        })
    }

    /// Whether this packs the matrix `layout` reads (after broadcasting to the batch
    /// dims of a product: every batch stride 0), so a product may use it instead.
    pub fn packs(&self, layout: &Layout) -> bool {
        let r = layout.dims.len();
        r >= 2
            && layout.dims[r - 2] == self.k
            && layout.dims[r - 1] == self.n
            && layout.strides[..r - 2].iter().all(|&s| s == 0)
            && (layout.offset, layout.strides[r - 2], layout.strides[r - 1]) == self.source
    }

    /// The `[k, n]` matrix back, row-major, or `None` when the memory cannot be had.
    pub fn unpack(&self) -> Option<Vec<f32>> {
        let (k, n) = (self.k, self.n);
        let mut out = Vec::new();
        out.try_reserve_exact(k.checked_mul(n)?).ok()?;
        for p in 0..k {
            for j0 in (0..n).step_by(NR) {
                let w = NR.min(n - j0);
                let at = (j0 / NR) * k * NR + p * NR;
                out.extend_from_slice(&self.data[at..at + w]);
            }
        }
        Some(out)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.capacity() * std::mem::size_of::<f32>()
    }
}

/// Whether the packed kernel can run here.
pub fn has_avx512() -> bool {
    super::cpu::has_avx512()
}

/// Products of at most this many rows are split between threads by columns (tests
/// use fewer, so that both splits run).
const SHORT_M: usize = if cfg!(test) { 20 } else { 128 };

/// Below this many multiply-adds a product runs on one thread.
const PAR_WORK: usize = if cfg!(test) { 1 << 9 } else { 64 * 64 * 64 };

/// Multiplies `[b.., m, k]` (read through `lhs_layout`, any strides; rows with
/// contiguous elements take the fastest path) by the packed `[k, n]` into `dst`
/// (`b * m * n` elements, row-major).
pub fn matmul_packed(
    lhs: &[f32],
    lhs_layout: &Layout,
    rhs: &PackedRhs,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "matmul";
    check_input(kernel, "lhs", lhs.len(), lhs_layout)?;
    let ld = &lhs_layout.dims;
    let rank = ld.len();
    if rank < 2 || ld[rank - 1] != rhs.k {
        return Err(error(
            kernel,
            format_args!(
                "cannot multiply lhs dims {ld:?} by a packed [{}, {}]",
                rhs.k, rhs.n
            ),
        ));
    }
    let (m, k, n) = (ld[rank - 2], rhs.k, rhs.n);
    // Strides of size-1 dims are never multiplied by a non-zero index.
    let lda = if m > 1 {
        lhs_layout.strides[rank - 2]
    } else {
        0
    };
    let cs = if k > 1 {
        lhs_layout.strides[rank - 1]
    } else {
        1
    };
    let batch: usize = ld[..rank - 2].iter().product();
    let numel = batch
        .checked_mul(m)
        .and_then(|x| x.checked_mul(n))
        .ok_or_else(|| error(kernel, "output element count overflows"))?;
    super::check_dst(kernel, dst.len(), numel)?;
    if numel == 0 {
        return Ok(());
    }
    if k == 0 {
        dst.fill(0.0);
        return Ok(());
    }
    let work = m.saturating_mul(n).saturating_mul(k);
    let threads = if work >= PAR_WORK { par.threads } else { 1 };
    for (b, out) in dst.chunks_exact_mut(m * n).enumerate() {
        let base = super::strided::offset_of(
            &ld[..rank - 2],
            &lhs_layout.strides[..rank - 2],
            lhs_layout.offset,
            b,
        );
        // The matrix: element (i, p) at i * lda + p * cs. The layout fits `lhs`
        // (checked), so its last element is inside it.
        let a = &lhs[base..base + (m - 1) * lda + (k - 1) * cs + 1];
        let g = Matrix {
            a,
            lda,
            cs,
            m,
            k,
            n,
        };
        // The rows of a request or two: split by columns, so each thread reads only its
        // part of the weight (from DRAM, for a model larger than the cache); taller
        // products: by rows.
        if threads > 1 && m > SHORT_M {
            split_rows(g, rhs, out, threads);
        } else {
            split_columns(g, rhs, Out::new(out), (0, n.div_ceil(NR)), threads);
        }
    }
    Ok(())
}

/// The left operand of one product.
#[derive(Clone, Copy)]
struct Matrix<'a> {
    /// Element `(i, p)` is `a[i * lda + p * cs]`; `a` ends at the last one.
    a: &'a [f32],
    lda: usize,
    cs: usize,
    m: usize,
    k: usize,
    n: usize,
}

/// Halves the rows between threads (block-aligned), each computing all columns of its
/// rows.
fn split_rows(g: Matrix<'_>, rhs: &PackedRhs, out: &mut [f32], threads: usize) {
    if threads <= 1 || g.m <= 2 * MR {
        return split_columns(g, rhs, Out::new(out), (0, g.n.div_ceil(NR)), 1);
    }
    let top = (g.m / 2).next_multiple_of(MR).min(g.m - MR);
    let (o1, o2) = out.split_at_mut(top * g.n);
    let g1 = Matrix { m: top, ..g };
    let g2 = Matrix {
        a: &g.a[top * g.lda..],
        m: g.m - top,
        ..g
    };
    rayon::join(
        || split_rows(g1, rhs, o1, threads / 2),
        || split_rows(g2, rhs, o2, threads - threads / 2),
    );
}

/// An `m × n` output written through a raw pointer, so that the tasks of a split by
/// columns can each write their own columns of every row (their elements interleave
/// row by row, so no task can hold a `&mut` slice of its part).
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    len: usize,
}

impl Out {
    /// The output `dst`: the `Out` must not be used after this borrow of `dst` ends.
    fn new(dst: &mut [f32]) -> Out {
        Out {
            ptr: dst.as_mut_ptr(),
            len: dst.len(),
        }
    }

    /// The output from element `start` on.
    fn skip(self, start: usize) -> Out {
        assert!(start <= self.len);
        Out {
            // SAFETY: `start <= len`, so the pointer stays inside (or one past the end
            // of) the output's allocation.
            ptr: unsafe { self.ptr.add(start) },
            len: self.len - start,
        }
    }
}

// SAFETY: an `Out` is shared only by the tasks of `split_columns`, which write disjoint
// panel ranges, i.e. disjoint column ranges of every row (each column belongs to one
// panel), so no element is written by two tasks; nobody reads the output until the
// split returns (rayon::join waits for both halves), and the `&mut` borrow it was made
// from outlives the split.
unsafe impl Sync for Out {}
unsafe impl Send for Out {}

/// Computes panels `panels.0..panels.1` of `out` (`m × n`), halving the panels between
/// `threads` threads.
fn split_columns(g: Matrix<'_>, rhs: &PackedRhs, out: Out, panels: (usize, usize), threads: usize) {
    debug_assert_eq!(out.len, g.m * g.n);
    let (p0, p1) = panels;
    if threads > 1 && p1 - p0 >= 2 {
        let mid = p0 + (p1 - p0) / 2;
        rayon::join(
            || split_columns(g, rhs, out, (p0, mid), threads / 2),
            || split_columns(g, rhs, out, (mid, p1), threads - threads / 2),
        );
        return;
    }
    for pj in p0..p1 {
        panel(g, rhs, pj, out);
    }
}

/// Computes the columns of panel `pj` for every row of `dst`, row block by row block.
fn panel(g: Matrix<'_>, rhs: &PackedRhs, pj: usize, dst: Out) {
    let j0 = pj * NR;
    let width = NR.min(g.n - j0);
    let b = &rhs.data[pj * g.k * NR..(pj + 1) * g.k * NR];
    let blocks = g.m.div_ceil(MR);
    let mut r0 = 0;
    for bi in 0..blocks {
        let rows = (g.m - r0).div_ceil(blocks - bi);
        let t = Tile {
            a: &g.a[r0 * g.lda..],
            lda: g.lda,
            cs: g.cs,
            k: g.k,
            b,
            j0,
            width,
            ldc: g.n,
        };
        let c = dst.skip(r0 * g.n);
        macro_rules! rows {
            ($($r:literal)*) => {
                match (rows, g.cs == 1) {
                    $(($r, true) => tile::<$r, true>(&t, c),)*
                    $(($r, false) => tile::<$r, false>(&t, c),)*
                    _ => unreachable!("row blocks hold 1 to MR rows"),
                }
            };
        }
        rows!(1 2 3 4 5 6 7 8 9 10 11 12 13 14);
        r0 += rows;
    }
}

/// One tile's operands: rows of `a` (element `(i, p)` at `i * lda + p * cs`), the
/// panel `b` (`k` rows of `NR`), and where the tile goes in `dst` (columns
/// `j0..j0 + width` of rows at stride `ldc`).
struct Tile<'a> {
    a: &'a [f32],
    lda: usize,
    cs: usize,
    k: usize,
    b: &'a [f32],
    j0: usize,
    width: usize,
    ldc: usize,
}

/// `dst[i][j0..j0 + width] = a[i] · b` for the tile's `R` rows; `UNIT`: the rows of
/// `a` are contiguous (`cs == 1`, the common case, compiled apart).
fn tile<const R: usize, const UNIT: bool>(t: &Tile<'_>, dst: Out) {
    // The bounds every access below relies on, checked once (a failed check is a bug of
    // this module, caught at the kernel boundary as a panic).
    assert!(R >= 1 && R <= MR && t.width >= 1 && t.width <= NR);
    assert!(t.b.len() >= t.k * NR);
    assert!(t.k >= 1 && t.a.len() > (R - 1) * t.lda + (t.k - 1) * t.cs);
    assert!(!UNIT || t.cs == 1);
    assert!(dst.len >= (R - 1) * t.ldc + t.j0 + t.width);
    #[cfg(target_arch = "x86_64")]
    {
        assert!(has_avx512(), "the packed kernel runs only on AVX-512");
        // SAFETY: AVX-512F is present (asserted), the asserts above are the bounds
        // `avx512::tile` documents, and this tile's elements of `dst` are written by no
        // one else (see `Out`).
        unsafe { avx512::tile::<R, UNIT>(t, dst.ptr) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("PackedRhs::pack gives None without AVX-512");
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Tile, NR};
    use std::arch::x86_64::*;

    /// The tile on AVX-512: `R × 2` accumulators, one step of `k` per iteration.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F; `t.k >= 1` and `t.b` holds at least `t.k * NR` elements;
    /// `t.a` holds more than `(R - 1) * t.lda + (t.k - 1) * t.cs`, and `t.cs == 1`
    /// when `UNIT`; `dst` is valid for writes of
    /// `(R - 1) * t.ldc + t.j0 + t.width` elements, of which nobody else reads or
    /// writes the tile's during the call, and `1 <= t.width <= NR`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const R: usize, const UNIT: bool>(t: &Tile<'_>, dst: *mut f32) {
        let mut acc0 = [_mm512_setzero_ps(); R];
        let mut acc1 = [_mm512_setzero_ps(); R];
        let (a, b) = (t.a.as_ptr(), t.b.as_ptr());
        for p in 0..t.k {
            let col = if UNIT { p } else { p * t.cs };
            // SAFETY: p < k, so `b[p * NR..p * NR + 32]` is inside `t.b` (k * NR
            // elements), and `a[i * lda + p * cs]` for i < R is inside `t.a` (whose
            // last element is at (R - 1) * lda + (k - 1) * cs or beyond).
            unsafe {
                let b0 = _mm512_loadu_ps(b.add(p * NR));
                let b1 = _mm512_loadu_ps(b.add(p * NR + 16));
                for i in 0..R {
                    let x = _mm512_set1_ps(*a.add(i * t.lda + col));
                    acc0[i] = _mm512_fmadd_ps(x, b0, acc0[i]);
                    acc1[i] = _mm512_fmadd_ps(x, b1, acc1[i]);
                }
            }
        }
        let c = dst;
        let w = t.width;
        // Lanes of each half that hold columns (the last panel may be narrower).
        let m0 = if w >= 16 { 0xffff } else { (1u16 << w) - 1 };
        let m1 = if w >= NR {
            0xffff
        } else if w > 16 {
            (1u16 << (w - 16)) - 1
        } else {
            0
        };
        for i in 0..R {
            // SAFETY: row i's columns j0..j0 + w are at i * ldc + j0.., inside `dst`
            // (its length is at least (R - 1) * ldc + j0 + w); the masks write only
            // the first w lanes.
            unsafe {
                let row = c.add(i * t.ldc + t.j0);
                _mm512_mask_storeu_ps(row, m0, acc0[i]);
                _mm512_mask_storeu_ps(row.add(16), m1, acc1[i]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::*;

    fn naive(a: &[f32], al: &Layout, b: &[f32], bl: &Layout) -> Vec<f32> {
        let r = al.dims.len();
        let (m, k, n) = (al.dims[r - 2], al.dims[r - 1], bl.dims[1]);
        let batch: usize = al.dims[..r - 2].iter().product();
        let mut out = vec![0.0f32; batch * m * n];
        for bi in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0f64;
                    for p in 0..k {
                        let mut idx = vec![0; r];
                        let mut rest = bi;
                        for d in (0..r - 2).rev() {
                            idx[d] = rest % al.dims[d];
                            rest /= al.dims[d];
                        }
                        idx[r - 2] = i;
                        idx[r - 1] = p;
                        acc += at(a, al, &idx) as f64 * at(b, bl, &[p, j]) as f64;
                    }
                    out[(bi * m + i) * n + j] = acc as f32;
                }
            }
        }
        out
    }

    #[test]
    fn matches_naive_for_every_row_count_and_ragged_width() {
        if !has_avx512() {
            assert!(PackedRhs::pack(&[1.0; 4], &Layout::contiguous(&[2, 2])).is_none());
            return;
        }
        let mut rng = Rng::new(90);
        // Row counts 1..=2*MR+3 cover every tile height and uneven blocks; widths cover
        // a partial first half, a partial second half and several panels.
        for (m, k, n) in [
            (1, 1, 1),
            (3, 7, 5),
            (MR, 9, 16),
            (MR + 1, 13, 17),
            (2 * MR + 3, 40, 70),
            (20, 33, 96),
            (60, 5, 31),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
            let al = Layout::contiguous(&[m, k]);
            let bl = Layout::contiguous(&[k, n]);
            let packed = PackedRhs::pack(&b, &bl).unwrap();
            assert!(packed.packs(&bl));
            let want = naive(&a, &al, &b, &bl);
            for threads in [1, 2, 3] {
                let mut out = vec![f32::NAN; m * n];
                matmul_packed(&a, &al, &packed, &mut out, Par { threads }).unwrap();
                assert_close(&out, &want, 1e-5);
            }
        }
    }

    #[test]
    fn strided_operands_batches_and_refusals() {
        if !has_avx512() {
            return;
        }
        let mut rng = Rng::new(91);
        let (m, k, n) = (9, 21, 40);
        // rhs stored [n, k] and read transposed; lhs rows at a stride wider than k (a
        // narrowed view) in a batch of 3.
        let b: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
        let bl = Layout::contiguous(&[n, k]).permute(&[1, 0]);
        let packed = PackedRhs::pack(&b, &bl).unwrap();
        let wide = k + 4;
        let a: Vec<f32> = (0..3 * m * wide).map(|_| rng.f32()).collect();
        let al = Layout {
            dims: vec![3, m, k].into(),
            strides: vec![m * wide, wide, 1].into(),
            offset: 2,
        };
        // The product's layout of rhs as the engine hands it: broadcast over the batch.
        let bb = bl.broadcast_as(&[3, k, n]).unwrap();
        assert!(packed.packs(&bb));
        assert!(!packed.packs(&Layout::contiguous(&[k, n])));
        let want = naive(&a, &al, &b, &bl);
        let mut out = vec![f32::NAN; 3 * m * n];
        matmul_packed(&a, &al, &packed, &mut out, Par { threads: 2 }).unwrap();
        assert_close(&out, &want, 1e-5);
        // A transposed lhs (column stride m) and a single row (stride of no use).
        let at_ = Layout::contiguous(&[k, m]).permute(&[1, 0]);
        let want = naive(&a, &at_, &b, &bl);
        for threads in [1, 2] {
            let mut out = vec![f32::NAN; m * n];
            matmul_packed(&a, &at_, &packed, &mut out, Par { threads }).unwrap();
            assert_close(&out, &want, 1e-5);
        }
        let row = Layout {
            dims: vec![1, k].into(),
            strides: vec![1000, 2].into(),
            offset: 1,
        };
        let want = naive(&a, &row, &b, &bl);
        let mut out1 = vec![f32::NAN; n];
        matmul_packed(&a, &row, &packed, &mut out1, Par::serial()).unwrap();
        assert_close(&out1, &want, 1e-5);
        // A wrong k or dst size is an error.
        let e = matmul_packed(
            &a,
            &Layout::contiguous(&[m, k + 1]),
            &packed,
            &mut out,
            Par::serial(),
        );
        assert!(e.is_err());
        assert!(matmul_packed(
            &a,
            &Layout::contiguous(&[m, k]),
            &packed,
            &mut out,
            Par::serial()
        )
        .is_err());
        // A layout that does not fit its buffer is an error, not a read past it.
        assert!(matmul_packed(&a[..5], &al, &packed, &mut out, Par::serial()).is_err());
        // Layouts that do not fit are not packed.
        assert!(PackedRhs::pack(&b[..10], &bl).is_none());
        assert!(PackedRhs::pack(&b, &Layout::contiguous(&[n * k])).is_none());
    }
}
