//! The plan cache's signature of a segment: each op in relative form, its layouts in
//! codes of the segment's symbols, so that a lookup can confirm, op by op, that a
//! stored plan was made for this very segment (hashes alone may collide).

use crate::ir::relative::{RelativeOp, SymLayout};
use crate::ir::{DType, Op, OpKind};

/// One input or output of a stored op: relative id, dtype, layout in codes.
pub(super) type SigValue = (u32, DType, SymLayout);

/// One op of a stored segment, in relative form with its layouts in codes.
#[derive(Debug)]
pub(super) struct SigOp {
    pub(super) kind: OpKind,
    pub(super) inputs: Vec<SigValue>,
    pub(super) output: Option<SigValue>,
}

impl SigOp {
    /// The op in codes; `None` when a layout number is not among `symbols` (never, for
    /// the symbols of the op's own segment).
    pub(super) fn new(op: &Op, rel: &RelativeOp, symbols: &[usize]) -> Option<SigOp> {
        let value = |d: &crate::ir::TensorDesc, r: u32| -> Option<SigValue> {
            Some((r, d.dtype, SymLayout::new(&d.layout, symbols)?))
        };
        Some(SigOp {
            kind: op.kind.clone(),
            inputs: op
                .inputs
                .iter()
                .zip(&rel.inputs)
                .map(|(d, &r)| value(d, r))
                .collect::<Option<_>>()?,
            output: match (&op.output, rel.output) {
                (Some(d), Some(r)) => Some(value(d, r)?),
                _ => None,
            },
        })
    }

    /// Whether `op` (relative form `rel`) is this op at the values `symbols`.
    pub(super) fn matches(&self, op: &Op, rel: &RelativeOp, symbols: &[usize]) -> bool {
        let same = |s: &SigValue, d: &crate::ir::TensorDesc, r: u32| {
            s.0 == r && s.1 == d.dtype && s.2.matches(&d.layout, symbols)
        };
        self.kind == op.kind
            && self.inputs.len() == op.inputs.len()
            && self
                .inputs
                .iter()
                .zip(op.inputs.iter().zip(&rel.inputs))
                .all(|(s, (d, &r))| same(s, d, r))
            && match (&self.output, &op.output, rel.output) {
                (None, None, None) => true,
                (Some(s), Some(d), Some(r)) => same(s, d, r),
                _ => false,
            }
    }
}
