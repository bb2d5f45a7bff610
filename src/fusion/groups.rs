//! The plan builder's fusion step: groups of element-wise ops, and their kernels.
//!
//! Takes the live ops with their facts and gives groups of op indices (each in queue
//! order) that run as one [`Kernel::Fused`]. A group holds only live f32 unary and
//! binary ops with the same output dims, at most [`MAX_GROUP_OPS`] of them; an op joins
//! the group of an input it reads through that input's own contiguous layout, and a
//! group closes (takes no more ops) once a value it makes is read by an op outside it.
//! Every op is in at most one group. [`fused_kernel`] turns a group into a kernel and
//! marks the values that never leave it [`Home::Fused`] (or [`Home::Dead`]).

use super::values::Facts;
use super::{Home, Kernel, Value};
use crate::ir::relative::RelativeOp;
use crate::ir::{DType, Dims, Layout, Op, OpKind};
use crate::kernels::{FusedProgram, Instr};

/// The most ops one fused kernel takes: keeps register numbers (u16) far from
/// overflow and the register file (512 f32 per instruction) in L2.
pub(super) const MAX_GROUP_OPS: usize = 64;

fn fusible(op: &Op) -> bool {
    matches!(op.kind, OpKind::Unary(_) | OpKind::Binary(_))
        && op.output.as_ref().is_some_and(|o| o.dtype == DType::F32)
        && op.inputs.iter().all(|i| i.dtype == DType::F32)
}

/// Step 2: groups of live element-wise ops (indices in queue order) to run as one
/// kernel. Dead ops (and Drops) are skipped as if absent.
pub(super) fn fuse(
    ops: &[&Op],
    rels: &[&RelativeOp],
    facts: &[Facts],
    values: &[Value],
    live: &[bool],
) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Vec<usize>, Dims, bool)> = Vec::new(); // ops, dims, open
    let mut group_of_op: Vec<Option<usize>> = vec![None; ops.len()];
    for (i, op) in ops.iter().enumerate() {
        if !live[i] {
            continue;
        }
        let producing_groups: Vec<(usize, u32)> = rels[i]
            .inputs
            .iter()
            .filter_map(|&v| {
                let p = facts[v as usize].producer?;
                group_of_op[p].map(|g| (g, v))
            })
            .collect();
        if fusible(op) {
            let dims = op
                .output
                .as_ref()
                .expect("fusible ops have outputs")
                .layout
                .dims;
            let join = producing_groups.iter().find(|&&(g, v)| {
                groups[g].2
                    && groups[g].0.len() < MAX_GROUP_OPS
                    && groups[g].1 == dims
                    && values[v as usize].layout == Layout::contiguous(&dims)
                    && facts[v as usize].root == v
            });
            let g = match join {
                Some(&(g, _)) => {
                    groups[g].0.push(i);
                    g
                }
                None => {
                    groups.push((vec![i], dims, true));
                    groups.len() - 1
                }
            };
            group_of_op[i] = Some(g);
            for &(other, _) in &producing_groups {
                if other != g {
                    groups[other].2 = false;
                }
            }
        } else {
            for &(g, _) in &producing_groups {
                groups[g].2 = false;
            }
        }
    }
    groups.into_iter().map(|(ops, _, _)| ops).collect()
}

pub(super) fn group_index(n_ops: usize, groups: &[Vec<usize>]) -> Vec<Option<usize>> {
    let mut g = vec![None; n_ops];
    for (k, ops) in groups.iter().enumerate() {
        for &i in ops {
            g[i] = Some(k);
        }
    }
    g
}

/// The fused kernel of one group; marks the group's values `Fused`, `Dead` or (for the
/// ones read outside the group or escaping) keeps them materialised.
pub(super) fn fused_kernel(
    ops: &[&Op],
    rels: &[&RelativeOp],
    group: &[usize],
    facts: &[Facts],
    values: &mut [Value],
) -> Kernel {
    let dims = ops[group[0]].output.as_ref().expect("fusible").layout.dims;
    let mut program = FusedProgram::default();
    let mut inputs: Vec<(u32, Layout)> = Vec::new();
    let mut reg_of: Vec<(u32, Layout, u16)> = Vec::new(); // value, layout read, register
    let mut outputs = Vec::new();
    let in_group = |i: usize| group.contains(&i);
    for &i in group {
        let op = ops[i];
        let mut regs = Vec::with_capacity(2);
        for (desc, &v) in op.inputs.iter().zip(&rels[i].inputs) {
            let made_here = facts[v as usize].producer.is_some_and(in_group);
            let layout = if made_here {
                desc.layout
            } else {
                desc.layout
                    .broadcast_as(&dims)
                    .expect("checked when recorded")
            };
            let r = match reg_of.iter().find(|(x, l, _)| *x == v && *l == layout) {
                Some(&(_, _, r)) => r,
                None => {
                    let r = program.instrs.len() as u16;
                    program.instrs.push(Instr::Input(inputs.len() as u16));
                    inputs.push((v, layout));
                    reg_of.push((v, layout, r));
                    r
                }
            };
            regs.push(r);
        }
        let r = program.instrs.len() as u16;
        program.instrs.push(match op.kind {
            OpKind::Unary(u) => Instr::Unary(u, regs[0]),
            OpKind::Binary(b) => Instr::Binary(b, regs[0], regs[1]),
            _ => unreachable!("only element-wise ops are fused"),
        });
        let v = rels[i].output.expect("fusible ops have outputs");
        reg_of.push((v, values[v as usize].layout, r));
        let f = &facts[v as usize];
        let read_outside = f.consumers.iter().any(|&c| !in_group(c));
        if values[v as usize].escapes || read_outside {
            program.outputs.push(r);
            outputs.push(v);
        } else {
            values[v as usize].home = if f.consumers.is_empty() {
                Home::Dead
            } else {
                Home::Fused
            };
        }
    }
    program.inputs = inputs.len();
    let input_ids = inputs.iter().map(|(v, _)| *v).collect();
    Kernel::Fused {
        program,
        inputs,
        input_ids,
        outputs,
        dims,
        in_place: Vec::new(), // set by `place` when the memory plan allows it
    }
}
