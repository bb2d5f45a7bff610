//! The executor: runs a flushed segment op by op and fills in the slots.
//!
//! [`execute`] takes the tasks of a segment in queue order. For each it reads the input
//! slots (all `Ready` by construction: an input is either made earlier in the same
//! segment or was made before the op was recorded), allocates the output from the pool,
//! calls the kernel, and sets the output slot. A task whose input failed fails too,
//! with the same error, without running; a kernel error, or an output the system has
//! no memory for ([`Error::OutOfMemory`]), fails the task and is returned as the
//! segment's first error. Each task is dropped right after it runs, so a buffer goes
//! back to the pool as soon as its last reader has run.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::{Buffer, Data, DataMut, Slot, SlotState, StorageElement};
use crate::error::Error;
use crate::ir::relative::RelativeOp;
use crate::ir::{DType, Dims, Element, Layout, Op, OpKind, ReduceOp};
use crate::kernels::{self, KernelError, Par};

/// One op ready to run: its description, the slots it reads and fills, and its relative
/// form in the segment it was queued in.
#[derive(Debug)]
pub struct Task {
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
    pub fn release_slots(&mut self) {
        for s in self.inputs.drain(..) {
            Slot::release(s);
        }
        if let Some(s) = self.output.take() {
            Slot::release(s);
        }
    }
}

/// Runs `tasks` in order with kernels limited to `par`; returns the first error. Each
/// task lets go of its slots right after it runs, so a buffer goes back to the pool as
/// soon as its last reader has run.
pub fn execute<'a>(tasks: impl IntoIterator<Item = &'a mut Task>, par: Par) -> Option<Error> {
    let mut first_error = None;
    for task in tasks {
        run_task(task, par, &mut first_error);
        task.release_slots();
    }
    super::storage::segment_done();
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

/// The message of a caught panic.
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// A panic caught at a kernel's boundary, as the kernel's error.
pub(crate) fn caught(panic: &(dyn Any + Send)) -> KernelError {
    KernelError(format!("panicked: {}", panic_message(panic)))
}

/// The input buffers of a task, or the error of a failed input.
fn gather(task: &Task) -> Result<Vec<Arc<Buffer>>, Error> {
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

fn typed<'a, T: StorageElement>(d: Data<'a>) -> Result<&'a [T], KernelError> {
    T::from_data(d).ok_or_else(|| {
        KernelError(format!(
            "an input holds other elements than the {} expected (engine bug)",
            T::DTYPE
        ))
    })
}

/// The output's elements as `T`; an engine bug if they are of another type.
fn dst<T: StorageElement>(d: DataMut<'_>) -> Result<&mut [T], KernelError> {
    T::from_data_mut(d).ok_or_else(|| {
        KernelError(format!(
            "the output holds other elements than the {} written (engine bug)",
            T::DTYPE
        ))
    })
}

/// Calls `$body` with `$T` bound to the Rust type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::U32 => {
                type $T = u32;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
        }
    };
}

/// Runs one op's kernel on its input buffers and returns a fresh output buffer (or,
/// for a view, the input's buffer). Errors name the op.
fn run(op: &Op, inputs: &[Arc<Buffer>], par: Par) -> Result<Arc<Buffer>, Error> {
    #[cfg(test)]
    super::fault::check();
    let name = op.kind.name();
    let kernel = |e: KernelError| Error::Kernel { op: name, msg: e.0 };
    let out = op
        .output
        .as_ref()
        .ok_or_else(|| kernel(KernelError("op without output".into())))?;
    if let OpKind::View = op.kind {
        return Ok(inputs[0].clone());
    }
    let mut buffer = Buffer::shared(out.dtype, out.layout.numel()).map_err(|e| e.error(name))?;
    let data: Vec<Data<'_>> = inputs.iter().map(|b| b.data()).collect();
    let out = Arc::get_mut(&mut buffer)
        .ok_or_else(|| kernel(KernelError("a fresh buffer is shared (engine bug)".into())))?;
    run_into(op, &data, out.data_mut(), par).map_err(kernel)?;
    Ok(buffer)
}

