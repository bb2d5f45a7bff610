//! Moving data without arithmetic: [`fill`], [`copy`] (strided to contiguous), [`cast`]
//! (between element types) and [`cat`] (joining tensors along a dim).
//!
//! `copy` and `cast` are the element-wise [`map`] with an identity or a
//! conversion; a contiguous input is one run, so `copy` of a contiguous tensor is a
//! `memcpy` (split into chunks when large). `cat` views the output as
//! `[outer, sum of sizes along dim, inner]`: in each outer row, every input owns one
//! contiguous block, which is filled by walking that input's layout.

use std::any::Any;

use super::elementwise::map;
use super::par::for_each_chunk;
use super::strided::{copy_runs, Walk};
use super::{check_dst, check_input, error, KernelError, Par};
use crate::ir::{Element, Layout};

/// Sets every element of `dst` to `value`.
pub(crate) fn fill<T: Element>(dst: &mut [T], value: T) {
    dst.fill(value);
}

/// Copies the elements of `src`, read through `layout`, into `dst` in row-major order
/// (materialises a view: transpose, narrow, broadcast).
pub fn copy<T: Element>(
    src: &[T],
    layout: &Layout,
    dst: &mut [T],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "copy";
    let numel = check_input(kernel, "src", src.len(), layout)?;
    check_dst(kernel, dst.len(), numel)?;
    map(src, layout, dst, par, 1, |x| x);
    Ok(())
}

/// Converts the elements of `src`, read through `layout`, to `D` and writes them to `dst`
/// in row-major order.
///
/// The conversion is `D::from_f64(x.to_f64())` (saturating for integers, NaN to 0), which
/// agrees with Rust's `as` for every pair of types here except `i64 -> f32`, where `as`
/// (one rounding instead of two) is used. Same-type casts are plain copies.
pub(crate) fn cast<S: Element, D: Element>(
    src: &[S],
    layout: &Layout,
    dst: &mut [D],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "cast";
    let numel = check_input(kernel, "src", src.len(), layout)?;
    check_dst(kernel, dst.len(), numel)?;
    map(src, layout, dst, par, 1, convert::<S, D>);
    Ok(())
}

/// One element of [`cast`]. The type tests are on `TypeId`s known at compile time, so
/// each instance folds to a single conversion.
#[inline(always)]
fn convert<S: Element, D: Element>(x: S) -> D {
    let any: &dyn Any = &x;
    if let Some(&same) = any.downcast_ref::<D>() {
        return same;
    }
    if let Some(&v) = any.downcast_ref::<i64>() {
        let rounded: &dyn Any = &(v as f32);
        if let Some(&d) = rounded.downcast_ref::<D>() {
            return d;
        }
    }
    D::from_f64(x.to_f64())
}

