//! Helpers for the builder's unit tests: small hand-made segments, the builder's
//! steps run one by one, and a fault hook that makes the next build fail.
//!
//! Tensor ids in the helpers' segments should first appear in increasing order from 0:
//! then a value's relative id is its tensor id.

use std::cell::Cell;

use super::build::kernels;
use super::chains::{chains, ChainSpec};
use super::groups::fuse;
use super::levels::sort_by_level;
use super::prune::prune;
use super::values::{describe, Facts};
use super::{build, ExecutionPlan, Home, Kernel, Value};
use crate::ir::relative::{RelativeBuilder, RelativeOp};
use crate::ir::{BinaryOp, DType, Layout, Op, OpKind, TensorDesc, TensorId, UnaryOp};

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

/// An op whose inputs and output have the given dims (contiguous f32).
pub(super) fn op_dims(kind: OpKind, inputs: &[(u64, &[usize])], output: (u64, &[usize])) -> Op {
    Op {
        kind,
        inputs: inputs
            .iter()
            .map(|&(i, d)| desc(i, Layout::contiguous(d)))
            .collect(),
        output: Some(desc(output.0, Layout::contiguous(output.1))),
    }
}

pub(super) fn exp(input: u64, output: u64) -> Op {
    op(OpKind::Unary(UnaryOp::Exp), &[input], Some(output))
}

pub(super) fn add(a: u64, b: u64, output: u64) -> Op {
    op(OpKind::Binary(BinaryOp::Add), &[a, b], Some(output))
}

pub(super) fn drop_of(v: u64) -> Op {
    op(OpKind::Drop, &[v], None)
}

/// The relative forms of `ops`.
pub(super) fn relative(ops: &[Op]) -> Vec<RelativeOp> {
    let mut b = RelativeBuilder::new();
    ops.iter().map(|o| b.push(o)).collect()
}

/// The plan of `ops`, which must build.
pub(super) fn plan(ops: &[Op]) -> ExecutionPlan {
    let rels = relative(ops);
    build(
        &ops.iter().collect::<Vec<_>>(),
        &rels.iter().collect::<Vec<_>>(),
    )
    .unwrap()
}

/// What the builder's steps have made just before the memory step.
pub(super) struct Staged {
    pub(super) values: Vec<Value>,
    pub(super) facts: Vec<Facts>,
    pub(super) groups: Vec<Vec<usize>>,
    pub(super) specs: Vec<ChainSpec>,
    pub(super) kernels: Vec<Kernel>,
    pub(super) levels: Vec<u32>,
}

/// Runs the builder's steps on `ops` up to (not including) the memory step.
pub(super) fn staged(ops: &[Op]) -> Staged {
    let rels = relative(ops);
    let (ops, rels): (Vec<&Op>, Vec<&RelativeOp>) = (ops.iter().collect(), rels.iter().collect());
    let (mut values, mut facts) = describe(&ops, &rels).unwrap();
    let live = prune(&rels, &mut facts, &mut values);
    let groups = fuse(&ops, &rels, &facts, &values, &live);
    let specs = chains(&ops, &rels, &facts, &values, &groups, &live).unwrap();
    let kernels = kernels(&ops, &rels, &live, &groups, &specs, &facts, &mut values).unwrap();
    let (kernels, levels) = sort_by_level(kernels, &facts);
    Staged {
        values,
        facts,
        groups,
        specs,
        kernels,
        levels,
    }
}

/// The arena region `[start, end)` (elements) of every value of `plan` in the arena.
pub(super) fn arena_regions(plan: &ExecutionPlan) -> Vec<(u32, usize, usize)> {
    plan.values
        .iter()
        .enumerate()
        .filter_map(|(v, val)| match val.home {
            Home::Arena { offset } => Some((v as u32, offset, offset + val.layout.numel())),
            _ => None,
        })
        .collect()
}

thread_local! {
    static BREAK_NEXT_BUILD: Cell<bool> = const { Cell::new(false) };
}

/// The next plan built on this thread fails with an [`crate::Error::Internal`].
pub(crate) fn break_next_build() {
    BREAK_NEXT_BUILD.with(|b| b.set(true));
}

/// Whether a failure was asked for (once); called at the start of every build.
pub(super) fn build_broken() -> bool {
    BREAK_NEXT_BUILD.with(|b| b.replace(false))
}
