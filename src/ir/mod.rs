//! The intermediate representation: ids, dtypes, layouts, op descriptions, and the
//! relative form of a segment.
//!
//! Everything here is plain data with no behaviour tied to a stream or a kernel. Tensors
//! are SSA values: every op output gets a fresh [`TensorId`] and is never written again.
//! The relative form renumbers the ids of a run of ops by first appearance, so that the
//! same computation on different tensors has the same key (see [`relative`]).

mod dims;
mod dtype;
mod layout;
mod op;
pub mod relative;

pub use dims::{Dims, MAX_RANK};
pub use dtype::{DType, Element};
pub use layout::{contiguous_strides, Layout};
pub use op::{BinaryOp, Op, OpKind, ReduceOp, TensorDesc, UnaryOp};

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The SSA id of a tensor: unique for the life of the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u64);

impl TensorId {
    /// A fresh id, never handed out before.
    pub fn fresh() -> TensorId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TensorId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}
