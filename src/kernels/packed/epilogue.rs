//! The epilogue a tile applies to its sums before it stores them: one [`Step`] type,
//! planned with a program input as each add's operand (`Step<u8>`, what a chain's
//! plan stores, `chain::TileEpilogue`) and bound to the values a panel reads
//! (`Step<Operand>`, an [`Epilogue`], what the tiles run).

use std::fmt;

/// One step of a tile's epilogue: what the tile does to each of its sums (the product
/// so far, or the result of the steps before) before it stores it. `A` is what an add
/// reads: as a chain's plan stores it, the program input (`Step<u8>`,
/// `chain::TileEpilogue`); bound to the panel a tile runs, the values themselves
/// (`Step<Operand>`, an [`Epilogue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step<A> {
    /// The sum plus `operand`.
    Add {
        /// What is added.
        operand: A,
        /// Whether the sum is the add's first operand (which NaN payload an add of
        /// two NaNs keeps, so the bits follow the program's operand order).
        sum_first: bool,
    },
    /// GELU of the sum (`math::gelu`, bit for bit).
    Gelu,
}

impl<A: Copy> Step<A> {
    /// The step with its add's operand replaced by `bind(operand)`; `None` when that
    /// gives none.
    pub(crate) fn bind<B>(self, bind: impl FnOnce(A) -> Option<B>) -> Option<Step<B>> {
        Some(match self {
            Step::Add { operand, sum_first } => Step::Add {
                operand: bind(operand)?,
                sum_first,
            },
            Step::Gelu => Step::Gelu,
        })
    }
}

/// What an add of a bound [`Step`] reads.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operand<'a> {
    /// `values[j]` for column `j` of every row (one value per column of the product):
    /// a bias.
    Columns(&'a [f32]),
    /// Element `(i, j)` of a matrix with the product's shape, at
    /// `data[offset + i * stride + j]`: a residual.
    Rows {
        /// The matrix's buffer.
        data: &'a [f32],
        /// Where its row 0 starts.
        offset: usize,
        /// Elements from one row to the next.
        stride: usize,
    },
}

#[cfg(test)]
impl Step<Operand<'_>> {
    /// The step on `acc`, element `(i, j)` of the product, in scalar code (the same
    /// value as the tile's; which NaN an add of two NaNs gives is not kept): the
    /// tests' reference.
    pub(super) fn apply_scalar(self, acc: f32, i: usize, j: usize) -> f32 {
        match self {
            Step::Add {
                operand: Operand::Columns(values),
                ..
            } => acc + values[j],
            Step::Add {
                operand:
                    Operand::Rows {
                        data,
                        offset,
                        stride,
                    },
                ..
            } => acc + data[offset + i * stride + j],
            Step::Gelu => crate::kernels::math::gelu(acc),
        }
    }
}

impl fmt::Display for Operand<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Columns(values) => write!(f, "a bias of {} values", values.len()),
            Operand::Rows {
                data,
                offset,
                stride,
            } => write!(
                f,
                "a residual of {} elements read from {offset} with row stride {stride}",
                data.len()
            ),
        }
    }
}

impl fmt::Display for Step<Operand<'_>> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Add { operand, .. } => operand.fmt(f),
            Step::Gelu => f.write_str("GELU"),
        }
    }
}

/// Element-wise steps the f32 tile applies to its accumulators, in order, before it
/// stores them: a matmul epilogue (bias, residual, GELU) run in registers, without a
/// pass over the output. Every step is the same IEEE operation (or the same GELU) the
/// element-wise program would do, so the bits are the program's.
pub(crate) type Epilogue<'a> = &'a [Step<Operand<'a>>];
