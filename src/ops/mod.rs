//! The op registry: each op family in one file, and the one table that finds it.
//!
//! A family file (`unary.rs`, `binary.rs`, `reduce.rs`, `norm.rs`, `matmul.rs`,
//! `attention.rs`, `index_select.rs`, `cat.rs`, `layout.rs` for cast/contiguous/view,
//! `fill.rs`, `rotary.rs`, `cumsum.rs`) declares a [`Family`]: its fusion class (what the plan
//! builder may merge it with), its cost (element operations, for the threading
//! decision) and its kernel binding (which kernel runs it on typed slices). Its shape
//! rules and argument checks (`shape`, or one function per view in `layout.rs`, which
//! the `Tensor` method calls before it records anything) live beside them in the same
//! file, and so does a plain scalar reference implementation (f64, by coordinates) with
//! the unit test that holds the family's kernel binding to it on strided, broadcast
//! and offset inputs, with one thread and two (`testing.rs` holds what those tests
//! share: the operands' layouts, building and running an `Op`, the comparison).
//! [`family`] maps an [`OpKind`] to its entry, one line per family: the executors
//! ([`run`]), the plan builder ([`class`]) and the cost estimate ([`work`]) ask it and
//! hold no per-op logic of their own.

macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            // A weight kept in bf16 or int8 is read as its values in f32 (a product by
            // it reads the packed form instead; the Tensor API lets no other op make or
            // read one, except `to_dtype`).
            $crate::ir::DType::F32
            | $crate::ir::DType::BF16
            | $crate::ir::DType::I8
            | $crate::ir::DType::BF16X3 => {
                type $T = f32;
                $body
            }
            $crate::ir::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::ir::DType::I64 => {
                type $T = i64;
                $body
            }
        }
    };
}

pub(crate) mod attention;
pub(crate) mod binary;
pub(crate) mod cat;
pub(crate) mod cumsum;
mod data;
pub(crate) mod fill;
pub(crate) mod index_select;
pub(crate) mod layout;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod reduce;
pub(crate) mod rotary;
#[cfg(test)]
mod testing;
pub(crate) mod unary;

pub(crate) use data::{Data, DataElement, DataMut};

use crate::ir::{Layout, Op, OpKind};
use crate::kernels::{KernelError, PackedRhs, Par, ProductPlan};

/// The element count of `dims`, or an error if the rank is above [`MAX_RANK`](crate::MAX_RANK) or the
/// count overflows.
pub(crate) fn checked_numel(dims: &[usize], op: &'static str) -> crate::Result<usize> {
    if dims.len() > crate::ir::MAX_RANK {
        return Err(crate::Error::Shape {
            op,
            msg: format!(
                "shape {dims:?} has rank {}, above the maximum of {}",
                dims.len(),
                crate::ir::MAX_RANK
            ),
        });
    }
    // Dims of size 0 do not excuse the others: strides are products of the dims after
    // them, so those products must fit too.
    let limit = isize::MAX as usize / 8;
    let fits = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)))
        .is_some_and(|n| n <= limit);
    if !fits {
        return Err(crate::Error::Shape {
            op,
            msg: format!("shape {dims:?} has too many elements"),
        });
    }
    Ok(dims.iter().product())
}

/// What the plan builder may do with an op: the question `fusion` asks of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FusionClass {
    /// Element-wise over f32 inputs of the given arity: joins fused register programs
    /// (and the epilogue of a chain).
    Elementwise {
        /// How many inputs it reads.
        arity: usize,
    },
    /// A matrix product: may head a chain.
    Product,
    /// A normalisation over the last dim: may end a chain.
    RowNorm,
    /// Reads its input through a new layout: no kernel, no buffer of its own.
    Alias,
    /// Runs as a kernel of its own.
    Single,
    /// Makes nothing (a `Drop`).
    Nothing,
}

/// One op's kernel on typed slices: reads `inputs` (in the op's input order, through
/// the layouts of `op.inputs`) and writes the output contiguously into `out`. A
/// product of a plan gets its plan and its right operand's packed form when the
/// executor bound one (`product`; then `inputs[1]` is not read).
pub(crate) type RunFn = fn(
    op: &Op,
    inputs: &[Data<'_>],
    product: Option<BoundProduct<'_>>,
    out: DataMut<'_>,
    par: Par,
) -> Result<(), KernelError>;

/// A product as the plan decided it (`ProductPlan`) with its right operand's packed
/// form, when the executor bound one (the plan's path is packed and the weight's buffer
/// has it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BoundProduct<'a> {
    /// The plan's decision.
    pub(crate) plan: &'a ProductPlan,
    /// The packed right operand, or `None`: its elements (`inputs[1]`) are read.
    pub(crate) packed: Option<&'a PackedRhs>,
}

