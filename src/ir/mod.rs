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
pub(crate) mod relative;

pub(crate) use dims::Dims;
pub use dims::MAX_RANK;
pub use dtype::DType;
pub(crate) use dtype::Element;
pub use layout::Layout;
pub use op::{BinaryOp, UnaryOp};
pub(crate) use op::{Op, OpKind, ReduceOp, TensorDesc};

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The SSA id of a tensor: unique for the life of the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u64);

impl TensorId {
    /// A fresh id, never handed out before. Each thread takes ids from the process-wide
    /// counter in blocks, so handing one out is usually a thread-local increment.
    pub fn fresh() -> TensorId {
        const BLOCK: u64 = 1024;
        static NEXT: AtomicU64 = AtomicU64::new(1);
        thread_local! {
            static RANGE: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
        }
        let from_block = RANGE.try_with(|r| {
            let (mut next, mut end) = r.get();
            if next == end {
                next = NEXT.fetch_add(BLOCK, Ordering::Relaxed);
                end = next + BLOCK;
            }
            r.set((next + 1, end));
            next
        });
        TensorId(from_block.unwrap_or_else(|_| NEXT.fetch_add(1, Ordering::Relaxed)))
    }
}

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}
