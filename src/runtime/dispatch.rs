//! Running one kernel, the last step of both executors: a kernel of a plan (one op, a
//! fused program or a chain) on what the plan executor hands it, and one op's kernel on
//! typed slices (`ops::run`, the op registry's binding). Argument lists are built on the stack. A panic caught at
//! a kernel's boundary becomes that kernel's error (`caught`).

use std::any::Any;
use std::sync::Arc;

use super::execute::{region, root, Reads};
use super::{Data, DataMut, TensorBuffer};
use crate::fusion::{Chain, ExecutionPlan, Kernel};
use crate::ir::{Layout, OpKind};
use crate::kernels::{
    self, ChainMatMul, ChainNorm, KernelError, PackedRhs, Par, ProductPath, ProductPlan, Rhs,
};
use crate::ops::BoundProduct;

/// Collects up to `N` items into an array on the stack, or into a `Vec` beyond that,
/// and calls `f` on them: per-kernel argument lists without a heap allocation.
fn with_list<T: Copy, R, const N: usize>(
    items: impl ExactSizeIterator<Item = Result<T, KernelError>>,
    empty: T,
    f: impl FnOnce(&[T]) -> Result<R, KernelError>,
) -> Result<R, KernelError> {
    let n = items.len();
    if n <= N {
        let mut buf = [empty; N];
        for (slot, item) in buf.iter_mut().zip(items) {
            *slot = item?;
        }
        f(&buf[..n])
    } else {
        let v = items.collect::<Result<Vec<T>, _>>()?;
        f(&v)
    }
}

/// Calls `f` with the f32 destinations of `outputs` (taken in order from `dst`), kept
/// on the stack for up to 8 of them.
fn with_f32_outputs<'d, R>(
    outputs: &[u32],
    mut dst: impl FnMut(u32) -> Result<DataMut<'d>, KernelError>,
    kernel: &str,
    f: impl FnOnce(&mut [&mut [f32]]) -> Result<R, KernelError>,
) -> Result<R, KernelError> {
    const INLINE: usize = 8;
    let mut inline: [&mut [f32]; INLINE] = Default::default();
    let mut many = Vec::new();
    for (i, &o) in outputs.iter().enumerate() {
        let DataMut::F32(d) = dst(o)? else {
            return Err(KernelError(format!(
                "{kernel} output is not f32 (engine bug)"
            )));
        };
        if outputs.len() <= INLINE {
            inline[i] = d;
        } else {
            many.push(d);
        }
    }
    if outputs.len() <= INLINE {
        f(&mut inline[..outputs.len()])
    } else {
        f(&mut many)
    }
}

/// Runs one kernel: reads its inputs from buffers or the arena's read-only gaps, writes
/// its arena outputs into `arena_outs` and the others into `pooled` (both in the
/// kernel's output order).
pub(super) fn run_kernel(
    reads: &Reads<'_, '_>,
    kernel: &Kernel,
    arena_outs: &mut [Option<&mut [f32]>],
    pooled: &mut [(u32, Arc<TensorBuffer>)],
    par: Par,
) -> Result<(), KernelError> {
    #[cfg(test)]
    super::fault::check();
    // A mistyped STREAMFUSE_ISA fails every kernel, naming itself.
    kernels::cpu::check()?;
    let plan = reads.plan;
    let mut arena_outs = arena_outs.iter_mut();
    let mut pooled = pooled.iter_mut();
    // Destinations in the kernel's output order.
    let mut dst = |o: u32| -> Result<DataMut<'_>, KernelError> {
        let d = if region(plan, o as usize).is_some() {
            arena_outs.next().and_then(|w| w.take()).map(DataMut::F32)
        } else {
            pooled
                .next()
                .and_then(|(_, b)| Arc::get_mut(b))
                .map(|b| b.data_mut())
        };
        d.ok_or_else(|| KernelError(format!("no place for r{o} (engine bug)")))
    };
    match kernel {
        Kernel::Op {
            op,
            inputs,
            output,
            product,
        } => {
            let out = dst(output[0])?;
            let op = &reads.tasks[*op].op;
            // A product the plan put on a packed tile reads the weight's packed form,
            // once its buffer has one.
            let packed = match (product, inputs.get(1), op.inputs.get(1)) {
                (Some(plan), Some(&v), Some(desc)) => bind_packed(reads, plan, v, &desc.layout),
                _ => None,
            };
            let product = product.as_ref().map(|plan| BoundProduct { plan, packed });
            // The packed kernel does not read the weight's elements (a weight kept only
            // packed has none to read without unpacking them).
            with_list::<_, _, 4>(
                inputs.iter().enumerate().map(|(i, &v)| match (i, packed) {
                    (1, Some(_)) => Ok(Data::F32(&[])),
                    _ => reads.data(v),
                }),
                Data::F32(&[]),
                |data| crate::ops::run(op, data, product, out, par),
            )
        }
        Kernel::Fused {
            program,
            inputs,
            outputs,
            in_place,
            ..
        } => {
            check_in_place(plan, inputs, outputs, in_place)?;
            let empty = Layout::contiguous(&[]);
            with_list::<_, _, 8>(
                inputs.iter().enumerate().map(|(k, (v, l))| {
                    // Read from its output's region, which the kernel is handed mutably.
                    if in_place.iter().any(|&(i, _)| i == k) {
                        return Ok((&[][..], l));
                    }
                    match reads.data(*v)? {
                        Data::F32(s) => Ok((s, l)),
                        _ => Err(KernelError("fused input is not f32 (engine bug)".into())),
                    }
                }),
                (&[][..], &empty),
                |data| {
                    with_f32_outputs(outputs, dst, "fused", |dsts| {
                        kernels::fused_in_place(program, data, in_place, dsts, par)
                    })
                },
            )
        }
        Kernel::Chain(chain) => {
            let data = |v: u32| match reads.data(v)? {
                Data::F32(s) => Ok(s),
                _ => Err(KernelError("chain input is not f32 (engine bug)".into())),
            };
            let packed = chain
                .matmul
                .as_ref()
                .and_then(|m| bind_packed(reads, &m.plan, m.rhs.0, &m.rhs.1));
            with_f32_outputs(&chain.outputs, dst, "chain", |dsts| {
                run_chain(chain, data, packed, dsts, par)
            })
        }
    }
}

