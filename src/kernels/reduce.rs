//! Reductions over one dim: [`reduce`] (sum, max, mean) and [`argmax`].
//!
//! The reduced dim is moved out of the layout, and the remaining dims (the output, in
//! row-major order) are walked in runs like an element-wise kernel. Each output element
//! reduces `n = dims[dim]` inputs, `rstride` apart. Three loops, picked by the strides:
//!
//! * **Row reduction** (`rstride == 1`, e.g. a sum over the last dim): each output reads
//!   one contiguous slice, folded with 16 independent accumulators (vectorised) in leaves
//!   of [`LEAF`] elements combined pairwise, so an f32 sum has error growing like
//!   `log n` rather than `n`. A very long row with few outputs is itself split across
//!   threads, at the same pairwise split points, so the result does not depend on the
//!   thread count.
//! * **Row accumulation** (the output run is contiguous in the input, e.g. a sum over
//!   dim 0 of a row-major matrix): whole rows of outputs are added at once, again
//!   pairwise over the reduced dim, in column tiles that stay in L1.
//! * **Strided**: anything else, one output at a time with a strided iterator.

use super::par::{for_each_chunk, MIN_TASK_WORK};
use super::strided::{run, Walk};
use super::{check_dst, check_input, error, numel_of, KernelError, Par};
use crate::ir::{Element, Layout, ReduceOp};

/// Contiguous folds are pairwise above this many elements.
const LEAF: usize = 256;
/// Row accumulation folds this many rows sequentially, pairwise above.
const ROW_LEAF: usize = 16;
/// Row accumulation works on column tiles of this many outputs.
const COL_TILE: usize = 1024;

/// A reduction as its combining function and identity. `F` is a function *item* (a
/// zero-sized type such as `T::add`, never a `fn` pointer), so every loop that calls it is
/// monomorphised and the call inlines and vectorises.
#[derive(Clone, Copy)]
struct Fold<T, F> {
    f: F,
    id: T,
}

/// What a [`Fold`]'s function must be.
trait Combine<T>: Fn(T, T) -> T + Copy + Send + Sync {}
impl<T, F: Fn(T, T) -> T + Copy + Send + Sync> Combine<T> for F {}

/// Reduces `src` (read through `layout`) over `dim`, writing one value per element of the
/// remaining dims to `dst`, in their row-major order (whether the caller keeps `dim` with
/// size 1 does not change the data).
///
/// `Sum` wraps for integers; `Max` propagates NaN; `Mean` is the sum divided by
/// `dims[dim]` through f64. Over an empty dim, `Sum` gives 0, `Mean` gives NaN (0 for
/// integers) and `Max` is an error. `ArgMax` has its own kernel, [`argmax`].
pub(crate) fn reduce<T: Element>(
    op: ReduceOp,
    src: &[T],
    layout: &Layout,
    dim: usize,
    dst: &mut [T],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "reduce";
    let shape = Shape::new(kernel, src, layout, dim, dst.len())?;
    if op == ReduceOp::ArgMax {
        return Err(error(
            kernel,
            "argmax returns u32 indices: call kernels::argmax",
        ));
    }
    let n = shape.n;
    if n == 0 {
        match op {
            ReduceOp::Max => {
                return Err(error(
                    kernel,
                    format_args!(
                        "max over dim {dim} of size 0 (dims {:?}) has no value",
                        layout.dims
                    ),
                ))
            }
            ReduceOp::Mean => dst.fill(T::from_f64(f64::NAN)),
            _ => dst.fill(T::zero()),
        }
        return Ok(());
    }
    let mean = op == ReduceOp::Mean;
    if op == ReduceOp::Max {
        let fold = Fold {
            f: T::maximum,
            id: T::min_value(),
        };
        reduce_with(&shape, src, dst, par, fold, false);
    } else {
        let fold = Fold {
            f: T::add,
            id: T::zero(),
        };
        reduce_with(&shape, src, dst, par, fold, mean);
    }
    Ok(())
}

