//! Strided layouts: how a tensor's logical dims map onto a flat buffer.
//!
//! A [`Layout`] is `dims`, `strides` (in elements, one per dim) and an `offset` into the
//! buffer. Element `[i0, i1, ...]` lives at `offset + i0 * strides[0] + i1 * strides[1] +
//! ...`. Views (transpose, permute, narrow, broadcast, most reshapes) only build a new
//! layout over the same buffer; a stride of 0 repeats an element (broadcasting). Every
//! layout the engine builds stays inside its buffer: `offset + max_index() < buffer.len()`
//! is checked by the kernels before they index.

use super::{Dims, MAX_RANK};

/// Dims, strides (in elements) and offset of a tensor over its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Size of each dimension, outermost first.
    pub(crate) dims: Dims,
    /// Distance in elements between neighbours along each dimension.
    pub(crate) strides: Dims,
    /// Index of element `[0, 0, ...]` in the buffer.
    pub(crate) offset: usize,
}

/// Row-major strides of a contiguous tensor with these dims.
pub(crate) fn contiguous_strides(dims: &[usize]) -> Dims {
    let mut strides = Dims::zeros(dims.len());
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(dims).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
    }
    strides
}

impl Layout {
    /// The row-major layout of a fresh buffer with these dims.
    pub fn contiguous(dims: &[usize]) -> Layout {
        Layout {
            dims: Dims::from_slice(dims),
            strides: contiguous_strides(dims),
            offset: 0,
        }
    }