/// Runs one op's kernel: reads `inputs` (in the op's input order, through the layouts
/// of `op.inputs`) and writes the output contiguously into `out`.
pub fn run_into(
    op: &Op,
    inputs: &[Data<'_>],
    out: DataMut<'_>,
    par: Par,
) -> Result<(), KernelError> {
    let desc = op
        .output
        .as_ref()
        .ok_or_else(|| KernelError("op without output".into()))?;
    if inputs.len() != op.inputs.len() {
        return Err(KernelError(format!(
            "{} inputs given for {} (engine bug)",
            inputs.len(),
            op
        )));
    }
    let lay = |i: usize| &op.inputs[i].layout;
    let input = |i: usize| inputs[i];
    let b = out;
    match &op.kind {
        OpKind::Fill { value } => with_dtype!(desc.dtype, T => {
            kernels::fill(dst::<T>(b)?, T::from_f64(f64::from_bits(*value)))
        }),
        OpKind::Unary(u) => kernels::unary(*u, typed(input(0))?, lay(0), dst(b)?, par)?,
        OpKind::Binary(bin) => {
            let l = broadcast(lay(0), &desc.layout.dims)?;
            let r = broadcast(lay(1), &desc.layout.dims)?;
            with_dtype!(desc.dtype, T => kernels::binary::<T>(
                *bin,
                typed(input(0))?,
                &l,
                typed(input(1))?,
                &r,
                dst(b)?,
                par,
            )?)
        }
        OpKind::Cast => with_dtype!(op.inputs[0].dtype, S => {
            with_dtype!(desc.dtype, T => {
                kernels::cast::<S, T>(typed(input(0))?, lay(0), dst(b)?, par)?
            })
        }),
        OpKind::Contiguous => with_dtype!(desc.dtype, T => {
            kernels::copy::<T>(typed(input(0))?, lay(0), dst(b)?, par)?
        }),
        OpKind::View => {
            return Err(KernelError("a view has no kernel (engine bug)".into()));
        }
        OpKind::MatMul => {
            let (l, r) = matmul_layouts(lay(0), lay(1), &desc.layout.dims)?;
            kernels::matmul(typed(input(0))?, &l, typed(input(1))?, &r, dst(b)?, par)?
        }
        OpKind::Reduce {
            op: ReduceOp::ArgMax,
            dim,
            ..
        } => with_dtype!(op.inputs[0].dtype, S => {
            kernels::argmax::<S>(typed(input(0))?, lay(0), *dim, dst(b)?, par)?
        }),
        OpKind::Reduce { op: r, dim, .. } => with_dtype!(desc.dtype, T => {
            kernels::reduce::<T>(*r, typed(input(0))?, lay(0), *dim, dst(b)?, par)?
        }),
        OpKind::Softmax => kernels::softmax(typed(input(0))?, lay(0), dst(b)?, par)?,
        OpKind::LayerNorm { eps } => kernels::layer_norm(
            typed(input(0))?,
            lay(0),
            typed(input(1))?,
            lay(1),
            typed(input(2))?,
            lay(2),
            f64::from_bits(*eps),
            dst(b)?,
            par,
        )?,
        OpKind::RmsNorm { eps } => kernels::rms_norm(
            typed(input(0))?,
            lay(0),
            typed(input(1))?,
            lay(1),
            f64::from_bits(*eps),
            dst(b)?,
            par,
        )?,
        OpKind::IndexSelect { dim } => with_dtype!(desc.dtype, T => {
            with_dtype!(op.inputs[1].dtype, I => kernels::index_select::<T, I>(
                typed(input(0))?,
                lay(0),
                typed(input(1))?,
                lay(1),
                *dim,
                dst(b)?,
                par,
            )?)
        }),
        OpKind::Cat { dim } => with_dtype!(desc.dtype, T => {
            let srcs = inputs
                .iter()
                .zip(&op.inputs)
                .map(|(x, d)| Ok((typed::<T>(*x)?, &d.layout)))
                .collect::<Result<Vec<_>, KernelError>>()?;
            kernels::cat::<T>(&srcs, *dim, dst(b)?, par)?
        }),
        OpKind::Drop => {}
    }
    Ok(())
}

fn broadcast(layout: &Layout, dims: &[usize]) -> Result<Layout, KernelError> {
    layout.broadcast_as(dims).ok_or_else(|| {
        KernelError(format!(
            "cannot broadcast {:?} to {dims:?} (engine bug)",
            layout.dims
        ))
    })
}

/// The operand layouts of a batched matmul with their batch dims broadcast to the
/// output's.
fn matmul_layouts(
    l: &Layout,
    r: &Layout,
    out_dims: &[usize],
) -> Result<(Layout, Layout), KernelError> {
    let batch = &out_dims[..out_dims.len() - 2];
    let with_batch = |x: &Layout| {
        let mut dims = Dims::from_slice(batch);
        for &d in &x.dims[x.rank() - 2..] {
            dims.push(d);
        }
        broadcast(x, &dims)
    };
    Ok((with_batch(l)?, with_batch(r)?))
}
