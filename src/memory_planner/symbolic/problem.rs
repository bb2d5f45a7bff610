//! A symbolic problem ([`SymProblem`]): the buffers of a [`Problem`] with sizes that
//! are [`TDim`]s, and the concrete problem at given values of the symbols.

use super::super::{Buffer, InPlace, PlanError, Problem};
use super::TDim;

/// A buffer whose size is an expression of the symbols.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SymBuffer {
    /// The caller's id (shown in errors only).
    pub(crate) id: usize,
    /// First step at which the buffer is live.
    pub(crate) lower: u64,
    /// First step at which it is no longer live.
    pub(crate) upper: u64,
    /// Size in bytes, rounded up to a multiple of `alignment` (at least one).
    pub(crate) size: TDim,
    /// Required alignment of its offset in bytes.
    pub(crate) alignment: u64,
}

/// A [`Problem`] whose sizes are expressions of `symbols` symbols.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SymProblem {
    /// The buffers; offsets come back in this order.
    pub(crate) buffers: Vec<SymBuffer>,
    /// Outputs that may be written over dying inputs (see [`InPlace`]).
    pub(crate) in_place: Vec<InPlace>,
    /// How many symbols the sizes use (values are given for `0..symbols`).
    pub(crate) symbols: usize,
}

impl SymProblem {
    /// The size of buffer `b` at `values`, rounded to its alignment (at least one).
    pub(crate) fn size_at(&self, b: usize, values: &[u64]) -> Result<u64, PlanError> {
        let buf = &self.buffers[b];
        let raw = buf.size.eval(values).ok_or_else(|| PlanError::Overflow {
            context: format!(
                "size {} of buffer {b} (id {}) at symbol values {values:?}",
                buf.size, buf.id
            ),
        })?;
        let a = buf.alignment.max(1);
        raw.max(1)
            .checked_next_multiple_of(a)
            .ok_or_else(|| PlanError::Overflow {
                context: format!("size of buffer {b} (id {}) rounded to {a}", buf.id),
            })
    }

    /// The concrete problem at `values` (one per symbol).
    pub(crate) fn at(&self, values: &[u64]) -> Result<Problem, PlanError> {
        self.check_values(values)?;
        let mut buffers = Vec::with_capacity(self.buffers.len());
        for (i, b) in self.buffers.iter().enumerate() {
            buffers.push(Buffer {
                id: b.id,
                lower: b.lower,
                upper: b.upper,
                size: self.size_at(i, values)?,
                alignment: b.alignment,
            });
        }
        let mut p = Problem::new(buffers);
        p.in_place = self.in_place.clone();
        Ok(p)
    }

    pub(super) fn check_values(&self, values: &[u64]) -> Result<(), PlanError> {
        if values.len() != self.symbols {
            return Err(PlanError::Symbols {
                expected: self.symbols,
                got: values.len(),
            });
        }
        Ok(())
    }
}
