//! Op descriptions: what each queued operation computes, as plain data.
//!
//! An [`OpKind`] says what an op does and carries its parameters (floats are kept as
//! bits so that ops can be hashed and compared exactly). A queued op pairs it with the
//! descriptions of its inputs and output ([`TensorDesc`]: id, dtype, layout). The same
//! description serves three readers: the executor (which kernel to call), the relative
//! form (the plan-cache key) and, later, fusion.

use std::fmt;

use super::{DType, Layout, TensorId};

/// Element-wise functions of one f32 input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `e^x`
    Exp,
    /// natural logarithm
    Log,
    /// square root
    Sqrt,
    /// `1 / x`
    Recip,
    /// `-x`
    Neg,
    /// `|x|`
    Abs,
    /// hyperbolic tangent
    Tanh,
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// `max(x, 0)`
    Relu,
    /// GELU, erf form: `x/2 * (1 + erf(x / sqrt 2))`
    Gelu,
    /// GELU, tanh approximation
    GeluTanh,
    /// `x * sigmoid(x)`
    Silu,
    /// `x * mul + add`; the parameters are `f64::to_bits` of the values.
    Affine {
        /// Bits of the multiplier.
        mul: u64,
        /// Bits of the addend.
        add: u64,
    },
    /// `x ^ e`; the parameter is `f64::to_bits` of the exponent.
    Powf(u64),
}

impl UnaryOp {
    /// Every unary op, for the tests that try each: `affine` as `x · 0.5 − 1.25` and
    /// `powf` as `x^1.5` (parameters exact in f32).
    #[cfg(test)]
    pub(crate) const ALL: [UnaryOp; 14] = [
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Recip,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Affine {
            mul: 0x3FE0_0000_0000_0000, // 0.5
            add: 0xBFF4_0000_0000_0000, // -1.25
        },
        UnaryOp::Powf(0x3FF8_0000_0000_0000), // 1.5
    ];

    /// The name the op has in the `Tensor` API (used in error messages and plans).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::Affine { .. } => "affine",
            UnaryOp::Powf(_) => "powf",
        }
    }
}

/// Element-wise functions of two inputs of the same dtype, with broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
    /// `max(a, b)`
    Maximum,
    /// `min(a, b)`
    Minimum,
}

impl BinaryOp {
    /// Every binary op, for the tests that try each.
    #[cfg(test)]
    pub(crate) const ALL: [BinaryOp; 6] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];

    /// The name the op has in the `Tensor` API.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }
}

/// Reductions over one dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ReduceOp {
    /// Sum of the elements.
    Sum,
    /// Largest element (NaN propagates).
    Max,
    /// Arithmetic mean (f32 only).
    Mean,
    /// Index of the first largest element, as u32.
    ArgMax,
}

impl ReduceOp {
    /// The name the op has in the `Tensor` API.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Mean => "mean",
            ReduceOp::ArgMax => "argmax",
        }
    }
}