/// The loops of [`reduce`] for one fold (see the module docs); with `mean`, each result
/// is divided by the reduced length.
fn reduce_with<T: Element, F: Combine<T>>(
    shape: &Shape,
    src: &[T],
    dst: &mut [T],
    par: Par,
    fold: Fold<T, F>,
    mean: bool,
) {
    let n = shape.n;
    let finish = move |x: T| -> T {
        if mean {
            T::from_f64(x.to_f64() / n as f64)
        } else {
            x
        }
    };
    let walk = shape.walk();
    let is = walk.inner_strides()[0];
    let rs = shape.rstride;
    let few_outputs = dst.len() < par.threads;
    for_each_chunk(dst, 1, n, par, |start, out| {
        let mut pos = 0;
        walk.for_each_run(start, out.len(), |[first], len| {
            let out = &mut out[pos..pos + len];
            pos += len;
            if rs == 1 || n == 1 {
                for (j, d) in out.iter_mut().enumerate() {
                    let o = first + j * is;
                    let threads = if few_outputs { par.threads } else { 1 };
                    *d = finish(fold_contig(&src[o..o + n], fold, threads));
                }
            } else if is == 1 {
                for (c, tile) in out.chunks_mut(COL_TILE).enumerate() {
                    fold_rows(src, first + c * COL_TILE, rs, n, tile, fold);
                    for d in tile.iter_mut() {
                        *d = finish(*d);
                    }
                }
            } else {
                for (j, d) in out.iter_mut().enumerate() {
                    *d = finish(fold_strided(src, first + j * is, rs, n, fold));
                }
            }
        });
    });
}

/// The validated geometry of a reduction: the output dims walked in the input, and the
/// length and stride of the reduced dim.
struct Shape {
    out_dims: crate::ir::Dims,
    out_strides: crate::ir::Dims,
    offset: usize,
    n: usize,
    rstride: usize,
}

impl Shape {
    fn new<T>(
        kernel: &str,
        src: &[T],
        layout: &Layout,
        dim: usize,
        dst_len: usize,
    ) -> Result<Shape, KernelError> {
        check_input(kernel, "src", src.len(), layout)?;
        let rank = layout.dims.len();
        if dim >= rank {
            return Err(error(
                kernel,
                format_args!("dim {dim} out of range for dims {:?}", layout.dims),
            ));
        }
        let mut out_dims = layout.dims;
        let mut out_strides = layout.strides;
        let n = out_dims.remove(dim);
        let rstride = out_strides.remove(dim);
        check_dst(kernel, dst_len, numel_of(kernel, &out_dims)?)?;
        Ok(Shape {
            out_dims,
            out_strides,
            offset: layout.offset,
            n,
            rstride,
        })
    }

    fn walk(&self) -> Walk<1> {
        Walk::new(&self.out_dims, [&self.out_strides], [self.offset])
    }
}

/// Folds a contiguous slice: 16 accumulators over leaves of [`LEAF`] elements, combined
/// pairwise. With `threads > 1` the two halves of a long slice run in parallel (the split
/// points, and so the result, are the same as with one thread).
fn fold_contig<T: Element, F: Combine<T>>(x: &[T], fold: Fold<T, F>, threads: usize) -> T {
    if x.len() <= LEAF {
        return fold_leaf(x, fold);
    }
    let mid = (x.len() / 2).next_multiple_of(16).min(x.len());
    let (a, b) = x.split_at(mid);
    let (ra, rb) = if threads > 1 && x.len() >= 2 * MIN_TASK_WORK {
        let t = threads.div_ceil(2);
        rayon::join(|| fold_contig(a, fold, t), || fold_contig(b, fold, t))
    } else {
        (fold_contig(a, fold, 1), fold_contig(b, fold, 1))
    };
    (fold.f)(ra, rb)
}