/// What a family of ops declares to the engine: plain data and functions.
pub(crate) struct Family {
    /// The family's name (for messages).
    pub(crate) name: &'static str,
    /// What the plan builder may merge it with.
    pub(crate) class: FusionClass,
    /// Roughly how many element operations the op costs.
    pub(crate) work: fn(&Op) -> usize,
    /// Its kernel binding.
    pub(crate) run: RunFn,
}

/// The family entry of `kind`: the registry, one line per family.
pub(crate) fn family(kind: &OpKind) -> &'static Family {
    match kind {
        OpKind::Fill { .. } => &fill::FAMILY,
        OpKind::Unary(_) => &unary::FAMILY,
        OpKind::Binary(_) => &binary::FAMILY,
        OpKind::Cast => &layout::CAST,
        OpKind::Contiguous => &layout::CONTIGUOUS,
        OpKind::View => &layout::VIEW,
        OpKind::MatMul => &matmul::FAMILY,
        OpKind::Reduce { .. } => &reduce::FAMILY,
        OpKind::Softmax | OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. } => &norm::FAMILY,
        OpKind::Attention { .. } => &attention::FAMILY,
        OpKind::IndexSelect { .. } => &index_select::FAMILY,
        OpKind::Cat { .. } => &cat::FAMILY,
        OpKind::Rotary => &rotary::FAMILY,
        OpKind::Cumsum { .. } => &cumsum::FAMILY,
        OpKind::Drop => &DROP,
    }
}

/// The entry of `Drop`: no output, no cost, nothing to run.
static DROP: Family = Family {
    name: "drop",
    class: FusionClass::Nothing,
    work: |_| 0,
    run: |_, _, _, _, _| Ok(()),
};

/// Runs `op`'s kernel (see [`RunFn`]) after checking what every kernel needs: an
/// output, and one input slice per input.
pub(crate) fn run(
    op: &Op,
    inputs: &[Data<'_>],
    product: Option<BoundProduct<'_>>,
    out: DataMut<'_>,
    par: Par,
) -> Result<(), KernelError> {
    if op.output.is_none() {
        return Err(KernelError("op without output".into()));
    }
    if inputs.len() != op.inputs.len() {
        return Err(KernelError(format!(
            "{} inputs given for {} (the {} family's kernel; engine bug)",
            inputs.len(),
            op,
            family(&op.kind).name
        )));
    }
    (family(&op.kind).run)(op, inputs, product, out, par)
}

/// The fusion class of `op`.
pub(crate) fn class(op: &Op) -> FusionClass {
    family(&op.kind).class
}

/// Roughly how many element operations `op` costs (0 for an op without output). Used
/// to decide whether a segment is worth running on several threads.
pub(crate) fn work(op: &Op) -> usize {
    if op.output.is_none() {
        return 0;
    }
    (family(&op.kind).work)(op)
}

/// The common cost: one operation per output element.
pub(crate) fn per_output_element(op: &Op) -> usize {
    op.output.as_ref().map_or(0, |o| o.layout.numel())
}

/// The output's description; every op the kernels run has one.
fn output(op: &Op) -> Result<&crate::ir::TensorDesc, KernelError> {
    op.output
        .as_ref()
        .ok_or_else(|| KernelError("op without output".into()))
}

/// Input `i` as a slice of `T`; an engine bug if it holds other elements.
fn typed<'a, T: DataElement>(d: Data<'a>) -> Result<&'a [T], KernelError> {
    T::from_data(d).ok_or_else(|| {
        KernelError(format!(
            "an input holds other elements than the {} expected (engine bug)",
            T::DTYPE
        ))
    })
}

/// The output's elements as `T`; an engine bug if they are of another type.
fn dst<T: DataElement>(d: DataMut<'_>) -> Result<&mut [T], KernelError> {
    T::from_data_mut(d).ok_or_else(|| {
        KernelError(format!(
            "the output holds other elements than the {} written (engine bug)",
            T::DTYPE
        ))
    })
}

