//! The plan builder's chain step: matmul epilogues and norm prologues around groups.
//!
//! Takes the fusion groups and gives [`ChainSpec`]s: a group extended by the matmul
//! whose product only it reads (an epilogue) and/or by the row norm (softmax, layer
//! norm, RMS norm) that alone reads one of its results (a prologue), or a matmul read
//! only by a norm. Invariants: every op is in at most one chain; the product and the
//! norm's input are f32 roots that do not escape, have the chain's contiguous dims and
//! are read only inside the chain, so [`chain_kernel`] marks them [`Home::Fused`] and
//! they never get memory; a chain's kernel is placed at its last op in the queue, and
//! nothing outside it reads a value it writes before then.

use super::build::broken;
use super::groups::{fused_parts, group_index, FusedParts};
use super::values::Facts;
use super::{Home, Kernel, Value};
use crate::error::Error;
use crate::ir::relative::RelativeOp;
use crate::ir::{DType, Dims, Layout, Op};
use crate::kernels::{FusedProgram, Instr, ProductPlan, TileEpilogue};
use crate::ops::FusionClass;

/// A fused group (or none) extended into a [`Chain`](super::Chain): the matmul op whose product only
/// it reads, and/or the norm op that alone reads its result.
#[derive(Clone, Debug)]
pub(super) struct ChainSpec {
    group: Option<usize>,
    matmul: Option<usize>,
    norm: Option<usize>,
}

fn is_row_norm(op: &Op) -> bool {
    crate::ops::class(op) == FusionClass::RowNorm
}

/// The operand layouts of matmul op `op` with their batch dims broadcast to its
/// output's, or `None` when it is not a matmul of two operands of rank 2 or more with
/// an f32 result, an f32 left operand and an f32 right one or a weight kept in reduced
/// precision (which the chain's product reads packed).
fn matmul_operands(op: &Op) -> Option<(Layout, Layout)> {
    let out = op.output.as_ref()?;
    let [lhs, rhs] = op.inputs.as_slice() else {
        return None;
    };
    if crate::ops::class(op) != FusionClass::Product
        || out.dtype != DType::F32
        || lhs.dtype != DType::F32
        || !(rhs.dtype == DType::F32 || rhs.dtype.is_weight_only())
    {
        return None;
    }
    let batch = out.layout.rank().checked_sub(2)?;
    let with_batch = |x: &Layout| {
        let mut dims = Dims::from_slice(&out.layout.dims[..batch]);
        for &d in &x.dims[x.rank().checked_sub(2)?..] {
            dims.push(d);
        }
        x.broadcast_as(&dims)
    };
    Some((with_batch(&lhs.layout)?, with_batch(&rhs.layout)?))
}

/// Whether value `v`, made by `producer`, can be computed inside a chain and never
/// stored: an f32 root that does not escape, with the contiguous layout of `dims`,
/// read (at least once) only by `readers` and only through that layout.
fn only_read_by(
    v: u32,
    dims: &Dims,
    readers: impl Fn(usize) -> bool,
    ops: &[&Op],
    rels: &[&RelativeOp],
    facts: &[Facts],
    values: &[Value],
) -> bool {
    let (val, f) = (&values[v as usize], &facts[v as usize]);
    let contiguous = Layout::contiguous(dims);
    val.dtype == DType::F32
        && !val.escapes
        && f.root == v
        && val.layout == contiguous
        && !f.consumers.is_empty()
        && f.consumers.iter().all(|&c| {
            readers(c)
                && ops[c]
                    .inputs
                    .iter()
                    .zip(&rels[c].inputs)
                    .all(|(d, &w)| w != v || d.layout == contiguous)
        })
}

/// Whether the norm `rel` reads `v` as its input and not also as a parameter (a
/// parameter must be stored; the input of a chain's norm never is).
fn norm_input_only(rel: &RelativeOp, v: u32) -> bool {
    rel.inputs
        .split_first()
        .is_some_and(|(&input, params)| input == v && !params.contains(&v))
}

