//! The runtime: buffers and their pool, tensor slots, and the executor that runs a
//! flushed segment's ops on the kernels.
//!
//! The runtime knows nothing of streams or handles. It is given [`Task`]s (an op with
//! the slots it reads and fills) in an order where every input is made before it is
//! read, and it runs them.

mod chain;
mod containment;
mod execute;
#[cfg(test)]
pub(crate) mod fault;
pub mod observer;
mod op_by_op;
mod slot;
mod storage;
mod threads;

pub use execute::{execute_plan, PlanScratch};
pub use op_by_op::{execute, panic_message, run_into, Task};
pub use slot::{Slot, SlotState};
pub use storage::{
    live_buffers, live_bytes, peak_bytes, pool_limit, pooled_arena_bytes, pooled_bytes,
    reset_peak_bytes, set_pool_limit, size_class, trim_pools, AllocError, Buffer, Data, DataMut,
    Storage, StorageElement, POOL_LIMIT_FLOOR,
};
pub use threads::{kernel_threads, run_in_pool};
