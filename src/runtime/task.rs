//! A task: one op of a flushed segment, ready to run, with the slots it reads and
//! fills. Both executors run tasks; the stream makes them and recycles their vectors.

use std::sync::Arc;

use super::Slot;
use crate::ir::relative::RelativeOp;
use crate::ir::Op;

/// One op ready to run: its description, the slots it reads and fills, and its relative
/// form in the segment it was queued in.
#[derive(Debug)]
pub(crate) struct Task {
    /// What to compute.
    pub op: Op,
    /// The slots of `op.inputs`, in order.
    pub inputs: Vec<Arc<Slot>>,
    /// The slot of `op.output`.
    pub output: Option<Arc<Slot>>,
    /// The op with ids numbered by first appearance in its segment (the plan-cache key
    /// and the plan's value numbers).
    pub rel: RelativeOp,
}

impl Task {
    /// Lets go of the task's slots (the last reference of a slot recycles it), keeping
    /// the emptied vectors for reuse.
    pub(crate) fn release_slots(&mut self) {
        for s in self.inputs.drain(..) {
            Slot::release(s);
        }
        if let Some(s) = self.output.take() {
            Slot::release(s);
        }
    }
}