/// The leaf of [`fold_contig`]: 16 lanes, then a tree over the lanes.
#[inline]
fn fold_leaf<T: Element, F: Combine<T>>(x: &[T], fold: Fold<T, F>) -> T {
    let mut acc = [fold.id; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = (fold.f)(*a, v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a = (fold.f)(*a, v);
    }
    let mut width = 8;
    while width > 0 {
        for i in 0..width {
            acc[i] = (fold.f)(acc[i], acc[i + width]);
        }
        width /= 2;
    }
    acc[0]
}

/// Folds `n` elements `stride` apart starting at `first`, pairwise over leaves of
/// [`LEAF`].
fn fold_strided<T: Element, F: Combine<T>>(
    src: &[T],
    first: usize,
    stride: usize,
    n: usize,
    fold: Fold<T, F>,
) -> T {
    if n <= LEAF {
        if stride == 0 {
            // A broadcast input: the same value n times (exact for max, a product for sums
            // is not what a fold means, so fold it honestly).
            return (0..n).fold(fold.id, |a, _| (fold.f)(a, src[first]));
        }
        return run(src, first, stride, n).fold(fold.id, |a, &v| (fold.f)(a, v));
    }
    let mid = n / 2;
    let a = fold_strided(src, first, stride, mid, fold);
    let b = fold_strided(src, first + mid * stride, stride, n - mid, fold);
    (fold.f)(a, b)
}

/// Folds `n` rows of `out.len()` contiguous elements, rows `rstride` apart starting at
/// `first`, into `out`: sequentially within [`ROW_LEAF`] rows, pairwise above.
fn fold_rows<T: Element, F: Combine<T>>(
    src: &[T],
    first: usize,
    rstride: usize,
    n: usize,
    out: &mut [T],
    fold: Fold<T, F>,
) {
    let w = out.len();
    if n <= ROW_LEAF {
        out.copy_from_slice(&src[first..first + w]);
        for r in 1..n {
            let row = &src[first + r * rstride..first + r * rstride + w];
            for (d, &v) in out.iter_mut().zip(row) {
                *d = (fold.f)(*d, v);
            }
        }
        return;
    }
    let mid = n / 2;
    fold_rows(src, first, rstride, mid, out, fold);
    let mut tmp = vec![fold.id; w];
    fold_rows(src, first + mid * rstride, rstride, n - mid, &mut tmp, fold);
    for (d, &v) in out.iter_mut().zip(&tmp) {
        *d = (fold.f)(*d, v);
    }
}

/// Whether `x` is NaN (for integer types: never).
#[inline]
fn is_nan<T: Element>(x: T) -> bool {
    x.partial_cmp(&x).is_none()
}

/// For each element of the remaining dims, the index along `dim` of the first largest
/// element of `src` (read through `layout`); a NaN counts as larger than everything, so
/// the first NaN wins. `dst` gets one u32 per element of the remaining dims, row-major.
/// An empty `dim`, or one longer than `u32::MAX + 1`, is an error.
pub(crate) fn argmax<T: Element>(
    src: &[T],
    layout: &Layout,
    dim: usize,
    dst: &mut [u32],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "argmax";
    let shape = Shape::new(kernel, src, layout, dim, dst.len())?;
    let n = shape.n;
    if n == 0 && !dst.is_empty() {
        return Err(error(
            kernel,
            format_args!(
                "argmax over dim {dim} of size 0 (dims {:?}) has no value",
                layout.dims
            ),
        ));
    }
    if n > 1 << 32 {
        return Err(error(
            kernel,
            format_args!("dim {dim} has {n} elements, more than a u32 index can name"),
        ));
    }
    let walk = shape.walk();
    let is = walk.inner_strides()[0];
    let rs = shape.rstride;
    for_each_chunk(dst, 1, n, par, |start, out| {
        let mut pos = 0;
        walk.for_each_run(start, out.len(), |[first], len| {
            let out = &mut out[pos..pos + len];
            pos += len;
            if is == 1 && rs > 1 {
                for (c, tile) in out.chunks_mut(COL_TILE).enumerate() {
                    argmax_rows(src, first + c * COL_TILE, rs, n, tile);
                }
            } else {
                for (j, d) in out.iter_mut().enumerate() {
                    let o = first + j * is;
                    *d = if rs == 0 {
                        0
                    } else {
                        argmax_iter(run(src, o, rs, n))
                    };
                }
            }
        });
    });
    Ok(())
}

/// The index of the first largest item (first NaN if any); the iterator is not empty.
fn argmax_iter<'a, T: Element>(mut it: impl Iterator<Item = &'a T>) -> u32 {
    let Some(&first) = it.next() else { return 0 };
    let (mut best, mut best_i) = (first, 0u32);
    if is_nan(best) {
        return 0;
    }
    for (i, &x) in it.enumerate() {
        if is_nan(x) {
            return i as u32 + 1;
        }
        if x > best {
            best = x;
            best_i = i as u32 + 1;
        }
    }
    best_i
}

