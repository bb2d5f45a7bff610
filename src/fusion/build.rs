//! Building an [`ExecutionPlan`] from a segment: values, fusion, levels, memory.
//!
//! See the module docs of [`crate::fusion`] for the steps; each is a function here
//! (dead work is removed by `prune`, fusion is `fuse`, then `chains` for matmul
//! epilogues and norm prologues).

use std::time::Duration;

use super::{ExecutionPlan, Home, Kernel, Value};
use crate::ir::relative::RelativeOp;
use crate::ir::{DType, Dims, Layout, Op, OpKind};
use crate::kernels::{FusedProgram, Instr};
use crate::plan;

/// What the segment says about one value.
#[derive(Clone, Debug, Default)]
struct Facts {
    producer: Option<usize>,
    consumers: Vec<usize>,
    dropped: bool,
    root: u32,
}

/// Plans a segment given its ops and their relative forms (same length, same order).
pub fn build(ops: &[&Op], rels: &[&RelativeOp]) -> ExecutionPlan {
    let n_values = rels
        .iter()
        .flat_map(|r| r.inputs.iter().chain(r.output.iter()))
        .map(|&v| v as usize + 1)
        .max()
        .unwrap_or(0);
    let (mut values, mut facts) = describe(ops, rels, n_values);
    let live = prune(rels, &mut facts, &mut values);
    let groups = fuse(ops, rels, &facts, &values, &live);
    let specs = chains(ops, rels, &facts, &values, &groups, &live);
    let (chain_at, in_chain) = chain_index(ops.len(), &specs, &groups);
    let mut kernels = Vec::new();
    let mut kernel_of_group = vec![usize::MAX; groups.len()];
    let group_of = group_index(ops.len(), &groups);
    for (i, op) in ops.iter().enumerate() {
        let rel = rels[i];
        if let Some(c) = chain_at[i] {
            kernels.push(chain_kernel(
                ops,
                rels,
                &specs[c],
                &groups,
                &facts,
                &mut values,
            ));
            continue;
        }
        if in_chain[i] || !live[i] {
            continue;
        }
        if let Some(g) = group_of[i] {
            if groups[g].last() == Some(&i) {
                kernel_of_group[g] = kernels.len();
                kernels.push(fused_kernel(ops, rels, &groups[g], &facts, &mut values));
            }
            continue;
        }
        match op.kind {
            OpKind::Drop | OpKind::View => {}
            _ => kernels.push(Kernel::Op {
                op: i,
                inputs: rel.inputs.clone(),
                output: [rel.output.expect("ops other than Drop have an output")],
            }),
        }
    }
    let levels = levels(&kernels, &facts, n_values);
    // Sort kernels by level, keeping queue order within a level.
    let mut order: Vec<usize> = (0..kernels.len()).collect();
    order.sort_by_key(|&k| (levels[k], k));
    let kernels: Vec<Kernel> = order.iter().map(|&k| kernels[k].clone()).collect();
    let levels: Vec<u32> = order.iter().map(|&k| levels[k]).collect();
    let mut kernels = kernels;
    let (arena_len, arena_lower_bound) = place(&mut kernels, &levels, &facts, &mut values);
    ExecutionPlan {
        values,
        kernels,
        levels,
        arena_len,
        arena_lower_bound,
        ops: ops.len(),
        dead_ops: ops
            .iter()
            .zip(&live)
            .filter(|(op, &l)| !l && !matches!(op.kind, OpKind::Drop))
            .count(),
        work: ops
            .iter()
            .zip(&live)
            .filter(|(_, &l)| l)
            .map(|(op, _)| op.work())
            .fold(0, usize::saturating_add),
    }
}