/// Joins tensors along `dim`: all inputs have the same rank and the same dims except
/// `dim`; `dst` receives the result (dims of the first input with `dims[dim]` the sum)
/// contiguously.
pub(crate) fn cat<T: Element>(
    srcs: &[(&[T], &Layout)],
    dim: usize,
    dst: &mut [T],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "cat";
    let Some((_, first)) = srcs.first() else {
        return Err(error(kernel, "no inputs"));
    };
    let rank = first.dims.len();
    if dim >= rank {
        return Err(error(
            kernel,
            format_args!("dim {dim} out of range for rank {rank}"),
        ));
    }
    let mut total = 0usize;
    for (i, (buf, layout)) in srcs.iter().enumerate() {
        check_input(kernel, &format!("input {i}"), buf.len(), layout)?;
        let same = layout.dims.len() == rank
            && (0..rank).all(|d| d == dim || layout.dims[d] == first.dims[d]);
        if !same {
            return Err(error(
                kernel,
                format_args!(
                    "input {i} has dims {:?} but input 0 has {:?}; they may differ only in dim {dim}",
                    layout.dims, first.dims
                ),
            ));
        }
        total = total
            .checked_add(layout.dims[dim])
            .ok_or_else(|| error(kernel, "output size overflows"))?;
    }
    let outer: usize = first.dims[..dim].iter().product();
    let inner: usize = first.dims[dim + 1..].iter().product();
    let row = total
        .checked_mul(inner)
        .ok_or_else(|| error(kernel, "output size overflows"))?;
    let numel = outer
        .checked_mul(row)
        .ok_or_else(|| error(kernel, "output size overflows"))?;
    check_dst(kernel, dst.len(), numel)?;
    let walks: Vec<(Walk<1>, usize)> = srcs
        .iter()
        .map(|(_, l)| {
            (
                Walk::new(&l.dims, [&l.strides], [l.offset]),
                l.dims[dim] * inner,
            )
        })
        .collect();
    for_each_chunk(dst, row, row, par, |first_row, out| {
        for (r, out_row) in out.chunks_exact_mut(row).enumerate() {
            let o = first_row + r;
            let mut col = 0;
            for ((buf, _), (walk, width)) in srcs.iter().zip(&walks) {
                let block = &mut out_row[col..col + width];
                col += width;
                copy_runs(buf, walk, o * width, block);
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::*;

    #[test]
    fn copy_matches_gather_on_random_views() {
        let mut rng = Rng::new(1);
        for case in 0..300 {
            let rank = case % 5;
            let dims = rng.dims(rank, 6);
            let (buf, layout) = rand_f32(&mut rng, &dims);
            let want = gather(&buf, &layout);
            for par in pars() {
                let mut out = vec![0.0; want.len()];
                copy(&buf, &layout, &mut out, par).unwrap();
                assert_eq!(out, want, "layout {layout:?}");
            }
        }
    }

    #[test]
    fn copy_errors() {
        let buf = vec![0.0f32; 6];
        let l = Layout::contiguous(&[2, 3]);
        let mut out = vec![0.0; 5];
        let e = copy(&buf, &l, &mut out, Par::serial()).unwrap_err();
        assert!(
            e.0.contains("copy") && e.0.contains("5") && e.0.contains("6"),
            "{e}"
        );
        let mut out = vec![0.0; 6];
        assert!(copy(&buf[..5], &l, &mut out, Par::serial()).is_err());
        let bad = Layout {
            dims: vec![3, 3].into(),
            strides: vec![usize::MAX / 2, 1].into(),
            offset: 0,
        };
        assert!(copy(&buf, &bad, &mut out, Par::serial())
            .unwrap_err()
            .0
            .contains("overflows"));
        let ragged = Layout {
            dims: vec![2, 3].into(),
            strides: vec![3].into(),
            offset: 0,
        };
        assert!(copy(&buf, &ragged, &mut out, Par::serial()).is_err());
        // An empty tensor fits anywhere.
        let empty = Layout::contiguous(&[0, 3]);
        copy(&buf[..0], &empty, &mut [], Par::serial()).unwrap();
    }

    #[test]
    fn fill_sets_everything() {
        let mut v = vec![0u32; 7];
        fill(&mut v, 3);
        assert!(v.iter().all(|&x| x == 3));
    }

    #[test]
    fn cast_between_types() {
        let mut rng = Rng::new(2);
        for _ in 0..50 {
            let dims = rng.dims(3, 5);
            let (buf, layout) = random_layout(&mut rng, &dims, |r| r.f32() * 1000.0);
            let want: Vec<i64> = gather(&buf, &layout).iter().map(|&x| x as i64).collect();
            let mut out = vec![0i64; want.len()];
            cast(&buf, &layout, &mut out, Par { threads: 2 }).unwrap();
            assert_eq!(out, want);
            let mut back = vec![0f32; want.len()];
            cast(&out, &Layout::contiguous(&dims), &mut back, Par::serial()).unwrap();
            assert!(back.iter().zip(&want).all(|(&b, &w)| b == w as f32));
        }
        let src = [-1.5f32, f32::NAN, 3e9, 7.9, f32::INFINITY];
        let mut out = [0u32; 5];
        cast(&src, &Layout::contiguous(&[5]), &mut out, Par::serial()).unwrap();
        assert_eq!(out, [0, 0, 3_000_000_000, 7, u32::MAX]);
        // i64 -> f32 rounds once, like `as`.
        let big = [(1i64 << 60) + (1 << 36) + 1];
        let mut f = [0f32];
        cast(&big, &Layout::contiguous(&[1]), &mut f, Par::serial()).unwrap();
        assert_eq!(f[0], big[0] as f32);
        // i64 -> u32 saturates.
        let mut u = [0u32; 2];
        cast(
            &[-5i64, 1 << 40],
            &Layout::contiguous(&[2]),
            &mut u,
            Par::serial(),
        )
        .unwrap();
        assert_eq!(u, [0, u32::MAX]);
        assert!(cast(
            &src,
            &Layout::contiguous(&[5]),
            &mut out[..4],
            Par::serial()
        )
        .is_err());
    }

    #[test]
    fn cat_matches_naive() {
        let mut rng = Rng::new(3);
        for case in 0..200 {
            let rank = 1 + case % 4;
            let dims = rng.dims(rank, 5);
            let dim = rng.below(rank);
            let n = 1 + rng.below(3);
            let mut inputs = Vec::new();
            for _ in 0..n {
                let mut d = dims.clone();
                d[dim] = rng.below(4);
                inputs.push(random_layout(&mut rng, &d, |r| r.below(1000) as u32));
            }
            let refs: Vec<(&[u32], &Layout)> =
                inputs.iter().map(|(b, l)| (b.as_slice(), l)).collect();
            let mut out_dims = dims.clone();
            out_dims[dim] = inputs.iter().map(|(_, l)| l.dims[dim]).sum();
            let want: Vec<u32> = indices(&out_dims)
                .iter()
                .map(|idx| {
                    let mut idx = idx.clone();
                    for (b, l) in &inputs {
                        if idx[dim] < l.dims[dim] {
                            return at(b, l, &idx);
                        }
                        idx[dim] -= l.dims[dim];
                    }
                    unreachable!()
                })
                .collect();
            for par in pars() {
                let mut out = vec![0; want.len()];
                cat(&refs, dim, &mut out, par).unwrap();
                assert_eq!(out, want);
            }
        }
    }

    #[test]
    fn cat_errors() {
        let a = [0f32; 6];
        let la = Layout::contiguous(&[2, 3]);
        let lb = Layout::contiguous(&[3, 2]);
        let mut out = vec![0.0; 12];
        assert!(cat::<f32>(&[], 0, &mut out, Par::serial())
            .unwrap_err()
            .0
            .contains("no inputs"));
        assert!(cat(&[(&a[..], &la)], 2, &mut out, Par::serial())
            .unwrap_err()
            .0
            .contains("dim 2"));
        let e = cat(&[(&a[..], &la), (&a[..], &lb)], 0, &mut out, Par::serial()).unwrap_err();
        assert!(e.0.contains("input 1"), "{e}");
        assert!(cat(
            &[(&a[..], &la), (&a[..], &la)],
            0,
            &mut out[..11],
            Par::serial()
        )
        .is_err());
        assert!(cat(&[(&a[..5], &la)], 0, &mut out[..6], Par::serial()).is_err());
        cat(&[(&a[..], &la), (&a[..], &la)], 1, &mut out, Par::serial()).unwrap();
    }
}
