//! Failure containment in fused kernels: which outputs a failed input reaches.
//!
//! A fused or chained kernel computes several values at once. When one of its inputs
//! failed (an index out of range found by an earlier kernel, an allocation that could
//! not be made), only the outputs computed from that input may fail; values the same
//! kernel computes from other inputs must come out exactly as without the failure.
//! The executor asks [`taint`] which outputs depend on a failed input; when some do
//! not, it runs the kernel anyway, with zeros ([`make_zeros`]) read in place of the
//! failed inputs that have no memory, and fails only the tainted outputs.
//!
//! A single-op kernel has one output, which depends on all its inputs: it never runs
//! with a failed input.

use crate::error::Error;
use crate::fusion::{ExecutionPlan, Home, Kernel};
use crate::ir::Layout;
use crate::kernels::{FusedProgram, Instr};

/// The error of value `v`'s root, if it failed.
fn failure<'e>(plan: &ExecutionPlan, failed: &'e [Option<Error>], v: u32) -> Option<&'e Error> {
    let r = match plan.values[v as usize].home {
        Home::View { root } => root,
        _ => v,
    };
    failed[r as usize].as_ref()
}

/// For each output of `program`, the first failed input it is computed from, given
/// each input's failure (`inputs[k]`).
fn tainted_outputs<'e>(
    program: &FusedProgram,
    inputs: &[Option<&'e Error>],
) -> Vec<Option<&'e Error>> {
    let mut regs: Vec<Option<&Error>> = Vec::with_capacity(program.instrs.len());
    for ins in &program.instrs {
        let t = match *ins {
            Instr::Input(k) => inputs.get(k as usize).copied().flatten(),
            Instr::Unary(_, a) => regs[a as usize],
            Instr::Binary(_, a, b) => regs[a as usize].or(regs[b as usize]),
        };
        regs.push(t);
    }
    program.outputs.iter().map(|&r| regs[r as usize]).collect()
}

/// Pushes `(output, error)` for every output of `kernel` computed from a failed input
/// (given by `failed`, per value); returns whether that is all of them (then the
/// kernel need not run).
pub(crate) fn taint(
    plan: &ExecutionPlan,
    kernel: &Kernel,
    failed: &[Option<Error>],
    tainted: &mut Vec<(u32, Error)>,
) -> bool {
    let fail = |v: u32| failure(plan, failed, v);
    let (outputs, per_output): (&[u32], Vec<Option<&Error>>) = match kernel {
        Kernel::Op { inputs, output, .. } => {
            let e = inputs.iter().find_map(|&v| fail(v));
            (&output[..], vec![e])
        }
        Kernel::Fused {
            program,
            inputs,
            outputs,
            ..
        } => {
            let ins: Vec<_> = inputs.iter().map(|(v, _)| fail(*v)).collect();
            (outputs, tainted_outputs(program, &ins))
        }
        Kernel::Chain(c) => {
            let product = c
                .matmul
                .as_ref()
                .and_then(|m| fail(m.lhs.0).or_else(|| fail(m.rhs.0)));
            let ins: Vec<_> = c
                .inputs
                .iter()
                .enumerate()
                .map(|(k, (v, _))| match &c.matmul {
                    Some(m) if m.input == k => product,
                    _ => fail(*v),
                })
                .collect();
            let mut per = tainted_outputs(&c.program, &ins);
            if let Some(n) = &c.norm {
                if let Some(e) = n.params.iter().find_map(|(v, _)| fail(*v)) {
                    if let Some(t) = per.get_mut(n.output) {
                        t.get_or_insert(e);
                    }
                }
            }
            (&c.outputs, per)
        }
    };
    let mut all = true;
    for (&o, e) in outputs.iter().zip(per_output) {
        match e {
            Some(e) => tainted.push((o, e.clone())),
            None => all = false,
        }
    }
    all
}

/// Grows `zeros` so that every failed input of `kernel` can be read from it through
/// the layout the kernel reads it with.
pub(crate) fn make_zeros(
    plan: &ExecutionPlan,
    kernel: &Kernel,
    failed: &[Option<Error>],
    zeros: &mut Vec<f32>,
) {
    let mut need = 0;
    let mut see = |(v, l): &(u32, Layout)| {
        if failure(plan, failed, *v).is_some() {
            need = need.max(l.max_index().map_or(0, |i| i + 1));
        }
    };
    match kernel {
        Kernel::Op { .. } => {}
        Kernel::Fused { inputs, .. } => inputs.iter().for_each(&mut see),
        Kernel::Chain(c) => {
            if let Some(m) = &c.matmul {
                see(&m.lhs);
                see(&m.rhs);
            }
            c.inputs.iter().for_each(&mut see);
            if let Some(n) = &c.norm {
                n.params.iter().for_each(&mut see);
            }
        }
    }
    if zeros.len() < need {
        zeros.resize(need, 0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, UnaryOp};

    #[test]
    fn only_outputs_computed_from_a_failed_input_are_tainted() {
        // r0 = in0; r1 = in1; r2 = exp(r1); r3 = r0 + r2 -> outputs [r2, r3]
        let program = FusedProgram {
            inputs: 2,
            instrs: vec![
                Instr::Input(0),
                Instr::Input(1),
                Instr::Unary(UnaryOp::Exp, 1),
                Instr::Binary(BinaryOp::Add, 0, 2),
            ],
            outputs: vec![2, 3],
        };
        let e = Error::Kernel {
            op: "index_select",
            msg: "index 9 out of range".into(),
        };
        let t = tainted_outputs(&program, &[Some(&e), None]);
        assert_eq!(t, vec![None, Some(&e)]);
        let t = tainted_outputs(&program, &[None, Some(&e)]);
        assert_eq!(t, vec![Some(&e), Some(&e)]);
        let t = tainted_outputs(&program, &[None, None]);
        assert_eq!(t, vec![None, None]);
    }
}
