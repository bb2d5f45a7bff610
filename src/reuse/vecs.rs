//! Bounded stacks of emptied vectors, kept for their capacity.

use std::sync::Arc;

use crate::ir::TensorDesc;
use crate::runtime::{Slot, Task};

/// Emptied vectors of executed tasks, kept so that queuing the next ops allocates
/// nothing.
#[derive(Debug, Default)]
pub(crate) struct Spares {
    pub(crate) descs: Vec<Vec<TensorDesc>>,
    pub(crate) slots: Vec<Vec<Arc<Slot>>>,
    pub(crate) ids: Vec<Vec<u32>>,
}

impl Spares {
    /// The most vectors of each kind kept.
    const MAX: usize = 1 << 14;

    pub(crate) fn descs(&mut self) -> Vec<TensorDesc> {
        self.descs.pop().unwrap_or_default()
    }

    pub(crate) fn slots(&mut self) -> Vec<Arc<Slot>> {
        self.slots.pop().unwrap_or_default()
    }

    pub(crate) fn ids(&mut self) -> Vec<u32> {
        self.ids.pop().unwrap_or_default()
    }

    /// Keeps a finished task's vectors (its slots already released).
    pub(crate) fn keep(&mut self, task: &mut Task) {
        debug_assert!(task.inputs.is_empty() && task.output.is_none());
        let mut descs = std::mem::take(&mut task.op.inputs);
        let slots = std::mem::take(&mut task.inputs);
        let mut ids = std::mem::take(&mut task.rel.inputs);
        if self.descs.len() < Self::MAX && descs.capacity() > 0 {
            descs.clear();
            self.descs.push(descs);
        }
        if self.slots.len() < Self::MAX && slots.capacity() > 0 {
            self.slots.push(slots); // emptied by release_slots
        }
        if self.ids.len() < Self::MAX && ids.capacity() > 0 {
            ids.clear();
            self.ids.push(ids);
        }
    }
}
