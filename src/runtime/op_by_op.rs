//! The op-by-op executor (fusion off): runs a flushed segment op by op and fills in the
//! slots; the reference the plan executor is tested against.
//!
//! [`execute`] takes the tasks of a segment in queue order. For each it reads the input
//! slots (all `Ready` by construction: an input is either made earlier in the same
//! segment or was made before the op was recorded), allocates the output from the pool,
//! calls the kernel, and sets the output slot. A task whose input failed fails too,
//! with the same error, without running; a kernel error, or an output the system has
//! no memory for ([`Error::OutOfMemory`]), fails the task and is returned as the
//! segment's first error. Each task is dropped right after it runs, so a buffer goes
//! back to the pool as soon as its last reader has run.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::dispatch::caught;
use super::{Data, SlotState, Task, TensorBuffer};
use crate::error::Error;
use crate::ir::{Op, OpKind};
use crate::kernels::{KernelError, Par};
use crate::ops;

/// Runs `tasks` in order with kernels limited to `par`; returns the first error. Each
/// task lets go of its slots right after it runs, so a buffer goes back to the pool as
/// soon as its last reader has run. With `trace` (a stream's lane, while a trace
/// records) each op is recorded.
pub(crate) fn execute<'a>(
    tasks: impl IntoIterator<Item = &'a mut Task>,
    par: Par,
    trace: Option<u64>,
) -> Option<Error> {
    let mut first_error = None;
    for task in tasks {
        let start = trace.map(|_| crate::trace::now());
        run_task(task, par, &mut first_error);
        if let (Some(lane), Some(start), Some(_)) = (trace, start, &task.output) {
            crate::trace::op(lane, start, &task.op);
        }
        task.release_slots();
    }
    super::memory::segment_done();
    first_error
}

/// Runs one task and fills its output slot; a kernel error is also kept in
/// `first_error` (if that holds none yet).
fn run_task(task: &Task, par: Par, first_error: &mut Option<Error>) {
    {
        let Some(out) = &task.output else { return };
        let state = match gather(task) {
            Err(e) => SlotState::Failed(e),
            Ok(inputs) => match catch_unwind(AssertUnwindSafe(|| run(&task.op, &inputs, par)))
                .unwrap_or_else(|panic| {
                    Err(Error::Kernel {
                        op: task.op.kind.name(),
                        msg: caught(&*panic).0,
                    })
                }) {
                Ok(buffer) => SlotState::Ready(buffer),
                Err(e) => {
                    log::debug!("kernel error in {}: {e}", task.op);
                    first_error.get_or_insert_with(|| e.clone());
                    SlotState::Failed(e)
                }
            },
        };
        out.set(state);
    }
}

/// The input buffers of a task, or the error of a failed input.
fn gather(task: &Task) -> Result<Vec<Arc<TensorBuffer>>, Error> {
    task.inputs
        .iter()
        .zip(&task.op.inputs)
        .map(|(slot, desc)| match slot.state() {
            SlotState::Ready(b) => Ok(b),
            SlotState::Failed(e) => Err(e),
            SlotState::Pending => Err(Error::Kernel {
                op: task.op.kind.name(),
                msg: format!("input {} was never computed (engine bug)", desc.id),
            }),
        })
        .collect()
}

/// Runs one op's kernel on its input buffers and returns a fresh output buffer (or,
/// for a view, the input's buffer). Errors name the op.
fn run(op: &Op, inputs: &[Arc<TensorBuffer>], par: Par) -> Result<Arc<TensorBuffer>, Error> {
    #[cfg(test)]
    super::fault::check();
    let name = op.kind.name();
    let kernel = |e: KernelError| Error::Kernel { op: name, msg: e.0 };
    crate::kernels::cpu::check().map_err(kernel)?;
    let out = op
        .output
        .as_ref()
        .ok_or_else(|| kernel(KernelError("op without output".into())))?;
    if let OpKind::View = op.kind {
        return Ok(inputs[0].clone());
    }
    let mut buffer =
        TensorBuffer::shared(out.dtype, out.layout.numel()).map_err(|e| e.error(name))?;
    let data: Vec<Data<'_>> = inputs.iter().map(|b| b.data()).collect();
    let out = Arc::get_mut(&mut buffer)
        .ok_or_else(|| kernel(KernelError("a fresh buffer is shared (engine bug)".into())))?;
    ops::run(op, &data, None, out.data_mut(), par).map_err(kernel)?;
    Ok(buffer)
}
