//! The kernels of an [`ExecutionPlan`](super::ExecutionPlan): a single op, a fused
//! element-wise program, or a chain (a matmul and/or a row norm around a program), and
//! the values each reads and writes.

use crate::ir::{Dims, Layout, OpKind};
use crate::kernels::{FusedProgram, ProductPlan, TileEpilogue};

/// One kernel of a plan.
#[derive(Clone, Debug)]
pub(crate) enum Kernel {
    /// A single op of the segment, run by its own kernel.
    Op {
        /// Index of the op in the segment.
        op: usize,
        /// Relative ids of its inputs.
        inputs: Vec<u32>,
        /// Relative id of its output (a one-element list).
        output: [u32; 1],
        /// For a matmul: how the product runs, decided here
        /// ([`crate::ops::matmul::plan`]).
        product: Option<ProductPlan>,
    },
    /// A fused element-wise chain.
    Fused {
        /// The register program.
        program: FusedProgram,
        /// External inputs (relative ids) with their layouts broadcast to `dims`.
        inputs: Vec<(u32, Layout)>,
        /// The relative ids of `inputs`, alone.
        input_ids: Vec<u32>,
        /// Values written (relative ids), in the program's output order.
        outputs: Vec<u32>,
        /// The dims of every value of the chain.
        dims: Dims,
        /// In-place pairs `(k, j)`: input `k` is read from the arena region of output
        /// `j`, which overwrites it (the memory plan gave both the same offset).
        in_place: Vec<(usize, usize)>,
    },
    /// A matmul epilogue and/or a norm prologue around a fused program.
    Chain(Box<Chain>),
}

/// A [`Kernel::Chain`]: a fused element-wise program with a matmul before it (an
/// epilogue) and/or a row normalisation after it (a prologue), run panel by panel by
/// [`crate::kernels::chain`]. The matmul's product and the norm's input are
/// [`Home::Fused`](super::Home::Fused): they never get memory.
#[derive(Clone, Debug)]
pub(crate) struct Chain {
    /// The matmul whose product is one of the program's inputs.
    pub matmul: Option<MatMulHead>,
    /// The register program (a copy of one input when the chain has no element-wise
    /// op: a matmul straight into a norm).
    pub program: FusedProgram,
    /// The program's inputs (relative ids) with their layouts broadcast to `dims`; the
    /// matmul's product among them.
    pub inputs: Vec<(u32, Layout)>,
    /// The norm that normalises one of the program's outputs in place.
    pub norm: Option<NormTail>,
    /// Every value read from memory: the matmul's operands, the program's inputs but
    /// the product, the norm's parameters.
    pub input_ids: Vec<u32>,
    /// Values written, in the program's output order; the output the norm
    /// normalises is the norm's own output value.
    pub outputs: Vec<u32>,
    /// The dims of the product, of every value of the program and of the norm.
    pub dims: Dims,
}

/// The matmul at the head of a [`Chain`].
#[derive(Clone, Debug)]
pub(crate) struct MatMulHead {
    /// Index of the matmul op in the segment.
    pub op: usize,
    /// Left operand (relative id) with its layout, batch dims broadcast to the output's.
    pub lhs: (u32, Layout),
    /// Right operand, likewise.
    pub rhs: (u32, Layout),
    /// The product (relative id), never stored.
    pub product: u32,
    /// Which program input the product is.
    pub input: usize,
    /// How the product runs: packed on a named tile or by `gemm`, and its split.
    pub plan: ProductPlan,
    /// The steps of the program the packed tile applies to its sums, decided here once
    /// ([`TileEpilogue::plan`]); `None` when the program is not such steps or the
    /// plan's tile takes no epilogue ([`ProductPlan::epilogue_in_tile`]).
    pub epilogue: Option<TileEpilogue>,
}

/// The row normalisation at the tail of a [`Chain`].
#[derive(Clone, Debug)]
pub(crate) struct NormTail {
    /// Index of the norm op in the segment.
    pub op: usize,
    /// `Softmax`, `LayerNorm` or `RmsNorm`, with its epsilon.
    pub kind: OpKind,
    /// Its parameters after the normalised input (weight, bias), with their layouts.
    pub params: Vec<(u32, Layout)>,
    /// Which program output it normalises (in place; that output is the norm's value).
    pub output: usize,
}

impl Kernel {
    /// The values (relative ids) the kernel reads from memory and the ones it writes.
    /// A chain's product and its norm's input are in neither: they are never stored.
    pub(crate) fn io(&self) -> (&[u32], &[u32]) {
        match self {
            Kernel::Op { inputs, output, .. } => (inputs, output),
            Kernel::Fused {
                input_ids, outputs, ..
            } => (input_ids, outputs),
            Kernel::Chain(c) => (&c.input_ids, &c.outputs),
        }
    }
}