/// Finds the chains: for each fused group, a matmul whose product only the group reads
/// (the epilogue) and a row norm that alone reads the group's result (the prologue);
/// and matmuls read only by a norm. A norm joins only if no other value the group
/// writes is read before it (the chain runs at the norm's place in the queue). Only
/// live ops are considered (groups hold only live ops; `facts` lists only live
/// readers).
pub(super) fn chains(
    ops: &[&Op],
    rels: &[&RelativeOp],
    facts: &[Facts],
    values: &[Value],
    groups: &[Vec<usize>],
    live: &[bool],
) -> Result<Vec<ChainSpec>, Error> {
    let group_of = group_index(ops.len(), groups)?;
    let mut specs = Vec::new();
    for (g, members) in groups.iter().enumerate() {
        let Some(&first) = members.first() else {
            return Err(broken("chains", format!("group {g} is empty")));
        };
        let Some(out) = ops[first].output.as_ref() else {
            continue;
        };
        let dims = out.layout.dims;
        let in_group = |c: usize| group_of[c] == Some(g);
        let matmul = members
            .iter()
            .flat_map(|&i| rels[i].inputs.iter())
            .find_map(|&v| {
                let p = facts[v as usize].producer?;
                (!in_group(p)
                    && matmul_operands(ops[p]).is_some()
                    && only_read_by(v, &dims, in_group, ops, rels, facts, values))
                .then_some(p)
            });
        let norm = members.iter().find_map(|&i| {
            let v = rels[i].output?;
            let &[c] = facts[v as usize].consumers.as_slice() else {
                return None;
            };
            let fits = is_row_norm(ops[c])
                && !dims.is_empty()
                && norm_input_only(rels[c], v)
                && only_read_by(v, &dims, |r| r == c, ops, rels, facts, values);
            // Every other value the group writes is read after the norm, if at all.
            let later = members.iter().all(|&j| {
                rels[j].output.is_none_or(|w| {
                    w == v
                        || facts[w as usize]
                            .consumers
                            .iter()
                            .all(|&r| in_group(r) || r > c)
                })
            });
            (fits && later).then_some(c)
        });
        if matmul.is_some() || norm.is_some() {
            specs.push(ChainSpec {
                group: Some(g),
                matmul,
                norm,
            });
        }
    }
    for (c, op) in ops.iter().enumerate() {
        if !live[c] || !is_row_norm(op) {
            continue;
        }
        let Some(&v) = rels[c].inputs.first() else {
            return Err(broken("chains", format!("norm op {c} has no input")));
        };
        let Some(p) = facts[v as usize].producer else {
            continue;
        };
        let dims = values[v as usize].layout.dims;
        if matmul_operands(ops[p]).is_some()
            && norm_input_only(rels[c], v)
            && only_read_by(v, &dims, |r| r == c, ops, rels, facts, values)
        {
            specs.push(ChainSpec {
                group: None,
                matmul: Some(p),
                norm: Some(c),
            });
        }
    }
    Ok(specs)
}

/// For each op: the chain whose kernel is placed at it (its last op), and whether a
/// chain covers it. Fails when two chains claim one op.
pub(super) fn chain_index(
    n_ops: usize,
    specs: &[ChainSpec],
    groups: &[Vec<usize>],
) -> Result<(Vec<Option<usize>>, Vec<bool>), Error> {
    let mut at = vec![None; n_ops];
    let mut covered = vec![false; n_ops];
    for (k, s) in specs.iter().enumerate() {
        let members = match s.group {
            None => &[][..],
            Some(g) => groups
                .get(g)
                .ok_or_else(|| broken("chains", format!("chain {k} names no group {g}")))?,
        };
        let all = members.iter().chain(&s.matmul).chain(&s.norm);
        for &i in all.clone() {
            match covered.get_mut(i) {
                Some(c) if !*c => *c = true,
                _ => {
                    return Err(broken(
                        "chains",
                        format!("op {i} of chain {k} is in another chain or out of range"),
                    ))
                }
            }
        }
        if let Some(&last) = all.max() {
            at[last] = Some(k);
        }
    }
    Ok((at, covered))
}

