//! Walking strided layouts in row-major order.
//!
//! Kernels write their output contiguously, so what they need from an input layout is:
//! "for output elements `start..start + len`, where are the inputs?". A [`Walk`] answers in
//! *runs*: pieces of one row of the innermost dimension, given as the buffer offset of the
//! first element of each input plus a length; within a run, input `k` advances by
//! [`Walk::inner_strides`]`[k]`. The kernel then runs a tight loop over the run, picking
//! a specialised loop from the inner strides (1: a slice, 0: a broadcast scalar, else
//! a strided iterator).
//!
//! Before walking, [`Walk::new`] simplifies the layouts jointly: size-1 dims are dropped
//! and neighbouring dims `i, i+1` are merged whenever *every* input has
//! `strides[i] == strides[i+1] * dims[i+1]`. A contiguous tensor thus becomes one long run,
//! `[rows, n] + [n]` (strides `[n, 1]` and `[0, 1]`) stays two dims with a contiguous
//! inner run for both inputs, and a broadcast of a scalar becomes one run of stride 0.

use crate::ir::Dims;

/// A joint walk over `N` layouts that share the same dims.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walk<const N: usize> {
    /// The simplified outer dims (all but the innermost), outermost first.
    outer_dims: Dims,
    /// `outer_strides[k][j]`: the stride of input `k` along outer dim `j`.
    outer_strides: [Dims; N],
    /// Length of the innermost (simplified) dim; 1 for a scalar.
    inner_len: usize,
    /// Stride of each input along the innermost dim.
    inner_strides: [usize; N],
    /// Offset of element `[0, 0, ...]` in each input's buffer.
    offsets: [usize; N],
}

impl<const N: usize> Walk<N> {
    /// The walk over no elements' layouts of rank 0 (a placeholder in arrays of walks).
    pub(crate) const EMPTY: Walk<N> = Walk {
        outer_dims: Dims::new(),
        outer_strides: [Dims::new(); N],
        inner_len: 1,
        inner_strides: [0; N],
        offsets: [0; N],
    };

    /// Simplifies `N` layouts with the same `dims` (given by their strides and offsets).
    pub(crate) fn new(dims: &[usize], strides: [&[usize]; N], offsets: [usize; N]) -> Walk<N> {
        // Collected innermost first.
        let mut sdims = Dims::new();
        let mut sstrides: [Dims; N] = [Dims::new(); N];
        for i in (0..dims.len()).rev() {
            let d = dims[i];
            if d == 1 {
                continue;
            }
            if let Some(&last_d) = sdims.last() {
                let mergeable = (0..N).all(|k| {
                    let last_s = *sstrides[k].last().expect("same length as sdims");
                    last_s.checked_mul(last_d) == Some(strides[k][i])
                });
                if mergeable && d != 0 {
                    let len = sdims.len();
                    sdims[len - 1] = last_d * d;
                    continue;
                }
            }
            sdims.push(d);
            for k in 0..N {
                sstrides[k].push(strides[k][i]);
            }
        }
        if sdims.is_empty() {
            sdims.push(1);
            for s in sstrides.iter_mut() {
                s.push(0);
            }
        }
        sdims.reverse();
        for s in sstrides.iter_mut() {
            s.reverse();
        }
        let inner_len = sdims.remove(sdims.len() - 1);
        let inner_strides = std::array::from_fn(|k| {
            let n = sstrides[k].len();
            sstrides[k].remove(n - 1)
        });
        Walk {
            outer_dims: sdims,
            outer_strides: sstrides,
            inner_len,
            inner_strides,
            offsets,
        }
    }

    /// How far each input moves between neighbouring elements of a run.
    pub(crate) fn inner_strides(&self) -> [usize; N] {
        self.inner_strides
    }

    /// Calls `f(offsets, run_len)` for the runs that cover output elements
    /// `start..start + len` in row-major order; `offsets[k]` is where input `k`'s first
    /// element of the run is. The caller guarantees `start + len <= numel`.
    pub(crate) fn for_each_run(
        &self,
        start: usize,
        len: usize,
        mut f: impl FnMut([usize; N], usize),
    ) {
        if len == 0 || self.inner_len == 0 {
            return;
        }
        let row = start / self.inner_len;
        let mut col = start % self.inner_len;
        // Odometer over the outer dims, with the offsets of the current row.
        let mut idx = Dims::zeros(self.outer_dims.len());
        let mut offs = self.offsets;
        let mut rem = row;
        for j in (0..self.outer_dims.len()).rev() {
            let d = self.outer_dims[j];
            idx[j] = rem % d;
            rem /= d;
            for (o, s) in offs.iter_mut().zip(&self.outer_strides) {
                *o += idx[j] * s[j];
            }
        }
        let mut left = len;
        loop {
            let run = (self.inner_len - col).min(left);
            let first: [usize; N] = std::array::from_fn(|k| offs[k] + col * self.inner_strides[k]);
            f(first, run);
            left -= run;
            if left == 0 {
                return;
            }
            col = 0;
            for j in (0..self.outer_dims.len()).rev() {
                idx[j] += 1;
                for (o, s) in offs.iter_mut().zip(&self.outer_strides) {
                    *o += s[j];
                }
                if idx[j] < self.outer_dims[j] {
                    break;
                }
                idx[j] = 0;
                for (o, s) in offs.iter_mut().zip(&self.outer_strides) {
                    *o -= s[j] * self.outer_dims[j];
                }
            }
        }
    }
}