/// [`argmax`] over `n` rows of `out.len()` contiguous elements, `rstride` apart.
fn argmax_rows<T: Element>(src: &[T], first: usize, rstride: usize, n: usize, out: &mut [u32]) {
    let w = out.len();
    let mut best = src[first..first + w].to_vec();
    out.fill(0);
    for r in 1..n {
        let row = &src[first + r * rstride..first + r * rstride + w];
        for ((b, i), &x) in best.iter_mut().zip(out.iter_mut()).zip(row) {
            if !is_nan(*b) && (x > *b || is_nan(x)) {
                *b = x;
                *i = r as u32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::*;

    /// The reference: every output element folds its inputs in f64 (f32) or exactly.
    fn naive<T: Element>(op: ReduceOp, buf: &[T], l: &Layout, dim: usize) -> Vec<T> {
        let mut out_dims = l.dims;
        let n = out_dims.remove(dim);
        indices(&out_dims)
            .iter()
            .map(|idx| {
                let mut full = idx.clone();
                full.insert(dim, 0);
                let vals: Vec<T> = (0..n)
                    .map(|i| {
                        full[dim] = i;
                        at(buf, l, &full)
                    })
                    .collect();
                match op {
                    ReduceOp::Max => vals.iter().fold(T::min_value(), |a, &b| a.maximum(b)),
                    ReduceOp::Sum if T::DTYPE.is_float() => {
                        T::from_f64(vals.iter().map(|v| v.to_f64()).sum())
                    }
                    ReduceOp::Sum => vals.iter().fold(T::zero(), |a, &b| a.add(b)),
                    _ => T::from_f64(vals.iter().map(|v| v.to_f64()).sum::<f64>() / n as f64),
                }
            })
            .collect()
    }

    fn naive_argmax<T: Element>(buf: &[T], l: &Layout, dim: usize) -> Vec<u32> {
        let mut out_dims = l.dims;
        let n = out_dims.remove(dim);
        indices(&out_dims)
            .iter()
            .map(|idx| {
                let mut full = idx.clone();
                full.insert(dim, 0);
                let mut best = 0;
                for i in 0..n {
                    full[dim] = i;
                    let x = at(buf, l, &full);
                    full[dim] = best;
                    let b = at(buf, l, &full);
                    if !is_nan(b) && (is_nan(x) || x > b) {
                        best = i;
                    }
                }
                best as u32
            })
            .collect()
    }

    #[test]
    fn reduce_f32_over_every_dim() {
        let mut rng = Rng::new(10);
        for case in 0..200 {
            let rank = 1 + case % 4;
            let mut dims = rng.dims(rank, 6);
            if case % 7 == 0 {
                dims[rng.below(rank)] = 300 + rng.below(300);
            }
            let (buf, layout) = rand_f32(&mut rng, &dims);
            for dim in 0..rank {
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean] {
                    let want = naive(op, &buf, &layout, dim);
                    for par in pars() {
                        let mut out = vec![0.0; want.len()];
                        reduce(op, &buf, &layout, dim, &mut out, par).unwrap();
                        assert_close(&out, &want, 1e-5);
                    }
                }
            }
        }
    }

    #[test]
    fn reduce_integers_exactly() {
        let mut rng = Rng::new(11);
        for case in 0..100 {
            let rank = 1 + case % 3;
            let dims = rng.dims(rank, 7);
            let (buf, layout) = random_layout(&mut rng, &dims, |r| r.next_u64() as i64);
            for dim in 0..rank {
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let want = naive(op, &buf, &layout, dim);
                    let mut out = vec![0; want.len()];
                    reduce(op, &buf, &layout, dim, &mut out, Par { threads: 2 }).unwrap();
                    assert_eq!(out, want);
                }
            }
        }
        let mut m = [0u32; 1];
        reduce(
            ReduceOp::Mean,
            &[1u32, 2, 4],
            &Layout::contiguous(&[3]),
            0,
            &mut m,
            Par::serial(),
        )
        .unwrap();
        assert_eq!(m, [2]);
    }

    #[test]
    fn long_sums_are_accurate_and_thread_independent() {
        let n = 1 << 20;
        let x: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 1e-3).collect();
        let exact: f64 = x.iter().map(|&v| v as f64).sum();
        let mut serial = [0.0];
        let mut parallel = [0.0];
        let l = Layout::contiguous(&[n]);
        reduce(ReduceOp::Sum, &x, &l, 0, &mut serial, Par::serial()).unwrap();
        reduce(ReduceOp::Sum, &x, &l, 0, &mut parallel, Par { threads: 4 }).unwrap();
        assert_eq!(serial, parallel);
        assert!(
            ((serial[0] as f64 - exact) / exact).abs() < 1e-6,
            "{} vs {exact}",
            serial[0]
        );
        // Accumulating rows (sum over dim 0) is pairwise too.
        let l2 = Layout::contiguous(&[n / 4, 4]);
        let mut cols = [0.0; 4];
        reduce(ReduceOp::Sum, &x, &l2, 0, &mut cols, Par::serial()).unwrap();
        let total: f64 = cols.iter().map(|&c| c as f64).sum();
        assert!(((total - exact) / exact).abs() < 1e-6);
    }

    #[test]
    fn max_propagates_nan() {
        let x = [1.0, f32::NAN, 3.0, 2.0, 5.0, 1.0];
        let mut out = [0.0; 2];
        reduce(
            ReduceOp::Max,
            &x,
            &Layout::contiguous(&[2, 3]),
            1,
            &mut out,
            Par::serial(),
        )
        .unwrap();
        assert!(out[0].is_nan());
        assert_eq!(out[1], 5.0);
        reduce(
            ReduceOp::Max,
            &x,
            &Layout::contiguous(&[3, 2]),
            0,
            &mut out,
            Par::serial(),
        )
        .unwrap();
        assert_eq!(out[0], 5.0);
        assert!(out[1].is_nan());
    }

    #[test]
    fn argmax_matches_naive() {
        let mut rng = Rng::new(12);
        for case in 0..200 {
            let rank = 1 + case % 4;
            let dims = rng.dims(rank, 6);
            // Few distinct values, so ties are common; some NaNs.
            let (buf, layout) = random_layout(&mut rng, &dims, |r| match r.below(20) {
                0 => f32::NAN,
                v => (v % 4) as f32,
            });
            for dim in 0..rank {
                let want = naive_argmax(&buf, &layout, dim);
                for par in pars() {
                    let mut out = vec![0; want.len()];
                    argmax(&buf, &layout, dim, &mut out, par).unwrap();
                    assert_eq!(out, want, "dims {dims:?} dim {dim} {layout:?}");
                }
            }
            let (ibuf, il) = random_layout(&mut rng, &dims, |r| r.below(5) as u32);
            let want = naive_argmax(&ibuf, &il, rank - 1);
            let mut out = vec![0; want.len()];
            argmax(&ibuf, &il, rank - 1, &mut out, Par::serial()).unwrap();
            assert_eq!(out, want);
        }
    }

    #[test]
    fn errors_and_empty_dims() {
        let x = [1.0f32; 6];
        let l = Layout::contiguous(&[2, 3]);
        let mut out = [0.0; 2];
        let e = reduce(ReduceOp::Sum, &x, &l, 2, &mut out, Par::serial()).unwrap_err();
        assert!(e.0.contains("dim 2"), "{e}");
        assert!(reduce(ReduceOp::Sum, &x, &l, 1, &mut out[..1], Par::serial()).is_err());
        assert!(reduce(ReduceOp::Sum, &x[..5], &l, 1, &mut out, Par::serial()).is_err());
        assert!(reduce(ReduceOp::ArgMax, &x, &l, 1, &mut out, Par::serial()).is_err());
        let empty = Layout::contiguous(&[2, 0]);
        reduce(ReduceOp::Sum, &x, &empty, 1, &mut out, Par::serial()).unwrap();
        assert_eq!(out, [0.0, 0.0]);
        reduce(ReduceOp::Mean, &x, &empty, 1, &mut out, Par::serial()).unwrap();
        assert!(out[0].is_nan());
        assert!(reduce(ReduceOp::Max, &x, &empty, 1, &mut out, Par::serial()).is_err());
        let mut idx = [0u32; 2];
        assert!(argmax(&x, &empty, 1, &mut idx, Par::serial()).is_err());
        assert!(argmax(&x, &l, 3, &mut idx, Par::serial()).is_err());
        assert!(argmax(&x, &l, 1, &mut idx[..1], Par::serial()).is_err());
        // Reducing dim 0 of [0, 3] gives 3 zeros; reducing dim 1 gives nothing.
        let mut three = [1.0; 3];
        reduce(
            ReduceOp::Sum,
            &x,
            &Layout::contiguous(&[0, 3]),
            0,
            &mut three,
            Par::serial(),
        )
        .unwrap();
        assert_eq!(three, [0.0; 3]);
        argmax(&x, &Layout::contiguous(&[0, 3]), 1, &mut [], Par::serial()).unwrap();
    }
}