/// `layout` broadcast to `dims`; an engine bug if it does not broadcast.
fn broadcast(layout: &Layout, dims: &[usize]) -> Result<Layout, KernelError> {
    layout.broadcast_as(dims).ok_or_else(|| {
        KernelError(format!(
            "cannot broadcast {:?} to {dims:?} (engine bug)",
            layout.dims
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, DType, ReduceOp, TensorDesc, TensorId, UnaryOp};

    fn op(kind: OpKind, inputs: &[&[usize]], out: &[usize]) -> Op {
        let d = |dims: &[usize]| TensorDesc {
            id: TensorId(0),
            dtype: DType::F32,
            layout: Layout::contiguous(dims),
        };
        Op {
            kind,
            inputs: inputs.iter().map(|&i| d(i)).collect(),
            output: Some(d(out)),
        }
    }

    /// The classes the plan builder relies on: element-wise ops fuse with their arity,
    /// products head chains, norms end them, views alias, the rest run alone.
    #[test]
    fn each_family_declares_the_class_fusion_asks_for() {
        let m = [2usize, 3];
        let cases = [
            (
                OpKind::Unary(UnaryOp::Exp),
                FusionClass::Elementwise { arity: 1 },
            ),
            (
                OpKind::Binary(BinaryOp::Add),
                FusionClass::Elementwise { arity: 2 },
            ),
            (OpKind::MatMul, FusionClass::Product),
            (OpKind::Softmax, FusionClass::RowNorm),
            (OpKind::RmsNorm { eps: 0 }, FusionClass::RowNorm),
            (OpKind::LayerNorm { eps: 0 }, FusionClass::RowNorm),
            (OpKind::View, FusionClass::Alias),
            (OpKind::Drop, FusionClass::Nothing),
            (OpKind::Rotary, FusionClass::Single),
            (OpKind::Cumsum { dim: 0 }, FusionClass::Single),
            (OpKind::Cat { dim: 0 }, FusionClass::Single),
            (OpKind::Fill { value: 0 }, FusionClass::Single),
        ];
        for (kind, class) in cases {
            assert_eq!(
                super::class(&op(kind.clone(), &[&m], &m)),
                class,
                "{kind:?}"
            );
        }
    }

    /// The cost: a product counts its inner dim, a view and a drop nothing, the rest
    /// their output's elements.
    #[test]
    fn work_is_what_each_family_declares() {
        assert_eq!(work(&op(OpKind::MatMul, &[&[4, 5], &[5, 6]], &[4, 6])), 120);
        assert_eq!(work(&op(OpKind::View, &[&[4, 5]], &[5, 4])), 0);
        let sum = OpKind::Reduce {
            op: ReduceOp::Sum,
            dim: 1,
            keepdim: false,
        };
        assert_eq!(work(&op(sum, &[&[4, 5]], &[4])), 4);
        // Attention: heads · head_dim per visible pair: 2 · 3 · (4 · 5) for all keys,
        // 2 · 3 · (1 + 2 + 3 + 4) causal (query i sees keys 0..=i of 5).
        let att = |before, after| OpKind::Attention {
            scale: 0,
            ragged: false,
            before,
            after,
        };
        let shapes: [&[usize]; 3] = [&[1, 2, 4, 3], &[1, 1, 5, 3], &[1, 1, 5, 3]];
        assert_eq!(work(&op(att(None, None), &shapes, &[1, 4, 2, 3])), 120);
        assert_eq!(work(&op(att(None, Some(0)), &shapes, &[1, 4, 2, 3])), 60);
        let mut drop = op(OpKind::Drop, &[&[4, 5]], &[4, 5]);
        drop.output = None;
        assert_eq!(work(&drop), 0);
    }

    /// A wrong number of inputs is an error naming the op and its family, not a panic.
    #[test]
    fn run_checks_the_input_count() {
        let o = op(OpKind::Binary(BinaryOp::Add), &[&[2], &[2]], &[2]);
        let mut out = [0.0f32; 2];
        let e = run(
            &o,
            &[Data::F32(&[1.0, 2.0])],
            None,
            DataMut::F32(&mut out),
            Par::serial(),
        )
        .unwrap_err();
        assert!(e.0.contains("binary family"), "{}", e.0);
    }
}