/// The packed form of the right operand `v` (read through `layout`) of a product that
/// `plan` put on a packed tile, when its buffer has one or makes one now
/// (`runtime/prepack.rs`: at its second use as a right operand); `None` for a product
/// by `gemm`, and before the weight is packed (the product then runs by `gemm` on its
/// elements, with the plan's split).
fn bind_packed<'a>(
    reads: &Reads<'a, '_>,
    plan: &ProductPlan,
    v: u32,
    layout: &Layout,
) -> Option<&'a PackedRhs> {
    match plan.path {
        ProductPath::Packed(_) => reads.packed_rhs(v, layout),
        ProductPath::Gemm => None,
    }
}

/// Checks that each in-place input `(k, j)` of a fused kernel lives exactly in the arena
/// region of output `j` (the plan gave them one offset), so reading it from there reads
/// its own elements.
fn check_in_place(
    plan: &ExecutionPlan,
    inputs: &[(u32, Layout)],
    outputs: &[u32],
    in_place: &[(usize, usize)],
) -> Result<(), KernelError> {
    for &(k, j) in in_place {
        let input = inputs
            .get(k)
            .and_then(|(v, _)| region(plan, root(plan, *v)));
        let output = outputs.get(j).and_then(|&o| region(plan, o as usize));
        if input.is_none() || input != output {
            return Err(KernelError(format!(
                "in-place input {k} is not where output {j} is written (planning bug)"
            )));
        }
    }
    Ok(())
}

/// Runs `chain`, reading each value through `data` (its root's f32 elements) and
/// writing `outputs` (in the chain's output order).
fn run_chain<'a>(
    chain: &'a Chain,
    data: impl Fn(u32) -> Result<&'a [f32], KernelError>,
    packed: Option<&'a PackedRhs>,
    outputs: &mut [&mut [f32]],
    par: Par,
) -> Result<(), KernelError> {
    let product = chain.matmul.as_ref().map(|m| m.product);
    // The program's inputs, on the stack for up to `INLINE` of them.
    const INLINE: usize = 16;
    let empty = Layout::contiguous(&[]);
    let mut inline: [(&[f32], &Layout); INLINE] = [(&[], &empty); INLINE];
    let heap: Vec<(&[f32], &Layout)>;
    let input = |(v, l): &'a (u32, Layout)| -> Result<(&'a [f32], &'a Layout), KernelError> {
        match product {
            Some(p) if p == *v => Ok((&[][..], l)),
            _ => Ok((data(*v)?, l)),
        }
    };
    let inputs: &[(&[f32], &Layout)] = if chain.inputs.len() <= INLINE {
        for (slot, i) in inline.iter_mut().zip(&chain.inputs) {
            *slot = input(i)?;
        }
        &inline[..chain.inputs.len()]
    } else {
        heap = chain.inputs.iter().map(input).collect::<Result<_, _>>()?;
        &heap
    };
    let matmul = match &chain.matmul {
        Some(m) => Some(ChainMatMul {
            lhs: (data(m.lhs.0)?, &m.lhs.1),
            rhs: (
                match packed {
                    Some(p) => Rhs::Packed(p),
                    None => Rhs::Elements(data(m.rhs.0)?),
                },
                &m.rhs.1,
            ),
            input: m.input,
            plan: &m.plan,
            epilogue: m.epilogue,
        }),
        None => None,
    };
    let norm = match &chain.norm {
        None => None,
        Some(n) => {
            let param = |i: usize| -> Result<(&'a [f32], &Layout), KernelError> {
                let (v, l) = n.params.get(i).ok_or_else(|| {
                    KernelError(format!(
                        "{} lacks parameter {i} (engine bug)",
                        n.kind.name()
                    ))
                })?;
                Ok((data(*v)?, l))
            };
            let norm = match n.kind {
                OpKind::Softmax => ChainNorm::Softmax,
                OpKind::LayerNorm { eps } => ChainNorm::LayerNorm {
                    weight: param(0)?,
                    bias: param(1)?,
                    eps: f64::from_bits(eps),
                },
                OpKind::RmsNorm { eps } => ChainNorm::RmsNorm {
                    weight: param(0)?,
                    eps: f64::from_bits(eps),
                },
                ref k => {
                    return Err(KernelError(format!(
                        "{} cannot end a chain (engine bug)",
                        k.name()
                    )))
                }
            };
            Some((norm, n.output))
        }
    };
    kernels::chain(
        &chain.dims,
        matmul,
        &chain.program,
        inputs,
        norm,
        outputs,
        par,
    )
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
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
