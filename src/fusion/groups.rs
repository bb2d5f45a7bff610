//! The plan builder's fusion step: groups of element-wise ops, and their kernels.
//!
//! Takes the live ops with their facts and gives groups of op indices (each in queue
//! order) that run as one [`Kernel::Fused`]. A group holds only live f32 unary and
//! binary ops with the same output dims, at most [`MAX_GROUP_OPS`] of them; an op joins
//! the group of an input it reads through that input's own contiguous layout, and a
//! group closes (takes no more ops) once a value it makes is read by an op outside it.
//! Every op is in at most one group. [`fused_kernel`] turns a group into a kernel and
//! marks the values that never leave it [`Home::Fused`] (or [`Home::Dead`]).

use super::build::broken;
use super::values::Facts;
use super::{Home, Kernel, Value};
use crate::error::Error;
use crate::ir::relative::RelativeOp;
use crate::ir::{DType, Dims, Layout, Op, OpKind};
use crate::kernels::{FusedProgram, Instr};

/// The most ops one fused kernel takes: keeps register numbers (u16) far from
/// overflow and the register file (512 f32 per instruction) in L2.
pub(super) const MAX_GROUP_OPS: usize = 64;

/// The output dims of `op` when it can be fused: an f32 unary op of one input or
/// binary op of two, with f32 inputs.
fn fusible(op: &Op) -> Option<Dims> {
    let arity = match op.kind {
        OpKind::Unary(_) => 1,
        OpKind::Binary(_) => 2,
        _ => return None,
    };
    let out = op.output.as_ref()?;
    (out.dtype == DType::F32
        && op.inputs.len() == arity
        && op.inputs.iter().all(|i| i.dtype == DType::F32))
    .then_some(out.layout.dims)
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
        if let Some(dims) = fusible(op) {
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

/// For each op, the group that holds it. Fails when an op is out of range or in two
/// groups.
pub(super) fn group_index(
    n_ops: usize,
    groups: &[Vec<usize>],
) -> Result<Vec<Option<usize>>, Error> {
    let mut g = vec![None; n_ops];
    for (k, ops) in groups.iter().enumerate() {
        for &i in ops {
            match g.get_mut(i) {
                Some(slot @ None) => *slot = Some(k),
                _ => {
                    return Err(broken(
                        "groups",
                        format!("op {i} of group {k} is in another group or out of range"),
                    ))
                }
            }
        }
    }
    Ok(g)
}

/// A fused group's program and the values it reads and writes.
pub(super) struct FusedParts {
    /// The register program.
    pub(super) program: FusedProgram,
    /// External inputs with their layouts broadcast to `dims`.
    pub(super) inputs: Vec<(u32, Layout)>,
    /// Values written, in the program's output order.
    pub(super) outputs: Vec<u32>,
    /// The dims of every value of the group.
    pub(super) dims: Dims,
}

/// The fused kernel of one group; marks the group's values `Fused`, `Dead` or (for the
/// ones read outside the group or escaping) keeps them materialised.
pub(super) fn fused_kernel(
    ops: &[&Op],
    rels: &[&RelativeOp],
    group: &[usize],
    facts: &[Facts],
    values: &mut [Value],
) -> Result<Kernel, Error> {
    let FusedParts {
        program,
        inputs,
        outputs,
        dims,
    } = fused_parts(ops, rels, group, facts, values)?;
    let input_ids = inputs.iter().map(|(v, _)| *v).collect();
    Ok(Kernel::Fused {
        program,
        inputs,
        input_ids,
        outputs,
        dims,
        in_place: Vec::new(), // set by `place` when the memory plan allows it
    })
}

/// The program of one group (see [`fused_kernel`]), which marks the group's values.
/// Fails when the group is empty or holds an op that cannot be fused.
pub(super) fn fused_parts(
    ops: &[&Op],
    rels: &[&RelativeOp],
    group: &[usize],
    facts: &[Facts],
    values: &mut [Value],
) -> Result<FusedParts, Error> {
    let fail = |what: String| broken("groups", what);
    let &first = group.first().ok_or_else(|| fail("an empty group".into()))?;
    let dims = ops.get(first).and_then(|op| fusible(op)).ok_or_else(|| {
        fail(format!(
            "group {group:?} starts with op {first}, not fusible"
        ))
    })?;
    let mut program = FusedProgram::default();
    let mut inputs: Vec<(u32, Layout)> = Vec::new();
    let mut reg_of: Vec<(u32, Layout, u16)> = Vec::new(); // value, layout read, register
    let mut outputs = Vec::new();
    let in_group = |i: usize| group.contains(&i);
    for &i in group {
        let (op, rel) = match (ops.get(i), rels.get(i)) {
            (Some(&op), Some(&rel)) if fusible(op).is_some() => (op, rel),
            _ => return Err(fail(format!("op {i} of group {group:?} is not fusible"))),
        };
        let mut regs = Vec::with_capacity(2);
        for (desc, &v) in op.inputs.iter().zip(&rel.inputs) {
            let made_here = facts[v as usize].producer.is_some_and(in_group);
            let layout = if made_here {
                desc.layout
            } else {
                desc.layout.broadcast_as(&dims).ok_or_else(|| {
                    fail(format!(
                        "input r{v} of op {i} does not broadcast to {dims:?}"
                    ))
                })?
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
        program.instrs.push(match (&op.kind, regs.as_slice()) {
            (&OpKind::Unary(u), &[a]) => Instr::Unary(u, a),
            (&OpKind::Binary(b), &[a, c]) => Instr::Binary(b, a, c),
            _ => return Err(fail(format!("op {i} has the wrong number of inputs"))),
        });
        let v = rel
            .output
            .ok_or_else(|| fail(format!("op {i} has no output")))?;
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
    Ok(FusedParts {
        program,
        inputs,
        outputs,
        dims,
    })
}
