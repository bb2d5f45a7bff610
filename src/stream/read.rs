//! Reading a tensor: running what it still waits for, and copying its elements out.
//!
//! Two callers need a pending tensor of some stream made: an op recorded on another
//! stream that reads it (`stream::record`), and a read of its values (`Tensor::to_vec`).
//! Both use one rule, [`drain`]: the tensor's own thread flushes its whole queue (the
//! Drops queued after the producer belong in the segment), any other thread flushes
//! the home stream only up to the op that makes the tensor. A read then waits on the
//! tensor's slot, in case another thread had already taken that op out
//! ([`materialize`]). The copy out of a strided layout runs with the reading thread's
//! kernel budget, on the kernel pool when it is worth it ([`copy_out`]).

use std::sync::Arc;

use super::{FlushReason, Stream, LOCAL};
use crate::error::{Error, Result};
use crate::ir::{Layout, TensorId};
use crate::kernels::{self, worth_splitting, KernelError, Par};
use crate::runtime::{room, run_in_pool, Slot, SlotState, StorageElement, TensorBuffer};

/// Runs what the pending tensor in `slot` (made by stream `home`) waits for, as far as
/// the calling thread needs: all of `home`'s queue when `home` is the calling thread's
/// own stream, up to the tensor's producer otherwise. Returns at once for a tensor that
/// is not pending. A producer already taken out by another flush is not waited for.
pub(crate) fn drain(home: &Arc<Stream>, slot: &Slot, reason: FlushReason) {
    if !slot.is_pending() {
        return;
    }
    if super::is_current(home.id()) {
        home.flush(u64::MAX, reason);
    } else if crate::trace::enabled() {
        traced_drain(home, slot, reason);
    } else {
        home.flush(slot.producer(), reason);
    }
}

/// [`drain`] of another stream while a trace records: the flush it causes starts an
/// arrow that ends in this stream's drain.
#[cold]
#[inline(never)]
fn traced_drain(home: &Arc<Stream>, slot: &Slot, reason: FlushReason) {
    let mark = crate::trace::drain_begin();
    home.flush(slot.producer(), reason);
    let tensor = match reason {
        FlushReason::Read(t) | FlushReason::Drain { tensor: t, .. } => t.0,
        _ => 0,
    };
    let by = LOCAL.try_with(|s| s.0.id().0).unwrap_or(0);
    crate::trace::drain_end(mark, by, home.id().0, tensor);
}

/// The buffer of tensor `id` (in `slot`, made by `home`), once made: drains what it
/// waits for and waits for it; the error of the op that failed to make it otherwise.
pub(crate) fn materialize(
    id: TensorId,
    slot: &Slot,
    home: &Arc<Stream>,
) -> Result<Arc<TensorBuffer>> {
    drain(home, slot, FlushReason::Read(id));
    slot.wait_ready();
    match slot.state() {
        SlotState::Ready(b) => Ok(b),
        SlotState::Failed(e) => Err(e),
        SlotState::Pending => Err(Error::Kernel {
            op: "to_vec",
            msg: format!("{id} was not computed by its stream (engine bug)"),
        }),
    }
}

/// Copies the elements of `src` read through `layout` into `out`, contiguously, with
/// the calling thread's kernel budget (`set_kernel_threads`): on the kernel pool when
/// the stream may use several threads and the copy is large enough to split.
pub(crate) fn copy_out<T: StorageElement>(
    src: &[T],
    layout: &Layout,
    out: &mut [T],
) -> std::result::Result<(), KernelError> {
    let par = LOCAL
        .try_with(|s| s.0.par())
        .unwrap_or_else(|_| Par::serial());
    let threads = if par.threads > 1 && worth_splitting(out.len()) {
        room(par.threads)
    } else {
        1
    };
    if threads > 1 {
        run_in_pool(threads, || kernels::copy(src, layout, out, Par { threads }))
    } else {
        kernels::copy(src, layout, out, Par::serial())
    }
}
