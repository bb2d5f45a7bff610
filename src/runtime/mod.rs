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
mod load;
mod memory;
pub mod observer;
mod op_by_op;
mod prepack;
mod slot;
mod storage;
mod task;
mod threads;

pub(crate) use dispatch::panic_message;
pub(crate) use execute::{execute_plan, PlanScratch};
pub(crate) use load::{allowed, room};
pub use load::{load_aware, set_load_aware};
pub(crate) use memory::{
    live_buffers, live_bytes, peak_bytes, pooled_arena_bytes, pooled_bytes, reset_peak_bytes,
};
pub use memory::{pool_limit, set_pool_limit, trim_pools};
pub(crate) use op_by_op::execute;
pub(crate) use slot::{Slot, SlotState};
pub use storage::External;
pub(crate) use storage::{Data, DataMut, StorageElement, TensorBuffer};
pub(crate) use task::Task;
pub use threads::{kernel_spin, set_kernel_spin};
pub(crate) use threads::{kernel_threads, kernel_threads_unstarted, run_in_pool};
