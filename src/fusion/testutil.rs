//! Helpers for the builder's unit tests: small hand-made segments.

use super::{build, ExecutionPlan};
use crate::ir::relative::{RelativeBuilder, RelativeOp};
use crate::ir::{DType, Layout, Op, OpKind, TensorDesc, TensorId, UnaryOp};

pub(super) const DIMS: [usize; 2] = [4, 4];

pub(super) fn desc(id: u64, layout: Layout) -> TensorDesc {
    TensorDesc {
        id: TensorId(id),
        dtype: DType::F32,
        layout,
    }
}

/// An op reading `inputs` and making `output` (`None` for a Drop), all `[4, 4]`
/// and contiguous but for views, which transpose.
pub(super) fn op(kind: OpKind, inputs: &[u64], output: Option<u64>) -> Op {
    let whole = Layout::contiguous(&DIMS);
    let out_layout = if kind == OpKind::View {
        whole.permute(&[1, 0])
    } else {
        whole
    };
    Op {
        kind,
        inputs: inputs.iter().map(|&i| desc(i, whole)).collect(),
        output: output.map(|o| desc(o, out_layout)),
    }
}

pub(super) fn exp(input: u64, output: u64) -> Op {
    op(OpKind::Unary(UnaryOp::Exp), &[input], Some(output))
}

pub(super) fn drop_of(v: u64) -> Op {
    op(OpKind::Drop, &[v], None)
}

pub(super) fn plan(ops: &[Op]) -> ExecutionPlan {
    let mut b = RelativeBuilder::new();
    let rels: Vec<RelativeOp> = ops.iter().map(|o| b.push(o)).collect();
    build(
        &ops.iter().collect::<Vec<_>>(),
        &rels.iter().collect::<Vec<_>>(),
    )
    .unwrap()
}
