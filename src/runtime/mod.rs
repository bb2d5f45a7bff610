//! The runtime: buffers and their pool, tensor slots, and the executors that run a
//! flushed segment's ops on the kernels.
//!
//! The runtime knows nothing of streams or handles. It is given [`Task`]s (an op with
//! the slots it reads and fills) in an order where every input is made before it is
//! read, and it runs them: through a cached plan, level by level (`execute`), or op by
//! op with fusion off (`op_by_op`); either way each kernel is run by `dispatch`.

mod containment;
mod dispatch;
mod execute;
#[cfg(test)]
pub(crate) mod fault;
mod memory;
pub mod observer;
mod op_by_op;
mod prepack;
mod slot;
mod storage;
mod task;
mod threads;

pub use dispatch::panic_message;
pub use execute::{execute_plan, PlanScratch};
pub use memory::{
    live_buffers, live_bytes, peak_bytes, pool_limit, pooled_arena_bytes, pooled_bytes,
    reset_peak_bytes, set_pool_limit, trim_pools,
};
pub use op_by_op::execute;
pub use slot::{Slot, SlotState};
pub use storage::{Data, DataMut, StorageElement, TensorBuffer};
pub use task::Task;
pub use threads::{kernel_spin, kernel_threads, run_in_pool, set_kernel_spin};
