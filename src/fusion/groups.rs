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
use crate::ops::FusionClass;

/// The most ops one fused kernel takes: keeps register numbers (u16) far from
/// overflow and the register file (512 f32 per instruction) in L2.
pub(super) const MAX_GROUP_OPS: usize = 64;

/// The output dims of `op` when it can be fused: an f32 unary op of one input or
/// binary op of two, with f32 inputs.
fn fusible(op: &Op) -> Option<Dims> {
    let FusionClass::Elementwise { arity } = crate::ops::class(op) else {
        return None;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::testutil::{add, drop_of, exp, op, op_dims, plan, relative, staged, DIMS};
    use crate::ir::BinaryOp;

    #[test]
    fn a_run_of_element_wise_ops_is_one_kernel() {
        // a = exp(x), b = a + x, c = exp(b); a and b dropped, c kept.
        let ops = [exp(0, 1), add(1, 0, 2), exp(2, 3), drop_of(1), drop_of(2)];
        assert_eq!(staged(&ops).groups, [vec![0, 1, 2]]);
        let p = plan(&ops);
        let [Kernel::Fused {
            program,
            input_ids,
            outputs,
            ..
        }] = &p.kernels[..]
        else {
            panic!("{p}")
        };
        assert_eq!((&input_ids[..], &outputs[..]), (&[0][..], &[3][..]), "{p}");
        assert_eq!(
            program.instrs.len(),
            4,
            "one input read once, three ops: {p}"
        );
        assert_eq!(
            (p.values[1].home, p.values[2].home),
            (Home::Fused, Home::Fused)
        );
        assert_eq!((p.values[3].home, p.arena_len), (Home::Pooled, 0));
    }

    #[test]
    fn a_group_takes_at_most_max_group_ops() {
        let n = MAX_GROUP_OPS as u64 + 6;
        let mut ops: Vec<Op> = (0..n).map(|i| exp(i, i + 1)).collect();
        ops.extend((1..n).map(drop_of));
        let groups = staged(&ops).groups;
        let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
        assert_eq!(sizes, [MAX_GROUP_OPS, 6]);
        assert_eq!(
            groups[1][0], MAX_GROUP_OPS,
            "the second group starts where the first ends"
        );
    }

    #[test]
    fn a_value_read_by_a_non_fusible_op_closes_its_group() {
        // a = exp(x); s = softmax(a); b = exp(a); c = b + s.
        let ops = [
            exp(0, 1),
            op(OpKind::Softmax, &[1], Some(2)),
            exp(1, 3),
            add(3, 2, 4),
        ];
        assert_eq!(staged(&ops).groups, [vec![0], vec![2, 3]]);
    }

    #[test]
    fn other_dims_views_and_other_dtypes_start_a_new_group() {
        let wide: &[usize] = &[2, 4, 4];
        // b = a + y broadcasts a [4, 4] to [2, 4, 4]: other dims.
        let broadcast = [
            exp(0, 1),
            op_dims(
                OpKind::Binary(BinaryOp::Add),
                &[(1, &DIMS), (2, wide)],
                (3, wide),
            ),
        ];
        assert_eq!(staged(&broadcast).groups, [vec![0], vec![1]]);
        // b = exp(view(a)): the view is not a root.
        let view = [exp(0, 1), op(OpKind::View, &[1], Some(2)), exp(2, 3)];
        assert_eq!(staged(&view).groups, [vec![0], vec![2]]);
        // A cast is not fusible, nor is an op reading a u32.
        let mut u32_exp = exp(0, 1);
        u32_exp.inputs[0].dtype = DType::U32;
        assert_eq!(fusible(&u32_exp), None);
        assert_eq!(fusible(&op(OpKind::Cast, &[0], Some(1))), None);
        assert_eq!(fusible(&exp(0, 1)), Some(Dims::from_slice(&DIMS)));
    }

    #[test]
    fn broken_groups_are_internal_errors() {
        let ops = [exp(0, 1), op(OpKind::Softmax, &[1], Some(2))];
        let st = staged(&ops);
        let rels = relative(&ops);
        let (ops, rels): (Vec<&Op>, Vec<&RelativeOp>) =
            (ops.iter().collect(), rels.iter().collect());
        let mut values = st.values.clone();
        let internal = |r: Result<Kernel, Error>| match r {
            Err(Error::Internal { msg }) => msg,
            other => panic!("expected an internal error, got {other:?}"),
        };
        let msg = internal(fused_kernel(&ops, &rels, &[], &st.facts, &mut values));
        assert!(msg.contains("groups step: an empty group"), "{msg}");
        let msg = internal(fused_kernel(&ops, &rels, &[0, 1], &st.facts, &mut values));
        assert!(msg.contains("op 1 of group [0, 1] is not fusible"), "{msg}");
        let msg = internal(fused_kernel(&ops, &rels, &[0, 7], &st.facts, &mut values));
        assert!(msg.contains("op 7 of group [0, 7] is not fusible"), "{msg}");
        for groups in [vec![vec![0], vec![0]], vec![vec![5]]] {
            match group_index(2, &groups) {
                Err(Error::Internal { msg }) => {
                    assert!(msg.contains("another group or out of range"), "{msg}")
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