/// The kernel of one chain; marks the product and the norm's input `Fused`. Fails when
/// the spec is not one [`chains`] can have found.
pub(super) fn chain_kernel(
    ops: &[&Op],
    rels: &[&RelativeOp],
    spec: &ChainSpec,
    groups: &[Vec<usize>],
    facts: &[Facts],
    values: &mut [Value],
) -> Result<Kernel, Error> {
    let fail = |what: String| broken("chains", format!("{spec:?}: {what}"));
    let op_at = |i: usize| {
        ops.get(i)
            .copied()
            .zip(rels.get(i).copied())
            .ok_or_else(|| fail(format!("no op {i}")))
    };
    let FusedParts {
        program,
        inputs,
        mut outputs,
        dims,
    } = match spec.group {
        Some(g) => {
            let group = groups.get(g).ok_or_else(|| fail(format!("no group {g}")))?;
            fused_parts(ops, rels, group, facts, values)?
        }
        None => {
            // A matmul straight into a norm: the program copies the product.
            let p = spec
                .matmul
                .ok_or_else(|| fail("neither a group nor a matmul".into()))?;
            let v = op_at(p)?
                .1
                .output
                .ok_or_else(|| fail(format!("matmul op {p} has no output")))?;
            let dims = values[v as usize].layout.dims;
            let program = FusedProgram {
                inputs: 1,
                instrs: vec![Instr::Input(0)],
                outputs: vec![0],
            };
            FusedParts {
                program,
                inputs: vec![(v, Layout::contiguous(&dims))],
                outputs: vec![v],
                dims,
            }
        }
    };
    let matmul = match spec.matmul {
        None => None,
        Some(p) => {
            let (op, rel) = op_at(p)?;
            let (Some(product), Some((lhs, rhs)), &[a, b]) =
                (rel.output, matmul_operands(op), rel.inputs.as_slice())
            else {
                return Err(fail(format!("op {p} is not an f32 matmul")));
            };
            values[product as usize].home = Home::Fused;
            let input = inputs
                .iter()
                .position(|(v, _)| *v == product)
                .ok_or_else(|| fail(format!("the product r{product} is not a program input")))?;
            let weight = super::build::is_weight(values, b);
            let plan = ProductPlan::of(&lhs, &rhs, op.inputs[1].dtype, weight);
            let epilogue = if plan.epilogue_in_tile(&lhs) {
                TileEpilogue::plan(&program, input)
            } else {
                None
            };
            Some(super::MatMulHead {
                op: p,
                lhs: (a, lhs),
                rhs: (b, rhs),
                product,
                input,
                plan,
                epilogue,
            })
        }
    };
    let norm = match spec.norm {
        None => None,
        Some(c) => {
            let (op, rel) = op_at(c)?;
            let (Some((&input, params)), Some((_, param_descs)), Some(out)) = (
                rel.inputs.split_first(),
                op.inputs.split_first(),
                rel.output,
            ) else {
                return Err(fail(format!("norm op {c} has no input or no output")));
            };
            let output = outputs
                .iter()
                .position(|&o| o == input)
                .ok_or_else(|| fail(format!("the norm's input r{input} is not written")))?;
            outputs[output] = out;
            values[input as usize].home = Home::Fused;
            Some(super::NormTail {
                op: c,
                kind: op.kind.clone(),
                params: params
                    .iter()
                    .zip(param_descs)
                    .map(|(&v, d)| (v, d.layout))
                    .collect(),
                output,
            })
        }
    };
    let mut input_ids: Vec<u32> = Vec::new();
    if let Some(m) = &matmul {
        input_ids.extend([m.lhs.0, m.rhs.0]);
    }
    input_ids.extend(
        inputs
            .iter()
            .map(|(v, _)| *v)
            .filter(|&v| matmul.as_ref().is_none_or(|m| m.product != v)),
    );
    if let Some(n) = &norm {
        input_ids.extend(n.params.iter().map(|(v, _)| *v));
    }
    Ok(Kernel::Chain(Box::new(super::Chain {
        matmul,
        program,
        inputs,
        norm,
        input_ids,
        outputs,
        dims,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::testutil::{drop_of, op_dims, plan, relative, staged};
    use crate::ir::{BinaryOp, OpKind, UnaryOp};

    const X: &[usize] = &[4, 8];
    const W: &[usize] = &[8, 4];
    const P: &[usize] = &[4, 4];
    const ROW: &[usize] = &[4];

    fn matmul(x: u64, w: u64, out: u64) -> Op {
        op_dims(OpKind::MatMul, &[(x, X), (w, W)], (out, P))
    }

    fn binary(b: BinaryOp, x: (u64, &[usize]), y: (u64, &[usize]), out: u64) -> Op {
        op_dims(OpKind::Binary(b), &[x, y], (out, P))
    }

    fn layer_norm(x: u64, gamma: u64, beta: u64, out: u64) -> Op {
        op_dims(
            OpKind::LayerNorm {
                eps: 1e-5f64.to_bits(),
            },
            &[(x, P), (gamma, ROW), (beta, ROW)],
            (out, P),
        )
    }

    fn the_chain(p: &crate::fusion::ExecutionPlan) -> &crate::fusion::Chain {
        match &p.kernels[..] {
            [Kernel::Chain(c)] => c,
            _ => panic!("expected one chain: {p}"),
        }
    }

    #[test]
    fn matmul_bias_gelu_is_one_chain() {
        use crate::kernels::{ProductPath, TileEpilogue};
        // p = x·w; q = p + bias; g = gelu(q).
        let ops = [
            matmul(0, 1, 2),
            binary(BinaryOp::Add, (2, P), (3, ROW), 4),
            op_dims(OpKind::Unary(UnaryOp::Gelu), &[(4, P)], (5, P)),
            drop_of(2),
            drop_of(4),
        ];
        let p = plan(&ops);
        let c = the_chain(&p);
        assert_eq!(c.matmul.as_ref().map(|m| (m.op, m.product)), Some((0, 2)));
        assert!(c.norm.is_none(), "{p}");
        // A 4 x 4 weight is not worth packing: gemm, and the program runs over the
        // product.
        let head = c.matmul.as_ref().unwrap();
        assert_eq!(head.plan.path, ProductPath::Gemm, "{p}");
        assert!(head.epilogue.is_none(), "{p}");
        // At 32 x 32 the plan puts the product on the tier's tile, and the program in
        // it where the tile takes one: the bias add, then GELU.
        const BIG: &[usize] = &[32, 32];
        let ops = [
            op_dims(OpKind::MatMul, &[(0, BIG), (1, BIG)], (2, BIG)),
            op_dims(
                OpKind::Binary(BinaryOp::Add),
                &[(2, BIG), (3, &[32])],
                (4, BIG),
            ),
            op_dims(OpKind::Unary(UnaryOp::Gelu), &[(4, BIG)], (5, BIG)),
            drop_of(2),
            drop_of(4),
        ];
        let big = plan(&ops);
        let head = the_chain(&big).matmul.as_ref().unwrap();
        let tile = crate::kernels::PackedRhs::tile(DType::F32);
        assert_eq!(
            head.plan.path,
            tile.map_or(ProductPath::Gemm, ProductPath::Packed)
        );
        let steps = head.epilogue.as_ref().map(TileEpilogue::steps);
        if tile.is_some_and(|t| t.epilogue) {
            assert!(
                matches!(
                    steps,
                    Some([crate::kernels::Step::Add { .. }, crate::kernels::Step::Gelu])
                ),
                "{steps:?}"
            );
            let listing = big.to_string();
            assert!(listing.contains("program in the tile"), "{listing}");
        } else {
            assert!(steps.is_none(), "{big}");
        }
        assert_eq!(
            (&c.input_ids[..], &c.outputs[..]),
            (&[0, 1, 3][..], &[5][..])
        );
        assert_eq!(
            (p.values[2].home, p.values[4].home),
            (Home::Fused, Home::Fused)
        );
        assert_eq!(p.arena_len, 0, "{p}");
    }

    #[test]
    fn matmul_residual_layer_norm_is_one_chain() {
        // p = x·w; s = p + r; y = layer_norm(s, gamma, beta).
        let ops = [
            matmul(0, 1, 2),
            binary(BinaryOp::Add, (2, P), (3, P), 4),
            layer_norm(4, 5, 6, 7),
            drop_of(2),
            drop_of(4),
        ];
        let p = plan(&ops);
        let c = the_chain(&p);
        assert_eq!(c.matmul.as_ref().map(|m| m.op), Some(0));
        let norm = c.norm.as_ref().expect("a norm");
        assert_eq!((norm.op, norm.output), (2, 0));
        assert_eq!(
            norm.params.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
            [5, 6]
        );
        assert_eq!(
            (&c.input_ids[..], &c.outputs[..]),
            (&[0, 1, 3, 5, 6][..], &[7][..])
        );
        assert_eq!(
            (p.values[2].home, p.values[4].home),
            (Home::Fused, Home::Fused)
        );
    }

    #[test]
    fn matmul_into_softmax_is_a_chain_without_a_group() {
        let ops = [
            matmul(0, 1, 2),
            op_dims(OpKind::Softmax, &[(2, P)], (3, P)),
            drop_of(2),
        ];
        let st = staged(&ops);
        assert!(st.groups.is_empty());
        let p = plan(&ops);
        let c = the_chain(&p);
        assert_eq!(
            c.program.instrs.len(),
            1,
            "the program copies the product: {p}"
        );
        assert_eq!((&c.input_ids[..], &c.outputs[..]), (&[0, 1][..], &[3][..]));
        assert_eq!(p.values[2].home, Home::Fused);
    }

    #[test]
    fn what_does_not_chain() {
        // The product escapes: a matmul kernel and a fused kernel.
        let kept = [matmul(0, 1, 2), binary(BinaryOp::Add, (2, P), (3, ROW), 4)];
        assert!(staged(&kept).specs.is_empty());
        assert_eq!(plan(&kept).kernels.len(), 2);
        // The product is read by the group and by a softmax.
        let shared = [
            matmul(0, 1, 2),
            binary(BinaryOp::Add, (2, P), (3, ROW), 4),
            op_dims(OpKind::Softmax, &[(2, P)], (5, P)),
            drop_of(2),
        ];
        assert!(staged(&shared).specs.is_empty());
        // The norm's input is read by another op too: the group keeps its epilogue but
        // takes no norm.
        let read_twice = [
            matmul(0, 1, 2),
            binary(BinaryOp::Add, (2, P), (3, P), 4),
            layer_norm(4, 5, 6, 7),
            op_dims(OpKind::Unary(UnaryOp::Exp), &[(4, P)], (8, P)),
            drop_of(2),
            drop_of(4),
        ];
        let st = staged(&read_twice);
        assert_eq!(st.specs.len(), 1);
        assert!(st.specs[0].matmul.is_some() && st.specs[0].norm.is_none());
        // A matmul of rank 1 does not chain.
        let mut vector = matmul(0, 1, 2);
        vector.inputs[0].layout = Layout::contiguous(&[8]);
        vector.output.as_mut().unwrap().layout = Layout::contiguous(&[4]);
        assert!(matmul_operands(&vector).is_none());
        assert!(matmul_operands(&matmul(0, 1, 2)).is_some());
    }

    #[test]
    fn broken_chains_are_internal_errors() {
        // s = exp(x) + y is a group; q = softmax(y) does not read it.
        let ops = [
            op_dims(OpKind::Unary(UnaryOp::Exp), &[(0, P)], (1, P)),
            binary(BinaryOp::Add, (1, P), (2, P), 3),
            op_dims(OpKind::Softmax, &[(2, P)], (4, P)),
        ];
        let st = staged(&ops);
        assert_eq!(st.groups, [vec![0, 1]]);
        let rels = relative(&ops);
        let (ops, rels): (Vec<&Op>, Vec<&RelativeOp>) =
            (ops.iter().collect(), rels.iter().collect());
        let kernel = |spec: ChainSpec| {
            let mut values = st.values.clone();
            match chain_kernel(&ops, &rels, &spec, &st.groups, &st.facts, &mut values) {
                Err(Error::Internal { msg }) => msg,
                other => panic!("expected an internal error, got {other:?}"),
            }
        };
        let spec = |group, matmul, norm| ChainSpec {
            group,
            matmul,
            norm,
        };
        let msg = kernel(spec(Some(0), None, Some(2)));
        assert!(msg.contains("the norm's input r2 is not written"), "{msg}");
        let msg = kernel(spec(None, None, Some(2)));
        assert!(msg.contains("neither a group nor a matmul"), "{msg}");
        let msg = kernel(spec(Some(0), Some(2), None));
        assert!(msg.contains("op 2 is not an f32 matmul"), "{msg}");
        let msg = kernel(spec(Some(3), None, None));
        assert!(msg.contains("no group 3"), "{msg}");
        match chain_index(
            3,
            &[spec(Some(0), None, None), spec(None, Some(1), Some(2))],
            &st.groups,
        ) {
            Err(Error::Internal { msg }) => assert!(msg.contains("op 1 of chain 1"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
}