    /// Size of each dimension, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Distance in elements between neighbours along each dimension (0 repeats an
    /// element: a broadcast dimension).
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Index of element `[0, 0, ...]` in the tensor's buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of logical elements (1 for a scalar of rank 0).
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether the elements are laid out row-major without gaps (offset may be non-zero).
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1usize;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            if d != 1 && s != acc {
                return false;
            }
            acc *= d;
        }
        true
    }

    /// The largest buffer index this layout touches, or `None` for an empty tensor.
    pub(crate) fn max_index(&self) -> Option<usize> {
        if self.dims.contains(&0) {
            return None;
        }
        Some(
            self.offset
                + self
                    .dims
                    .iter()
                    .zip(&self.strides)
                    .map(|(&d, &s)| (d - 1) * s)
                    .sum::<usize>(),
        )
    }

    /// Whether a buffer of `len` elements holds every element of this layout.
    #[cfg(test)]
    pub(crate) fn fits_in(&self, len: usize) -> bool {
        match self.max_index() {
            None => true,
            Some(m) => m < len,
        }
    }

    /// The layout that reads this tensor as if it had `dims` (numpy broadcasting: dims are
    /// matched from the right; a dim of 1 may grow, new leading dims are added). `None`
    /// when the dims are not compatible.
    pub(crate) fn broadcast_as(&self, dims: &[usize]) -> Option<Layout> {
        if dims.len() < self.rank() {
            return None;
        }
        let lead = dims.len() - self.rank();
        let mut strides = Dims::zeros(dims.len());
        for (i, &d) in dims.iter().enumerate().skip(lead) {
            let sd = self.dims[i - lead];
            if sd == d {
                strides[i] = if d == 1 { 0 } else { self.strides[i - lead] };
            } else if sd == 1 {
                strides[i] = 0;
            } else {
                return None;
            }
        }
        Some(Layout {
            dims: Dims::from_slice(dims),
            strides,
            offset: self.offset,
        })
    }

    /// The layout with dims (and strides) reordered: new dim `i` is old dim `perm[i]`.
    /// The caller has checked that `perm` is a permutation of `0..rank`.
    pub(crate) fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            dims: perm.iter().map(|&p| self.dims[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// The layout of `len` elements of dim `dim` starting at `start`. The caller has
    /// checked `start + len <= dims[dim]`.
    pub(crate) fn narrow(&self, dim: usize, start: usize, len: usize) -> Layout {
        let mut out = *self;
        out.dims[dim] = len;
        if len > 0 {
            out.offset += start * self.strides[dim];
        }
        out
    }

    /// The layout with a dim of size 1 inserted at `dim` (`dim <= rank`).
    pub(crate) fn unsqueeze(&self, dim: usize) -> Layout {
        let mut out = *self;
        let stride = if dim < self.rank() {
            self.strides[dim] * self.dims[dim]
        } else {
            1
        };
        out.dims.insert(dim, 1);
        out.strides.insert(dim, stride);
        out
    }

    /// The layout with dim `dim` (of size 1) removed.
    pub(crate) fn squeeze(&self, dim: usize) -> Layout {
        let mut out = *self;
        out.dims.remove(dim);
        out.strides.remove(dim);
        out
    }

    /// The layout that reads these elements in row-major order with new `dims`, without a
    /// copy, when the strides allow it (each new dim must fall inside a run of old dims
    /// that are contiguous with each other). `None` when a copy is needed. The caller has
    /// checked that the element counts agree.
    pub(crate) fn reshape(&self, dims: &[usize]) -> Option<Layout> {
        if self.is_contiguous() {
            return Some(Layout {
                dims: Dims::from_slice(dims),
                strides: contiguous_strides(dims),
                offset: self.offset,
            });
        }
        // Merge old dims into chunks that are mutually contiguous, then split each chunk
        // across the new dims that cover exactly its element count.
        // (dim, stride) pairs of the old dims other than 1, kept inline.
        let mut old = [(0usize, 0usize); MAX_RANK];
        let mut n_old = 0;
        for (&d, &s) in self.dims.iter().zip(&self.strides) {
            if d != 1 {
                old[n_old] = (d, s);
                n_old += 1;
            }
        }
        let old = &old[..n_old];
        let mut strides = Dims::zeros(dims.len());
        let mut oi = 0;
        let mut ni = 0;
        while ni < dims.len() {
            if dims[ni] == 1 {
                strides[ni] = 1;
                ni += 1;
                continue;
            }
            if oi >= old.len() {
                return None;
            }
            // A chunk of old dims [oi, oj) that is contiguous in itself.
            let mut oj = oi + 1;
            let mut chunk = old[oi].0;
            let mut want = dims[ni];
            let mut nj = ni + 1;
            loop {
                if chunk == want {
                    break;
                }
                if chunk < want {
                    if oj >= old.len() || old[oj - 1].1 != old[oj].0 * old[oj].1 {
                        return None;
                    }
                    chunk *= old[oj].0;
                    oj += 1;
                } else {
                    if nj >= dims.len() {
                        return None;
                    }
                    want *= dims[nj];
                    nj += 1;
                }
            }
            // Assign strides to new dims ni..nj from the innermost old stride outwards.
            let mut stride = old[oj - 1].1;
            for k in (ni..nj).rev() {
                strides[k] = stride;
                stride *= dims[k];
            }
            oi = oj;
            ni = nj;
        }
        if oi != old.len() {
            return None;
        }
        Some(Layout {
            dims: Dims::from_slice(dims),
            strides,
            offset: self.offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_and_transposed() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.strides, vec![12, 4, 1]);
        assert!(l.is_contiguous());
        let t = l.permute(&[0, 2, 1]);
        assert!(!t.is_contiguous());
        assert_eq!(t.max_index(), Some(23));
    }

    #[test]
    fn broadcast_rules() {
        let l = Layout::contiguous(&[3, 1]);
        let b = l.broadcast_as(&[2, 3, 4]).unwrap();
        assert_eq!(b.strides, vec![0, 1, 0]);
        assert!(l.broadcast_as(&[2, 4, 4]).is_none());
    }

    #[test]
    fn reshape_of_views() {
        // A narrowed matrix can merge its rows only if they are adjacent.
        let l = Layout::contiguous(&[4, 6]).narrow(1, 0, 3);
        assert!(l.reshape(&[12]).is_none());
        assert_eq!(l.reshape(&[4, 3, 1]).unwrap().strides, vec![6, 1, 1]);
        // A transposed tensor split along one of its dims stays a view.
        let t = Layout::contiguous(&[6, 4]).permute(&[1, 0]);
        let r = t.reshape(&[4, 2, 3]).unwrap();
        assert_eq!(r.strides, vec![1, 12, 4]);
        assert!(t.reshape(&[24]).is_none());
    }
}
