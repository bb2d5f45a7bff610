//! The fused element-wise kernel: a small register program run tile by tile, with the
//! values of a chain kept in vector registers.
//!
//! Fusion (module `fusion`) turns a chain of element-wise f32 ops into a
//! [`FusedProgram`]: a list of instructions in SSA form, where instruction `i` defines
//! register `i` (load input `k`, apply a unary op to a register, combine two registers).
//! [`fused_in_place`] first rewrites the program as a `Schedule` for an accumulator machine:
//! each instruction applies to the result of the one before it where it can (the
//! accumulator), reads its other operand straight from a contiguous input or from a
//! *spill tile*, and only registers that are read again later are saved to one. It
//! then runs the schedule over the output tile by tile: on x86-64 with AVX2 or AVX-512
//! (`avx`), the accumulator is eight vectors held in registers (tiles of 64 or 128
//! elements), so a chain costs a few vector instructions per op and element group and
//! memory is touched once per input and once per output, whatever the length of the
//! chain; elsewhere, portable loops the compiler vectorises run each step over tiles of
//! [`BLOCK`] elements in L1. Every path gives the same bits.
//!
//! Inputs that are not contiguous (broadcast, transposed, narrowed) are gathered into
//! a spill tile with the same strided walks as the single-op kernels; the last,
//! partial tile runs on the portable loops over its valid elements only. Large outputs
//! are split across rayon tasks of whole tiles, each at least `MIN_TASK_WORK` elements
//! long.

#[cfg(target_arch = "x86_64")]
mod avx;
mod ops;
mod program;
mod run;
mod schedule;
mod scratch;
#[cfg(test)]
mod testutil;

pub(crate) use program::{FusedProgram, Instr};

use super::{check_input, error, KernelError, Par};
use crate::ir::Layout;
use run::{run_on, Path};

/// Elements per tile of the portable path, whose steps are loops over L1-resident
/// tiles, long enough to amortise their dispatch. (The vector paths use tiles of 64
/// (AVX2) or 128 (AVX-512) elements, held in registers.)
pub(super) const BLOCK: usize = 512;

/// Runs `program` over an output of `numel` elements.
///
/// `inputs[k]` is input `k` with a layout already broadcast to the output's dims;
/// `outputs[j]` receives register `program.outputs[j]`, contiguously, and must hold
/// exactly `numel` elements. The engine runs [`fused_in_place`]; this form, with no
/// input read from an output, is for tests.
#[cfg(test)]
pub(super) fn fused(
    program: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
    outputs: &mut [&mut [f32]],
    par: Par,
) -> Result<(), KernelError> {
    fused_in_place(program, inputs, &[], outputs, par)
}