/// The buffer offset of the `linear`-th element (row-major) of a layout given by its
/// dims, strides and offset. The caller guarantees `linear < numel`.
pub(crate) fn offset_of(dims: &[usize], strides: &[usize], offset: usize, linear: usize) -> usize {
    let mut rem = linear;
    let mut off = offset;
    for (&d, &s) in dims.iter().zip(strides).rev() {
        if d == 0 {
            return offset;
        }
        off += (rem % d) * s;
        rem /= d;
    }
    off
}

/// The elements of a run of `len` elements starting at `first` with stride `stride`
/// (`len >= 1`, `stride >= 1`, and the run lies inside `src`). Stride-0 runs are a
/// single broadcast value; callers handle them separately.
#[inline]
pub(crate) fn run<T>(
    src: &[T],
    first: usize,
    stride: usize,
    len: usize,
) -> impl Iterator<Item = &T> {
    debug_assert!(stride > 0 && len > 0);
    src[first..=first + (len - 1) * stride]
        .iter()
        .step_by(stride.max(1))
}

/// Copies elements `start..start + out.len()` (row-major) of a walked input into `out`.
#[inline(always)]
pub(crate) fn copy_runs<T: Copy>(src: &[T], walk: &Walk<1>, start: usize, out: &mut [T]) {
    let stride = walk.inner_strides()[0];
    let mut pos = 0;
    walk.for_each_run(start, out.len(), |[first], len| {
        let out = &mut out[pos..pos + len];
        pos += len;
        match stride {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Layout;

    fn runs<const N: usize>(w: &Walk<N>, start: usize, len: usize) -> Vec<([usize; N], usize)> {
        let mut v = Vec::new();
        w.for_each_run(start, len, |o, n| v.push((o, n)));
        v
    }

    #[test]
    fn contiguous_is_one_run() {
        let l = Layout::contiguous(&[2, 3, 4]);
        let w = Walk::new(&l.dims, [&l.strides], [5]);
        assert_eq!(runs(&w, 0, 24), vec![([5], 24)]);
        assert_eq!(runs(&w, 7, 3), vec![([12], 3)]);
    }

    #[test]
    fn row_broadcast_keeps_two_dims() {
        let a = Layout::contiguous(&[3, 4]);
        let b = Layout::contiguous(&[4]).broadcast_as(&[3, 4]).unwrap();
        let w = Walk::new(&a.dims, [&a.strides, &b.strides], [0, 0]);
        assert_eq!(w.inner_strides(), [1, 1]);
        assert_eq!(runs(&w, 2, 7), vec![([2, 2], 2), ([4, 0], 4), ([8, 0], 1)]);
    }

    #[test]
    fn transposed_and_scalar() {
        let t = Layout::contiguous(&[3, 2]).permute(&[1, 0]);
        let w = Walk::new(&t.dims, [&t.strides], [0]);
        assert_eq!(w.inner_strides(), [2]);
        assert_eq!(runs(&w, 0, 6), vec![([0], 3), ([1], 3)]);
        let s = Layout::contiguous(&[]).broadcast_as(&[2, 3]).unwrap();
        let w = Walk::new(&s.dims, [&s.strides], [4]);
        assert_eq!(w.inner_strides(), [0]);
        assert_eq!(runs(&w, 1, 5), vec![([4], 5)]);
        let r0 = Walk::new(&[], [&[]], [3]);
        assert_eq!(runs(&r0, 0, 1), vec![([3], 1)]);
    }

    #[test]
    fn offsets_of_elements() {
        let l = Layout::contiguous(&[4, 6]).narrow(1, 2, 3);
        assert_eq!(offset_of(&l.dims, &l.strides, l.offset, 4), 6 + 3);
        let v: Vec<usize> = run(&[0, 1, 2, 3, 4, 5, 6], 1, 3, 2).copied().collect();
        assert_eq!(v, vec![1, 4]);
    }
}
