//! Gathering by index: [`index_select`].
//!
//! The output is viewed as `[outer, n_indices, inner]`, where `outer` is the product of
//! the dims before `dim` and `inner` of those after it. Every index is read and checked
//! once, up front, so a bad index is an error before anything is written, and the copy
//! loop itself cannot fail. Each output row of `inner` elements is then copied from the
//! selected slice of the input (a `memcpy` when the input's inner dims are contiguous,
//! as for an embedding lookup).

use std::fmt::Debug;

use super::par::for_each_chunk;
use super::strided::{offset_of, run, Walk};
use super::{check_dst, check_input, error, numel_of, KernelError, Par};
use crate::ir::{Element, Layout};

/// Picks slices of `src` along `dim` by index: output element `[.., i, ..]` (with `i` at
/// `dim`) is input element `[.., indices[i], ..]`. `indices` is 1-D (`u32` or `i64`, any
/// stride); the output has the input's dims with `dims[dim]` replaced by the number of
/// indices. A negative index, or one `>= dims[dim]`, is an error that names it, its
/// position and the dim size.
pub(crate) fn index_select<T: Element, I: Element>(
    src: &[T],
    layout: &Layout,
    indices: &[I],
    indices_layout: &Layout,
    dim: usize,
    dst: &mut [T],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "index_select";
    check_input(kernel, "src", src.len(), layout)?;
    check_input(kernel, "indices", indices.len(), indices_layout)?;
    let rank = layout.dims.len();
    if dim >= rank {
        return Err(error(
            kernel,
            format_args!("dim {dim} out of range for dims {:?}", layout.dims),
        ));
    }
    if indices_layout.dims.len() != 1 {
        return Err(error(
            kernel,
            format_args!("indices must be 1-D, got dims {:?}", indices_layout.dims),
        ));
    }
    let size = layout.dims[dim];
    let ids = read_indices(kernel, indices, indices_layout, size, dim)?;
    let mut out_dims = layout.dims;
    out_dims[dim] = ids.len();
    check_dst(kernel, dst.len(), numel_of(kernel, &out_dims)?)?;
    let outer_dims = &layout.dims[..dim];
    let outer_strides = &layout.strides[..dim];
    let stride = layout.strides[dim];
    let inner_dims = &layout.dims[dim + 1..];
    let inner: usize = inner_dims.iter().product();
    // Walks the inner dims from offset 0; each row adds its own base.
    let walk = Walk::new(inner_dims, [&layout.strides[dim + 1..]], [0]);
    let is = walk.inner_strides()[0];
    for_each_chunk(dst, inner, inner, par, |first_row, out| {
        for (r, out_row) in out.chunks_exact_mut(inner).enumerate() {
            let row = first_row + r;
            let (o, j) = (row / ids.len(), row % ids.len());
            let base = offset_of(outer_dims, outer_strides, layout.offset, o) + ids[j] * stride;
            let mut pos = 0;
            walk.for_each_run(0, inner, |[first], len| {
                let first = base + first;
                let out = &mut out_row[pos..pos + len];
                pos += len;
                match is {
                    1 => out.copy_from_slice(&src[first..first + len]),
                    0 => out.fill(src[first]),
                    s => {
                        for (d, &x) in out.iter_mut().zip(run(src, first, s, len)) {
                            *d = x;
                        }
                    }
                }
            });
        }
    });
    Ok(())
}

/// Reads and range-checks the indices.
fn read_indices<I: Element + Debug>(
    kernel: &str,
    indices: &[I],
    layout: &Layout,
    size: usize,
    dim: usize,
) -> Result<Vec<usize>, KernelError> {
    let n = layout.dims[0];
    (0..n)
        .map(|p| {
            let v = indices[layout.offset + p * layout.strides[0]];
            match v.to_index() {
                Some(i) if i >= 0 && (i as u64) < size as u64 => Ok(i as usize),
                _ => Err(error(
                    kernel,
                    format_args!(
                        "index {v:?} at position {p} is out of range for dim {dim} of size {size}"
                    ),
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::*;

    #[test]
    fn matches_naive() {
        let mut rng = Rng::new(30);
        for case in 0..300 {
            let rank = 1 + case % 4;
            let dims = rng.dims(rank, 5);
            let dim = rng.below(rank);
            let (buf, l) = random_layout(&mut rng, &dims, |r| r.below(1000) as i64);
            let n_idx = rng.below(6);
            let (ibuf, il) = random_layout(&mut rng, &[n_idx], |r| r.below(dims[dim]) as u32);
            let ids = gather(&ibuf, &il);
            let mut out_dims = dims.clone();
            out_dims[dim] = n_idx;
            let want: Vec<i64> = indices(&out_dims)
                .iter()
                .map(|idx| {
                    let mut idx = idx.clone();
                    idx[dim] = ids[idx[dim]] as usize;
                    at(&buf, &l, &idx)
                })
                .collect();
            for par in pars() {
                let mut out = vec![0; want.len()];
                index_select(&buf, &l, &ibuf, &il, dim, &mut out, par).unwrap();
                assert_eq!(out, want);
                let wide: Vec<i64> = ibuf.iter().map(|&i| i as i64).collect();
                index_select(&buf, &l, &wide, &il, dim, &mut out, par).unwrap();
                assert_eq!(out, want);
            }
        }
    }

    #[test]
    fn bad_indices_are_errors() {
        let x = [0f32; 6];
        let l = Layout::contiguous(&[3, 2]);
        let il = Layout::contiguous(&[2]);
        let mut out = [0.0; 4];
        let e = index_select(&x, &l, &[0i64, 3], &il, 0, &mut out, Par::serial()).unwrap_err();
        assert_eq!(
            e.0,
            "index_select: index 3 at position 1 is out of range for dim 0 of size 3"
        );
        let e = index_select(&x, &l, &[-1i64, 0], &il, 0, &mut out, Par::serial()).unwrap_err();
        assert!(e.0.contains("index -1 at position 0"), "{e}");
        let e = index_select(&x, &l, &[0u32, 2], &il, 1, &mut out, Par::serial()).unwrap_err();
        assert!(e.0.contains("dim 1 of size 2"), "{e}");
        assert!(index_select(&x, &l, &[0u32, 1], &il, 2, &mut out, Par::serial()).is_err());
        assert!(index_select(&x, &l, &[0u32, 1], &il, 0, &mut out[..3], Par::serial()).is_err());
        assert!(index_select(&x, &l, &[0u32], &il, 0, &mut out, Par::serial()).is_err());
        let e = index_select(
            &x,
            &l,
            &[0u32, 1],
            &Layout::contiguous(&[1, 2]),
            0,
            &mut out,
            Par::serial(),
        )
        .unwrap_err();
        assert!(e.0.contains("1-D"), "{e}");
        // Out-of-range indices into an empty dim, and no indices at all.
        let e = index_select(
            &x,
            &Layout::contiguous(&[0, 2]),
            &[0u32],
            &Layout::contiguous(&[1]),
            0,
            &mut [],
            Par::serial(),
        );
        assert!(e.is_err());
        index_select(
            &x,
            &l,
            &[0u32; 0],
            &Layout::contiguous(&[0]),
            0,
            &mut [],
            Par::serial(),
        )
        .unwrap();
    }
}