/// Step 1: every value's dtype, layout, producer, readers, and whether it escapes.
fn describe(ops: &[&Op], rels: &[&RelativeOp], n: usize) -> (Vec<Value>, Vec<Facts>) {
    let mut values = vec![
        Value {
            dtype: DType::F32,
            layout: Layout::contiguous(&[]),
            home: Home::Input,
            escapes: false,
        };
        n
    ];
    let mut facts: Vec<Facts> = (0..n)
        .map(|v| Facts {
            root: v as u32,
            ..Facts::default()
        })
        .collect();
    for (i, (op, rel)) in ops.iter().zip(rels).enumerate() {
        for (desc, &v) in op.inputs.iter().zip(&rel.inputs) {
            let f = &mut facts[v as usize];
            if op.kind == OpKind::Drop {
                f.dropped = true;
            } else {
                f.consumers.push(i);
            }
            if f.producer.is_none() {
                values[v as usize].dtype = desc.dtype;
                values[v as usize].layout = desc.layout;
            }
        }
        if let (Some(desc), Some(v)) = (&op.output, rel.output) {
            values[v as usize].dtype = desc.dtype;
            values[v as usize].layout = desc.layout;
            facts[v as usize].producer = Some(i);
            if op.kind == OpKind::View {
                let root = facts[rel.inputs[0] as usize].root;
                facts[v as usize].root = root;
                values[v as usize].home = Home::View { root };
            } else {
                values[v as usize].home = Home::Pooled;
            }
        }
    }
    for v in 0..n {
        let f = &facts[v];
        values[v].escapes = f.producer.is_some() && !f.dropped;
    }
    // A root escapes when any of its views does.
    for v in 0..n {
        if values[v].escapes {
            let r = facts[v].root as usize;
            values[r].escapes |= facts[r].producer.is_some();
        }
    }
    (values, facts)
}

/// Step 1b: removes dead work. A value is live when it escapes or a live op reads it
/// (a view reads its input, so a live view keeps its root live); an op is live when
/// its output is. One backward pass settles it, since every reader of a value comes
/// after its producer in the queue. Dead ops are forgotten as readers (so they keep
/// nothing alive and split no fused chain), and their outputs become [`Home::Dead`]:
/// no kernel, no memory. Returns which ops are live (Drops never are).
///
/// This is safe because a Drop is queued only when the value's last handle goes, after
/// every op that reads it was queued; and an op of another stream that reads a pending
/// value first drains the producer, so the value is made in an earlier segment, where
/// it escapes. A value whose Drop is in the segment is read by nothing outside it.
fn prune(rels: &[&RelativeOp], facts: &mut [Facts], values: &mut [Value]) -> Vec<bool> {
    let mut live_value: Vec<bool> = values.iter().map(|v| v.escapes).collect();
    let mut live = vec![false; rels.len()];
    for (i, rel) in rels.iter().enumerate().rev() {
        if rel.output.is_some_and(|v| live_value[v as usize]) {
            live[i] = true;
            for &v in &rel.inputs {
                live_value[v as usize] = true;
            }
        }
    }
    for (v, f) in facts.iter_mut().enumerate() {
        f.consumers.retain(|&c| live[c]);
        if f.producer.is_some() && !live_value[v] {
            values[v].home = Home::Dead;
        }
    }
    live
}

/// The most ops one fused kernel takes: keeps register numbers (u16) far from
/// overflow and the register file (512 f32 per instruction) in L2.
const MAX_GROUP_OPS: usize = 64;

fn fusible(op: &Op) -> bool {
    matches!(op.kind, OpKind::Unary(_) | OpKind::Binary(_))
        && op.output.as_ref().is_some_and(|o| o.dtype == DType::F32)
        && op.inputs.iter().all(|i| i.dtype == DType::F32)
}

