//! Where a chain's panels lie: the output seen as `batch` matrices of `m × n`
//! ([`Geometry`], with the checks of the head's operands against it), the cut into
//! panels of whole rows ([`PanelLayout`], [`Panel`]), and an operand's layout narrowed
//! to one panel's rows.

use super::super::strided::offset_of;
use super::super::{check_input, error, numel_of, KernelError};
use super::ChainMatMul;
use crate::ir::Layout;
use crate::kernels::product::Rhs;

/// How the output is cut into panels: `per_matrix` panels of `rows` rows (the last
/// one of a matrix may be shorter) for each matrix.
#[derive(Clone, Copy, Debug)]
pub(super) struct PanelLayout {
    pub(super) rows: usize,
    pub(super) per_matrix: usize,
}

impl PanelLayout {
    pub(super) fn panel(self, g: &Geometry<'_>, t: usize) -> Panel {
        let (b, r0) = (t / self.per_matrix, (t % self.per_matrix) * self.rows);
        Panel {
            b,
            r0,
            rows: self.rows.min(g.m - r0),
        }
    }

    /// Flat index of the first element of panel `t` (`t` may be the panel count).
    pub(super) fn start(self, g: &Geometry<'_>, t: usize) -> usize {
        if t >= g.batch * self.per_matrix {
            return g.batch * g.m * g.n;
        }
        let p = self.panel(g, t);
        (p.b * g.m + p.r0) * g.n
    }
}

/// The output seen as `batch` matrices of `m × n` (a rank-1 output is one row).
pub(super) struct Geometry<'d> {
    pub(super) dims: &'d [usize],
    pub(super) batch_dims: &'d [usize],
    pub(super) batch: usize,
    pub(super) m: usize,
    pub(super) n: usize,
}

impl<'d> Geometry<'d> {
    pub(super) fn new(
        kernel: &str,
        dims: &'d [usize],
        matmul: bool,
    ) -> Result<Geometry<'d>, KernelError> {
        let rank = dims.len();
        if rank == 0 || (matmul && rank < 2) {
            return Err(error(
                kernel,
                format_args!("output dims {dims:?} have too few dims for the chain"),
            ));
        }
        let batch_dims = &dims[..rank.saturating_sub(2)];
        Ok(Geometry {
            dims,
            batch_dims,
            batch: numel_of(kernel, batch_dims)?,
            m: if rank >= 2 { dims[rank - 2] } else { 1 },
            n: dims[rank - 1],
        })
    }

    /// Checks the head's operands against the output; returns the inner dim `k`.
    pub(super) fn check_matmul(
        &self,
        kernel: &str,
        mm: &ChainMatMul<'_>,
        n_inputs: usize,
    ) -> Result<usize, KernelError> {
        let (ld, rd) = (&mm.lhs.1.dims, &mm.rhs.1.dims);
        let rank = self.dims.len();
        let k = ld.last().copied().unwrap_or(0);
        let ok = ld.len() == rank
            && rd.len() == rank
            && ld[..rank - 2] == *self.batch_dims
            && rd[..rank - 2] == *self.batch_dims
            && ld[rank - 2] == self.m
            && rd[rank - 2] == k
            && rd[rank - 1] == self.n;
        if !ok || mm.input >= n_inputs {
            return Err(error(
                kernel,
                format_args!(
                    "cannot multiply lhs dims {ld:?} by rhs dims {rd:?} into {:?} (program input {})",
                    self.dims, mm.input
                ),
            ));
        }
        check_input(kernel, "lhs", mm.lhs.0.len(), mm.lhs.1)?;
        // A packed right operand is read from its panels, not from the slice (which is
        // empty for a weight kept only packed); the product checks the panels fit.
        if let Rhs::Elements(r) = mm.rhs.0 {
            check_input(kernel, "rhs", r.len(), mm.rhs.1)?;
        }
        Ok(k)
    }

    /// Rows `p.r0..p.r0 + p.rows` of matrix `p.b` of a layout with this geometry's
    /// batch dims and any last two dims `[_, cols]`, as a 2-D layout `[p.rows, cols]` (a
    /// rank-1 layout is one row). The caller keeps the rows inside the matrix.
    pub(super) fn panel_layout(&self, l: &Layout, p: Panel) -> Layout {
        let rank = l.dims.len();
        let cols = l.dims[rank - 1];
        let col_stride = l.strides[rank - 1];
        if rank == 1 {
            return Layout {
                dims: [1, cols].into(),
                strides: [0, col_stride].into(),
                offset: l.offset,
            };
        }
        let row_stride = l.strides[rank - 2];
        let base = offset_of(self.batch_dims, &l.strides[..rank - 2], l.offset, p.b);
        Layout {
            dims: [p.rows, cols].into(),
            strides: [row_stride, col_stride].into(),
            offset: base + p.r0 * row_stride,
        }
    }
}

/// Rows `r0..r0 + rows` of matrix `b`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Panel {
    pub(super) b: usize,
    pub(super) r0: usize,
    pub(super) rows: usize,
}