/// `fused` (the tests' form) where some inputs are read from the buffers of the outputs that
/// overwrite them (in-place reuse of a dying input).
///
/// Each pair `(k, j)` of `in_place` says that input `k` is the current contents of
/// `outputs[j]`: its slice in `inputs` is ignored (it may be empty) and its layout
/// must be contiguous from offset 0 (element `i` of the input is element `i` of the
/// output). The kernel reads every element of such an input before it writes the
/// output element at the same index. An input or output may take part in one pair
/// at most.
pub(crate) fn fused_in_place(
    program: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
    in_place: &[(usize, usize)],
    outputs: &mut [&mut [f32]],
    par: Par,
) -> Result<(), KernelError> {
    program.check()?;
    if inputs.len() != program.inputs || outputs.len() != program.outputs.len() {
        return Err(error(
            "fused",
            format_args!(
                "{} inputs and {} outputs given for a program of {} and {}",
                inputs.len(),
                outputs.len(),
                program.inputs,
                program.outputs.len()
            ),
        ));
    }
    let numel = match inputs.first() {
        Some((_, l)) => l.numel(),
        None => outputs.first().map_or(0, |o| o.len()),
    };
    for (i, &(k, j)) in in_place.iter().enumerate() {
        let twice = in_place[..i].iter().any(|&(k2, j2)| k2 == k || j2 == j);
        let bad = match inputs.get(k) {
            _ if twice => Some("input or output in two pairs"),
            None => Some("no such input"),
            _ if j >= outputs.len() => Some("no such output"),
            Some((_, l)) if !l.is_contiguous() || l.offset != 0 => {
                Some("the input is not contiguous from offset 0")
            }
            Some(_) => None,
        };
        if let Some(why) = bad {
            return Err(error(
                "fused",
                format_args!("in-place pair (input {k}, output {j}): {why}"),
            ));
        }
    }
    for (k, (src, layout)) in inputs.iter().enumerate() {
        if !in_place.iter().any(|&(i, _)| i == k) {
            check_input("fused", "input", src.len(), layout)?;
        }
        if layout.dims != inputs[0].1.dims {
            return Err(error(
                "fused",
                format_args!(
                    "input {k} has dims {:?}, input 0 {:?}",
                    layout.dims, inputs[0].1.dims
                ),
            ));
        }
    }
    if let Some(o) = outputs.iter().find(|o| o.len() != numel) {
        return Err(error(
            "fused",
            format_args!("an output holds {} elements, {numel} expected", o.len()),
        ));
    }
    run_on(
        Path::detect(),
        program,
        inputs,
        in_place,
        outputs,
        numel,
        par,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, UnaryOp};
    use crate::kernels::fused::schedule::{AccInstr, Schedule};
    use crate::kernels::fused::testutil::{affine_op, paths, run, same_bits, specials};
    use crate::kernels::testutil::{rand_f32, Rng};
    use crate::kernels::{binary, unary};

    /// `gelu(a * b + a)` and `exp(-a)` over broadcast and transposed inputs, fused,
    /// against the same ops one kernel at a time.
    #[test]
    fn matches_single_op_kernels() {
        let mut rng = Rng::new(5);
        for dims in [
            vec![3usize, 700],
            vec![2, 5, 7],
            vec![1],
            vec![BLOCK * 3 + 5],
        ] {
            let (a, la) = rand_f32(&mut rng, &dims);
            let (b, lb) = rand_f32(&mut rng, &dims);
            let p = FusedProgram {
                inputs: 2,
                instrs: vec![
                    Instr::Input(0),
                    Instr::Input(1),
                    Instr::Binary(BinaryOp::Mul, 0, 1),
                    Instr::Binary(BinaryOp::Add, 2, 0),
                    Instr::Unary(UnaryOp::Gelu, 3),
                    Instr::Unary(UnaryOp::Neg, 0),
                    Instr::Unary(UnaryOp::Exp, 5),
                ],
                outputs: vec![4, 6],
            };
            let n = la.numel();
            for par in crate::kernels::testutil::pars() {
                let (mut o1, mut o2) = (vec![0f32; n], vec![0f32; n]);
                fused(&p, &[(&a, &la), (&b, &lb)], &mut [&mut o1, &mut o2], par).unwrap();
                let c = Layout::contiguous(&dims);
                let (mut ab, mut s, mut g, mut na, mut e) = (
                    vec![0f32; n],
                    vec![0f32; n],
                    vec![0f32; n],
                    vec![0f32; n],
                    vec![0f32; n],
                );
                binary(BinaryOp::Mul, &a, &la, &b, &lb, &mut ab, par).unwrap();
                binary(BinaryOp::Add, &ab, &c, &a, &la, &mut s, par).unwrap();
                unary(UnaryOp::Gelu, &s, &c, &mut g, par).unwrap();
                unary(UnaryOp::Neg, &a, &la, &mut na, par).unwrap();
                unary(UnaryOp::Exp, &na, &c, &mut e, par).unwrap();
                assert_eq!(o1, g, "{dims:?}");
                assert_eq!(o2, e, "{dims:?}");
            }
        }
    }

    /// An input read from the output that overwrites it gives what a separate input
    /// gives, on every path, whether it can be read straight from the output or must
    /// be kept first (read again after the output is written).
    #[test]
    fn in_place_inputs_match_separate_ones() {
        let mut rng = Rng::new(3);
        let n = 1000;
        let x = specials(&mut rng, n);
        let y = specials(&mut rng, n);
        let l = Layout::contiguous(&[n]);
        let direct = FusedProgram {
            inputs: 2,
            instrs: vec![
                Instr::Input(0),
                Instr::Input(1),
                Instr::Binary(BinaryOp::Sub, 1, 0),
                Instr::Unary(UnaryOp::Sqrt, 2),
                Instr::Binary(BinaryOp::Maximum, 0, 3),
            ],
            outputs: vec![4],
        };
        let late = FusedProgram {
            inputs: 2,
            instrs: vec![
                Instr::Input(0),
                Instr::Input(1),
                Instr::Unary(UnaryOp::Neg, 0),
                Instr::Binary(BinaryOp::Mul, 2, 0), // reads input 0 after output 0
                Instr::Binary(BinaryOp::Minimum, 1, 3),
            ],
            outputs: vec![2, 4],
        };
        assert!(!Schedule::new(&direct, |_| true, &[(0, 0)])
            .steps
            .iter()
            .any(|s| matches!(s, AccInstr::Keep(..))));
        assert_eq!(
            Schedule::new(&late, |_| true, &[(0, 0)]).steps[0],
            AccInstr::Keep(0, 0)
        );
        // Input 1 is loaded after output 0 is written.
        let after = FusedProgram {
            inputs: 2,
            instrs: vec![
                Instr::Input(0),
                Instr::Unary(affine_op(2.0, 1.0), 0),
                Instr::Input(1),
                Instr::Binary(BinaryOp::Maximum, 2, 1),
            ],
            outputs: vec![1, 3],
        };
        assert_eq!(
            Schedule::new(&after, |_| true, &[(1, 0)]).steps[0],
            AccInstr::Keep(0, 0)
        );
        for (p, pairs) in [
            (&direct, vec![(0, 0)]),
            (&late, vec![(0, 0), (1, 1)]),
            (&after, vec![(1, 0)]),
        ] {
            let want = run(Path::Portable, p, &[(&x, &l), (&y, &l)], Par::serial());
            for path in paths() {
                for par in crate::kernels::testutil::pars() {
                    let mut outs = vec![x.clone(); p.outputs.len()];
                    for &(k, j) in &pairs {
                        outs[j] = [&x, &y][k].clone();
                    }
                    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                    let ins = [(&x[..], &l), (&y[..], &l)];
                    let ins: Vec<(&[f32], &Layout)> = ins
                        .iter()
                        .enumerate()
                        .map(|(k, &(d, l))| {
                            let aliased = pairs.iter().any(|&(i, _)| i == k);
                            (if aliased { &[][..] } else { d }, l)
                        })
                        .collect();
                    run_on(path, p, &ins, &pairs, &mut refs, n, par);
                    same_bits(&want, &outs, &format!("{path:?} {par:?} {p}"));
                }
            }
        }
        // Bad pairs are errors.
        let mut o = vec![0f32; n];
        for pairs in [vec![(2, 0)], vec![(0, 1)], vec![(0, 0), (1, 0)]] {
            let r = fused_in_place(
                &direct,
                &[(&x, &l), (&y, &l)],
                &pairs,
                &mut [&mut o],
                Par::serial(),
            );
            assert!(r.is_err(), "{pairs:?}");
        }
        let t = Layout::contiguous(&[2, n / 2]).permute(&[1, 0]);
        let neg = FusedProgram {
            inputs: 1,
            instrs: vec![Instr::Input(0), Instr::Unary(UnaryOp::Neg, 0)],
            outputs: vec![1],
        };
        assert!(
            fused_in_place(&neg, &[(&x, &t)], &[(0, 0)], &mut [&mut o], Par::serial()).is_err()
        );
    }

    #[test]
    fn malformed_programs_and_sizes_are_errors() {
        let a = vec![1.0f32; 4];
        let l = Layout::contiguous(&[4]);
        let bad = FusedProgram {
            inputs: 1,
            instrs: vec![Instr::Unary(UnaryOp::Neg, 0)],
            outputs: vec![0],
        };
        let mut o = vec![0f32; 4];
        assert!(fused(&bad, &[(&a, &l)], &mut [&mut o], Par::serial()).is_err());
        let ok = FusedProgram {
            inputs: 1,
            instrs: vec![Instr::Input(0)],
            outputs: vec![0],
        };
        let mut short = vec![0f32; 3];
        assert!(fused(&ok, &[(&a, &l)], &mut [&mut short], Par::serial()).is_err());
        assert!(fused(&ok, &[(&a[..2], &l)], &mut [&mut o], Par::serial()).is_err());
        fused(&ok, &[(&a, &l)], &mut [&mut o], Par::serial()).unwrap();
        assert_eq!(o, a);
    }
}