/// Step 2: groups of live element-wise ops (indices in queue order) to run as one
/// kernel. Dead ops (and Drops) are skipped as if absent.
fn fuse(
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

fn group_index(n_ops: usize, groups: &[Vec<usize>]) -> Vec<Option<usize>> {
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
fn fused_kernel(
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

/// The values a kernel reads and writes.
pub fn kernel_io(k: &Kernel) -> (&[u32], &[u32]) {
    match k {
        Kernel::Op { inputs, output, .. } => (inputs, output),
        Kernel::Fused {
            input_ids, outputs, ..
        } => (input_ids, outputs),
        Kernel::Chain(c) => (&c.input_ids, &c.outputs),
    }
}

/// A fused group (or none) extended into a [`Chain`]: the matmul op whose product only
/// it reads, and/or the norm op that alone reads its result.
#[derive(Clone, Debug)]
struct ChainSpec {
    group: Option<usize>,
    matmul: Option<usize>,
    norm: Option<usize>,
}

fn is_row_norm(kind: &OpKind) -> bool {
    matches!(
        kind,
        OpKind::Softmax | OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. }
    )
}

/// The operand layouts of matmul op `op` with their batch dims broadcast to its
/// output's, or `None` when it is not an f32 matmul.
fn matmul_operands(op: &Op) -> Option<(Layout, Layout)> {
    let out = op.output.as_ref()?;
    if op.kind != OpKind::MatMul
        || out.dtype != DType::F32
        || op.inputs.iter().any(|i| i.dtype != DType::F32)
    {
        return None;
    }
    let rank = out.layout.rank();
    let with_batch = |x: &Layout| {
        let mut dims = Dims::from_slice(&out.layout.dims[..rank - 2]);
        for &d in &x.dims[x.rank() - 2..] {
            dims.push(d);
        }
        x.broadcast_as(&dims)
    };
    Some((
        with_batch(&op.inputs[0].layout)?,
        with_batch(&op.inputs[1].layout)?,
    ))
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
    rel.inputs.first() == Some(&v) && !rel.inputs[1..].contains(&v)
}

/// Finds the chains: for each fused group, a matmul whose product only the group reads
/// (the epilogue) and a row norm that alone reads the group's result (the prologue);
/// and matmuls read only by a norm. A norm joins only if no other value the group
/// writes is read before it (the chain runs at the norm's place in the queue). Only
/// live ops are considered (groups hold only live ops; `facts` lists only live
/// readers).
fn chains(
    ops: &[&Op],
    rels: &[&RelativeOp],
    facts: &[Facts],
    values: &[Value],
    groups: &[Vec<usize>],
    live: &[bool],
) -> Vec<ChainSpec> {
    let group_of = group_index(ops.len(), groups);
    let mut specs = Vec::new();
    for (g, members) in groups.iter().enumerate() {
        let Some(out) = ops[members[0]].output.as_ref() else {
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
            let fits = is_row_norm(&ops[c].kind)
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
        if !live[c] || !is_row_norm(&op.kind) {
            continue;
        }
        let v = rels[c].inputs[0];
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
    specs
}

/// For each op: the chain whose kernel is placed at it (its last op), and whether a
/// chain covers it.
fn chain_index(
    n_ops: usize,
    specs: &[ChainSpec],
    groups: &[Vec<usize>],
) -> (Vec<Option<usize>>, Vec<bool>) {
    let mut at = vec![None; n_ops];
    let mut covered = vec![false; n_ops];
    for (k, s) in specs.iter().enumerate() {
        let members = s.group.map_or(&[][..], |g| &groups[g][..]);
        let all = members.iter().chain(&s.matmul).chain(&s.norm);
        for &i in all.clone() {
            covered[i] = true;
        }
        if let Some(&last) = all.max() {
            at[last] = Some(k);
        }
    }
    (at, covered)
}

/// The kernel of one chain; marks the product and the norm's input `Fused`.
fn chain_kernel(
    ops: &[&Op],
    rels: &[&RelativeOp],
    spec: &ChainSpec,
    groups: &[Vec<usize>],
    facts: &[Facts],
    values: &mut [Value],
) -> Kernel {
    let (program, inputs, mut outputs, dims) = match spec.group {
        Some(g) => match fused_kernel(ops, rels, &groups[g], facts, values) {
            Kernel::Fused {
                program,
                inputs,
                outputs,
                dims,
                ..
            } => (program, inputs, outputs, dims),
            _ => unreachable!("fused_kernel makes a fused kernel"),
        },
        None => {
            // A matmul straight into a norm: the program copies the product.
            let p = spec.matmul.expect("a chain without a group has a matmul");
            let v = rels[p].output.expect("a matmul has an output");
            let dims = values[v as usize].layout.dims;
            let program = FusedProgram {
                inputs: 1,
                instrs: vec![Instr::Input(0)],
                outputs: vec![0],
            };
            (program, vec![(v, Layout::contiguous(&dims))], vec![v], dims)
        }
    };
    let matmul = spec.matmul.map(|p| {
        let product = rels[p].output.expect("a matmul has an output");
        let (lhs, rhs) = matmul_operands(ops[p]).expect("checked by chains()");
        values[product as usize].home = Home::Fused;
        super::ChainMatMul {
            op: p,
            lhs: (rels[p].inputs[0], lhs),
            rhs: (rels[p].inputs[1], rhs),
            product,
            input: inputs
                .iter()
                .position(|(v, _)| *v == product)
                .expect("the product is an input of the group"),
        }
    });
    let norm = spec.norm.map(|c| {
        let input = rels[c].inputs[0];
        let output = outputs
            .iter()
            .position(|&o| o == input)
            .expect("the norm's input is written by the group");
        outputs[output] = rels[c].output.expect("a norm has an output");
        values[input as usize].home = Home::Fused;
        super::ChainNorm {
            op: c,
            kind: ops[c].kind.clone(),
            params: rels[c].inputs[1..]
                .iter()
                .zip(&ops[c].inputs[1..])
                .map(|(&v, d)| (v, d.layout))
                .collect(),
            output,
            input,
        }
    });
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
    Kernel::Chain(Box::new(super::Chain {
        matmul,
        program,
        inputs,
        norm,
        input_ids,
        outputs,
        dims,
    }))
}

/// Step 3: the level of each kernel (in the given order).
fn levels(kernels: &[Kernel], facts: &[Facts], n_values: usize) -> Vec<u32> {
    let mut level_of_root = vec![0u32; n_values];
    let mut levels = Vec::with_capacity(kernels.len());
    for k in kernels {
        let (ins, outs) = kernel_io(k);
        let lvl = ins
            .iter()
            .map(|&v| level_of_root[facts[v as usize].root as usize])
            .max()
            .map_or(0, |l| l + 1);
        for &v in outs {
            level_of_root[v as usize] = lvl;
        }
        levels.push(lvl);
    }
    levels
}

/// Step 4: arena offsets for f32 roots born and dead in the segment; pooled buffers for
/// the rest. Returns the arena length and the lower bound, in f32 elements.
///
/// A fused kernel's arena output may take the bytes of an arena input that dies at the
/// kernel's level (an in-place pair of the planner) when the kernel reads it at the
/// index it writes (the same length, a contiguous layout from offset 0) and nothing
/// else reads it at that level (kernels of one level may run at once). Where the
/// planner gives both the same offset, the kernel records the pair and reads that
/// input from its output region.
fn place(
    kernels: &mut [Kernel],
    levels: &[u32],
    facts: &[Facts],
    values: &mut [Value],
) -> (usize, usize) {
    const ALIGN: usize = 16; // elements: 64 bytes
    let n = values.len();
    let mut born = vec![u32::MAX; n];
    let mut last = vec![0u32; n];
    for (k, &lvl) in kernels.iter().zip(levels) {
        let (ins, outs) = kernel_io(k);
        for &v in outs {
            born[v as usize] = lvl;
            last[v as usize] = last[v as usize].max(lvl);
        }
        for &v in ins {
            let r = facts[v as usize].root as usize;
            last[r] = last[r].max(lvl);
        }
    }
    let mut buffers = Vec::new();
    let mut owners = Vec::new();
    for v in 0..n {
        let val = &values[v];
        if val.home == Home::Pooled
            && !val.escapes
            && val.dtype == DType::F32
            && born[v] != u32::MAX
        {
            let len = val.layout.numel().div_ceil(ALIGN) * ALIGN;
            buffers.push(plan::Buffer {
                id: v,
                lower: born[v] as u64,
                upper: last[v] as u64 + 1,
                size: (len.max(ALIGN) * 4) as u64,
                alignment: (ALIGN * 4) as u64,
            });
            owners.push(v);
        }
    }
    if buffers.is_empty() {
        return (0, 0);
    }
    let mut problem = plan::Problem::new(buffers);
    // In-place candidates: (kernel, input k, output j, input buffer, output buffer).
    let position = |v: usize| owners.iter().position(|&o| o == v);
    let mut reads_at_last = vec![0usize; n];
    for (k, &lvl) in kernels.iter().zip(levels) {
        for &v in kernel_io(k).0 {
            let r = facts[v as usize].root as usize;
            if last[r] == lvl {
                reads_at_last[r] += 1;
            }
        }
    }
    let mut pairs: Vec<(usize, usize, usize, usize, usize)> = Vec::new();
    for (ki, (k, &lvl)) in kernels.iter().zip(levels).enumerate() {
        let Kernel::Fused {
            inputs,
            outputs,
            dims,
            ..
        } = k
        else {
            continue;
        };
        let whole = Layout::contiguous(dims);
        for (j, &o) in outputs.iter().enumerate() {
            let Some(out) = position(o as usize) else {
                continue;
            };
            let numel = values[o as usize].layout.numel();
            let found = inputs.iter().enumerate().find_map(|(i, (v, layout))| {
                let r = facts[*v as usize].root as usize;
                let inp = position(r)?;
                let ok = last[r] == lvl
                    && born[r] < lvl
                    && reads_at_last[r] == 1
                    && *layout == whole
                    && values[r].layout.numel() == numel
                    && !pairs.iter().any(|p| p.3 == inp);
                ok.then_some((i, inp))
            });
            if let Some((i, inp)) = found {
                pairs.push((ki, i, j, inp, out));
            }
        }
    }
    problem.in_place = pairs
        .iter()
        .map(|&(_, _, _, input, output)| plan::InPlace { input, output })
        .collect();
    let options = plan::Options {
        time_limit: Duration::from_millis(50),
        threads: 1,
        ..plan::Options::default()
    };
    let (offsets, arena, lower) = match plan::solve(&problem, &options) {
        Ok(p) => (p.offsets, p.arena, p.lower_bound),
        Err(e) => {
            // Never expected; fall back to no reuse rather than fail the segment.
            log::warn!("memory planning failed ({e}); using one buffer after the other");
            let mut at = 0;
            let offs = problem
                .buffers
                .iter()
                .map(|b| {
                    let o = at;
                    at += b.size;
                    o
                })
                .collect();
            (offs, at, plan::lower_bound(&problem))
        }
    };
    // Only where the planner took the offer does the kernel read in place.
    for &(ki, i, j, inp, out) in &pairs {
        if offsets.get(inp) == offsets.get(out) {
            if let Kernel::Fused { in_place, .. } = &mut kernels[ki] {
                in_place.push((i, j));
            }
        }
    }
    for (v, off) in owners.into_iter().zip(offsets) {
        values[v].home = Home::Arena {
            offset: off as usize / 4,
        };
    }
    (arena as usize / 4, lower as usize / 4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::relative::RelativeBuilder;
    use crate::ir::{TensorDesc, TensorId, UnaryOp};

    const DIMS: [usize; 2] = [4, 4];

    fn desc(id: u64, layout: Layout) -> TensorDesc {
        TensorDesc {
            id: TensorId(id),
            dtype: DType::F32,
            layout,
        }
    }

    /// An op reading `inputs` and making `output` (`None` for a Drop), all `[4, 4]`
    /// and contiguous but for views, which transpose.
    fn op(kind: OpKind, inputs: &[u64], output: Option<u64>) -> Op {
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

    fn exp(input: u64, output: u64) -> Op {
        op(OpKind::Unary(UnaryOp::Exp), &[input], Some(output))
    }

    fn drop_of(v: u64) -> Op {
        op(OpKind::Drop, &[v], None)
    }

    fn plan(ops: &[Op]) -> ExecutionPlan {
        let mut b = RelativeBuilder::new();
        let rels: Vec<RelativeOp> = ops.iter().map(|o| b.push(o)).collect();
        build(
            &ops.iter().collect::<Vec<_>>(),
            &rels.iter().collect::<Vec<_>>(),
        )
    }

    #[test]
    fn work_dropped_unread_gets_no_kernel_and_no_memory() {
        // fill -> exp -> matmul -> softmax, every result dropped.
        let p = plan(&[
            op(OpKind::Fill { value: 0 }, &[], Some(1)),
            exp(1, 2),
            op(OpKind::MatMul, &[2, 2], Some(3)),
            op(OpKind::Softmax, &[3], Some(4)),
            drop_of(4),
            drop_of(3),
            drop_of(1),
            drop_of(2),
        ]);
        assert_eq!((p.kernels.len(), p.arena_len, p.dead_ops), (0, 0, 4));
        assert!(p.values.iter().all(|v| v.home == Home::Dead && !v.escapes));
        let shown = p.to_string();
        assert!(
            shown.starts_with("plan: 8 ops (4 dead) -> 0 kernels"),
            "{shown}"
        );
    }

    #[test]
    fn dead_readers_keep_nothing_alive_and_split_no_chain() {
        // x (input 0) -> a = exp -> b = exp, b escapes; a is also read by a matmul and
        // a softmax whose results are dropped: one fused kernel, a never stored.
        let p = plan(&[
            exp(0, 1),
            op(OpKind::MatMul, &[1, 1], Some(2)),
            op(OpKind::Softmax, &[2], Some(3)),
            exp(1, 4),
            drop_of(3),
            drop_of(2),
            drop_of(1),
        ]);
        assert_eq!((p.kernels.len(), p.arena_len, p.dead_ops), (1, 0, 2), "{p}");
        let Kernel::Fused {
            outputs, input_ids, ..
        } = &p.kernels[0]
        else {
            panic!("{p}")
        };
        assert_eq!((&outputs[..], &input_ids[..]), (&[4][..], &[0][..]), "{p}");
        assert_eq!(p.values[1].home, Home::Fused);
        assert_eq!(
            (p.values[2].home, p.values[3].home),
            (Home::Dead, Home::Dead)
        );
    }

    #[test]
    fn a_kept_view_keeps_its_dropped_root_and_a_dropped_view_dies() {
        // a = exp(x) dropped, its view v kept: a is made. b = exp(x) kept, its view w
        // dropped: w is dead, b is made.
        let p = plan(&[
            exp(0, 1),
            op(OpKind::View, &[1], Some(2)),
            drop_of(1),
            exp(0, 3),
            op(OpKind::View, &[3], Some(4)),
            drop_of(4),
        ]);
        assert_eq!(p.dead_ops, 1, "{p}");
        assert!(p.values[1].escapes && p.values[2].escapes, "{p}");
        assert_eq!(p.values[2].home, Home::View { root: 1 });
        assert_eq!(p.values[4].home, Home::Dead);
        let written: Vec<u32> = p
            .kernels
            .iter()
            .flat_map(|k| kernel_io(k).1.to_vec())
            .collect();
        assert_eq!(written, [1, 3], "{p}");
    }
}
