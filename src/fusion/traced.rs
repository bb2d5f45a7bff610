//! The plan as the timeline and the plan pictures see it.
//!
//! This file owns what a plan tells the trace writer ([`TracedPlan`]: its counts, what
//! each kernel ran, its picture) and [`plan_svg`], the picture of a cached segment's
//! arena. The trace module records plans through that trait and so never depends on
//! this module's types.

use super::{arena_problem, cache, ExecutionPlan, Kernel};
use crate::kernels::{FusedProgram, Instr};
use crate::memory_planner::{self, SvgOptions};
use crate::trace::{KernelSummary, PlanSummary, TracedPlan};

impl TracedPlan for ExecutionPlan {
    fn summary(&self) -> PlanSummary {
        PlanSummary {
            ops: self.ops,
            dead_ops: self.dead_ops,
            kernels: self.kernel_count(),
            arena_bytes: self.arena_bytes(),
            arena_lower_bound: self.arena_lower_bound * 4,
        }
    }

    fn kernel(&self, index: usize, op: &'static str) -> KernelSummary {
        let (name, kind, ops) = kernel_ops(self, index, op);
        let (bytes_read, bytes_written) = kernel_bytes(self, index);
        KernelSummary {
            name,
            kind,
            ops,
            bytes_read,
            bytes_written,
            level: self.levels.get(index).copied(),
        }
    }

    fn picture(&self, key: u64) -> Option<String> {
        (self.arena_len > 0).then(|| picture(self, key)).flatten()
    }
}

/// An SVG picture of the memory plan of the segment with key `key` (a
/// [`FlushInfo::key`](crate::FlushInfo::key)): its arena buffers over the levels of the
/// plan, as [`memory_planner::svg`] draws them, named by relative value (`r12`). `None`
/// when the plan cache holds no plan for that key (never planned, fusion off, or
/// evicted since). Where two cached segments share a key, the first found is drawn.
pub fn plan_svg(key: u64) -> Option<String> {
    let plan = cache::find(key)?;
    picture(&plan, key)
}

/// The SVG of `plan` (segment key `key`); `None` (and an error in the log) if the
/// planner refuses to draw it, which would be a bug.
fn picture(plan: &ExecutionPlan, key: u64) -> Option<String> {
    let (problem, offsets) = arena_problem(plan);
    let options = SvgOptions {
        title: format!(
            "segment {key:016x}: {} ops, {} kernels (steps are kernel levels)",
            plan.ops,
            plan.kernel_count()
        ),
        names: problem
            .buffers
            .iter()
            .map(|b| format!("r{}", b.id))
            .collect(),
        ..SvgOptions::default()
    };
    memory_planner::svg(&problem, &offsets, &options)
        .map_err(|e| log::error!("cannot draw the plan of segment {key:016x}: {e}"))
        .ok()
}

/// Kernel `k`'s slice name, kind (`op`, `fused` or `chain`) and the ops it runs, in
/// order.
fn kernel_ops(
    plan: &ExecutionPlan,
    k: usize,
    op: &'static str,
) -> (String, &'static str, Vec<&'static str>) {
    let program = |p: &FusedProgram, ops: &mut Vec<&'static str>| {
        ops.extend(p.instrs.iter().filter_map(|i| match i {
            Instr::Input(_) => None,
            Instr::Unary(u, _) => Some(u.name()),
            Instr::Binary(b, _, _) => Some(b.name()),
        }))
    };
    let mut ops = Vec::new();
    let kind = match plan.kernels.get(k) {
        Some(Kernel::Op { .. }) | None => {
            ops.push(op);
            return (op.to_string(), "op", ops);
        }
        Some(Kernel::Fused { program: p, .. }) => {
            program(p, &mut ops);
            "fused"
        }
        Some(Kernel::Chain(c)) => {
            if c.matmul.is_some() {
                ops.push("matmul");
            }
            program(&c.program, &mut ops);
            if let Some(n) = &c.norm {
                ops.push(n.kind.name());
            }
            "chain"
        }
    };
    let shown: Vec<&str> = ops.iter().copied().take(6).collect();
    let more = if ops.len() > 6 { "+…" } else { "" };
    (format!("{kind}: {}{more}", shown.join("+")), kind, ops)
}

/// Bytes kernel `k` reads (through each input's layout) and writes.
fn kernel_bytes(plan: &ExecutionPlan, k: usize) -> (usize, usize) {
    let Some(kernel) = plan.kernels.get(k) else {
        return (0, 0);
    };
    let (ins, outs) = kernel.io();
    let bytes = |vs: &[u32]| -> usize {
        vs.iter()
            .filter_map(|&v| plan.values.get(v as usize))
            .map(|v| v.layout.numel() * v.dtype.size_in_bytes())
            .sum()
    };
    (bytes(ins), bytes(outs))
}