/// What an op computes. Inputs are listed in [`Op::inputs`] in the order given here.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum OpKind {
    /// No input: every element set to `value` (bits of an `f64`), cast to the dtype.
    Fill {
        /// Bits of the value.
        value: u64,
    },
    /// One f32 input, element-wise.
    Unary(UnaryOp),
    /// Two inputs broadcast to the output's dims, element-wise.
    Binary(BinaryOp),
    /// One input converted to the output's dtype.
    Cast,
    /// One input copied into a fresh row-major buffer.
    Contiguous,
    /// One input read through a new layout over the same buffer (no data moves). The
    /// output's layout is the view's.
    View,
    /// `[.., m, k] x [.., k, n] -> [.., m, n]`; both inputs already broadcast over batch.
    MatMul,
    /// Reduction over `dim`; the output keeps `dim` with size 1 when `keepdim`.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The reduced dimension.
        dim: usize,
        /// Whether the output keeps the reduced dim with size 1.
        keepdim: bool,
    },
    /// Softmax over the last dim.
    Softmax,
    /// Inputs q `[b, heads, lq, dh]`, k and v `[b, heads, lk, dh]` (each row's `dh`
    /// elements contiguous) and optionally an additive bias read as
    /// `[b, heads, lq, lk]`: `softmax(q·kᵀ · scale + bias) · v`, written as
    /// `[b, lq, heads, dh]`. When `ragged`, the fourth input is instead the u32
    /// sequence offsets `[n + 1]` of a packed batch (`b` = 1, `lq` = `lk` = total
    /// tokens) and each sequence attends only to itself.
    Attention {
        /// Bits of the score scale (an `f64`).
        scale: u64,
        /// Whether the batch is packed, its fourth input the sequence offsets.
        ragged: bool,
        /// How many keys before its own position a query sees (`KeyWindow::before`;
        /// `None`: all).
        before: Option<u64>,
        /// How many keys after its own position a query sees (`KeyWindow::after`;
        /// `None`: all).
        after: Option<u64>,
    },
    /// Inputs x, weight, bias: layer norm over the last dim.
    LayerNorm {
        /// Bits of epsilon (an `f64`).
        eps: u64,
    },
    /// Inputs x, weight: RMS norm over the last dim.
    RmsNorm {
        /// Bits of epsilon (an `f64`).
        eps: u64,
    },
    /// Inputs source, 1-D indices (u32 or i64): rows of `dim` picked by index.
    IndexSelect {
        /// The dimension indexed.
        dim: usize,
    },
    /// Any number of inputs joined along `dim`.
    Cat {
        /// The dimension joined along.
        dim: usize,
    },
    /// The last handle of the input was dropped: after this point the tensor is dead in
    /// its stream. Has no output.
    Drop,
    /// Inputs x, cos, sin: rotary position embedding ("rotate half"), see
    /// `ops::rotary`.
    Rotary,
    /// The running sum along `dim`, see `ops::cumsum`. Last, so the variants before it
    /// keep their hashes.
    Cumsum {
        /// The dimension summed along.
        dim: usize,
    },
}

impl OpKind {
    /// A short name for logs, plans and error messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            OpKind::Fill { .. } => "fill",
            OpKind::Unary(u) => u.name(),
            OpKind::Binary(b) => b.name(),
            OpKind::Cast => "to_dtype",
            OpKind::Contiguous => "contiguous",
            OpKind::View => "view",
            OpKind::MatMul => "matmul",
            OpKind::Reduce { op, .. } => op.name(),
            OpKind::Softmax => "softmax",
            OpKind::Attention { .. } => "attention",
            OpKind::LayerNorm { .. } => "layer_norm",
            OpKind::RmsNorm { .. } => "rms_norm",
            OpKind::IndexSelect { .. } => "index_select",
            OpKind::Cat { .. } => "cat",
            OpKind::Drop => "drop",
            OpKind::Rotary => "rotary",
            OpKind::Cumsum { .. } => "cumsum",
        }
    }
}

/// What the engine knows of a tensor without its data: id, dtype and layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TensorDesc {
    /// The tensor's SSA id.
    pub id: TensorId,
    /// Element type.
    pub dtype: DType,
    /// Dims, strides and offset over its buffer.
    pub layout: Layout,
}

/// One recorded operation: what it computes, what it reads and what it makes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Op {
    /// What the op computes.
    pub kind: OpKind,
    /// The tensors it reads, in the order [`OpKind`] documents.
    pub inputs: Vec<TensorDesc>,
    /// The tensor it makes (`None` only for [`OpKind::Drop`]).
    pub output: Option<TensorDesc>,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(out) = &self.output {
            write!(f, "{} = ", out.id)?;
        }
        write!(f, "{}(", self.kind.name())?;
        for (i, input) in self.inputs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", input.id)?;
        }
        f.write_str(")")?;
        if let Some(out) = &self.output {
            write!(f, " : {}{:?}", out.dtype, out.layout.dims)?;
        }
        Ok(())
    }
}
