//! The fused element-wise kernel: a small register program run over cache-sized blocks.
//!
//! Fusion (module `fusion`) turns a chain of element-wise f32 ops into a
//! [`FusedProgram`]: a list of instructions in SSA form, where instruction `i` defines
//! register `i` (load input `k`, apply a unary op to a register, combine two registers).
//! [`fused`] runs the program over the output in blocks of [`BLOCK`] elements: each
//! register holds one block, so every intermediate value lives only in L1 and memory
//! is touched once per input and once per output, whatever the length of the chain.
//! Inputs are read through their layouts (broadcast, transposed, narrowed) with the
//! same strided walks as the single-op kernels; large outputs are split across rayon
//! tasks of whole blocks.

use std::fmt;

use rayon::prelude::*;

use super::math;
use super::par::units_per_task;
use super::strided::{copy_runs, Walk};
use super::{check_input, error, KernelError, Par};
use crate::ir::{BinaryOp, Layout, UnaryOp};

/// Elements per register block: 2 KiB of f32 per register, so a program's registers stay in L1.
pub const BLOCK: usize = 512;

/// One instruction of a fused program; instruction `i` defines register `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Instr {
    /// Load input `k` (read through its layout).
    Input(u16),
    /// Apply a unary op to a register.
    Unary(UnaryOp, u16),
    /// Combine two registers.
    Binary(BinaryOp, u16, u16),
}

/// A fused element-wise program: instructions in SSA order and the registers written
/// to the outputs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FusedProgram {
    /// Number of inputs the program reads.
    pub inputs: usize,
    /// The instructions; each defines the register of its own index.
    pub instrs: Vec<Instr>,
    /// For each output, the register it receives.
    pub outputs: Vec<u16>,
}

impl FusedProgram {
    /// Element operations per output element: a rough cost, for parallel splitting.
    fn cost(&self) -> usize {
        self.instrs
            .iter()
            .map(|i| match i {
                Instr::Unary(UnaryOp::Gelu | UnaryOp::Powf(_), _) => 8,
                Instr::Unary(UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Sigmoid, _) => 4,
                _ => 1,
            })
            .sum()
    }

    /// Checks that every register is defined before it is used.
    pub(crate) fn check(&self) -> Result<(), KernelError> {
        for (i, ins) in self.instrs.iter().enumerate() {
            let ok = match *ins {
                Instr::Input(k) => (k as usize) < self.inputs,
                Instr::Unary(_, a) => (a as usize) < i,
                Instr::Binary(_, a, b) => (a as usize) < i && (b as usize) < i,
            };
            if !ok {
                return Err(error(
                    "fused",
                    format_args!("instruction {i} ({ins:?}) is malformed"),
                ));
            }
        }
        if let Some(r) = self
            .outputs
            .iter()
            .find(|&&r| r as usize >= self.instrs.len())
        {
            return Err(error(
                "fused",
                format_args!("output register {r} is undefined"),
            ));
        }
        Ok(())
    }
}

impl fmt::Display for FusedProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, ins) in self.instrs.iter().enumerate() {
            match ins {
                Instr::Input(k) => write!(f, "r{i}=in{k}")?,
                Instr::Unary(u, a) => write!(f, "r{i}={}(r{a})", u.name())?,
                Instr::Binary(b, x, y) => write!(f, "r{i}={}(r{x},r{y})", b.name())?,
            }
            f.write_str("; ")?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|r| format!("r{r}")).collect();
        write!(f, "-> [{}]", outs.join(", "))
    }
}

/// Runs `program` over an output of `numel` elements.
///
/// `inputs[k]` is input `k` with a layout already broadcast to the output's dims;
/// `outputs[j]` receives register `program.outputs[j]`, contiguously, and must hold
/// exactly `numel` elements.
pub fn fused(
    program: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
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
    for (k, (src, layout)) in inputs.iter().enumerate() {
        check_input("fused", "input", src.len(), layout)?;
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
    let walks: Vec<Walk<1>> = inputs
        .iter()
        .map(|(_, l)| Walk::new(&l.dims, [&l.strides], [l.offset]))
        .collect();
    let blocks = numel.div_ceil(BLOCK);
    let per_task = units_per_task(blocks, BLOCK * program.cost(), par);
    if per_task >= blocks {
        // Small outputs need registers only as long as themselves.
        let mut regs = vec![0f32; program.instrs.len() * numel.clamp(1, BLOCK)];
        let mut outs: Vec<&mut [f32]> = outputs.iter_mut().map(|o| &mut **o).collect();
        run_range(program, inputs, &walks, &mut outs, 0, &mut regs);
        return Ok(());
    }
    // Cut every output at the same block boundaries and hand each task its pieces.
    let chunk = per_task * BLOCK;
    let mut tasks: Vec<(usize, Vec<&mut [f32]>)> = (0..blocks.div_ceil(per_task))
        .map(|t| (t * chunk, Vec::with_capacity(outputs.len())))
        .collect();
    for out in outputs.iter_mut() {
        for (t, piece) in out.chunks_mut(chunk).enumerate() {
            tasks[t].1.push(piece);
        }
    }
    tasks.into_par_iter().for_each(|(start, mut outs)| {
        let mut regs = vec![0f32; program.instrs.len() * BLOCK];
        run_range(program, inputs, &walks, &mut outs, start, &mut regs);
    });
    Ok(())
}

/// Runs the program for output elements `start..start + outs[0].len()`, with the
/// widest vector instructions this CPU has.
pub(crate) fn run_range(
    program: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
    walks: &[Walk<1>],
    outs: &mut [&mut [f32]],
    start: usize,
    regs: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: `run_range_avx512` only differs from `run_range_generic` in the
            // instructions the compiler may use; the CPU supports them (checked above).
            // `fused::tests::vector_paths_match_the_generic_one` runs every path.
            unsafe { run_range_avx512(program, inputs, walks, outs, start, regs) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above, for AVX2 and FMA, whose support was just checked.
            unsafe { run_range_avx2(program, inputs, walks, outs, start, regs) };
            return;
        }
    }
    run_range_generic(program, inputs, walks, outs, start, regs)
}

/// Defines `$name`: [`run_range_generic`] compiled with the target features `$features`.
/// Callers must check that the CPU has them.
macro_rules! simd_variant {
    ($name:ident, $features:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(
            program: &FusedProgram,
            inputs: &[(&[f32], &Layout)],
            walks: &[Walk<1>],
            outs: &mut [&mut [f32]],
            start: usize,
            regs: &mut [f32],
        ) {
            run_range_generic(program, inputs, walks, outs, start, regs)
        }
    };
}

simd_variant!(run_range_avx512, "avx512f,avx512vl,avx2,fma");
simd_variant!(run_range_avx2, "avx2,fma");

/// The block loop, written once; inlined into each target-feature variant.
#[inline(always)]
fn run_range_generic(
    program: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
    walks: &[Walk<1>],
    outs: &mut [&mut [f32]],
    start: usize,
    regs: &mut [f32],
) {
    let len = outs.first().map_or(0, |o| o.len());
    // Register length: `regs` holds one register per instruction.
    let blk = regs.len() / program.instrs.len().max(1);
    let last = program.instrs.len().saturating_sub(1);
    let direct_last = program.outputs.len() == 1
        && program.outputs[0] as usize == last
        && !matches!(program.instrs[last], Instr::Input(_));
    let mut done = 0;
    while done < len {
        let n = (len - done).min(blk);
        for (i, ins) in program.instrs.iter().enumerate() {
            let (before, after) = regs.split_at_mut(i * blk);
            // The last instruction, when it is the only output, writes the output
            // directly (one pass less over the block).
            let dst = if direct_last && i == last {
                &mut outs[0][done..done + n]
            } else {
                &mut after[..n]
            };
            // A contiguous input is read in place: its register is the input itself.
            let reg = |r: u16| match program.instrs[r as usize] {
                Instr::Input(k) if inputs[k as usize].1.is_contiguous() => {
                    let (src, l) = inputs[k as usize];
                    let at = l.offset + start + done;
                    &src[at..at + n]
                }
                _ => &before[r as usize * blk..r as usize * blk + n],
            };
            match *ins {
                Instr::Input(k) => {
                    let (src, l) = inputs[k as usize];
                    if !l.is_contiguous() {
                        copy_runs(src, &walks[k as usize], start + done, dst);
                    }
                }
                Instr::Unary(op, a) => unary_block(op, reg(a), dst),
                Instr::Binary(op, a, b) => binary_block(op, reg(a), reg(b), dst),
            }
        }
        for (out, &r) in outs.iter_mut().zip(&program.outputs) {
            if direct_last {
                break;
            }
            let from = match program.instrs[r as usize] {
                Instr::Input(k) if inputs[k as usize].1.is_contiguous() => {
                    let (src, l) = inputs[k as usize];
                    let at = l.offset + start + done;
                    &src[at..at + n]
                }
                _ => &regs[r as usize * blk..r as usize * blk + n],
            };
            out[done..done + n].copy_from_slice(from);
        }
        done += n;
    }
}

/// `dst[i] = op(a[i])`; one loop per op so that each is vectorised.
#[inline(always)]
fn unary_block(op: UnaryOp, a: &[f32], dst: &mut [f32]) {
    #[inline(always)]
    fn map(a: &[f32], dst: &mut [f32], f: impl Fn(f32) -> f32) {
        for (d, &x) in dst.iter_mut().zip(a) {
            *d = f(x);
        }
    }
    match op {
        UnaryOp::Exp => map(a, dst, math::exp),
        UnaryOp::Log => map(a, dst, f32::ln),
        UnaryOp::Sqrt => map(a, dst, f32::sqrt),
        UnaryOp::Recip => map(a, dst, |x| 1.0 / x),
        UnaryOp::Neg => map(a, dst, |x| -x),
        UnaryOp::Abs => map(a, dst, f32::abs),
        UnaryOp::Tanh => map(a, dst, math::tanh),
        UnaryOp::Sigmoid => map(a, dst, math::sigmoid),
        UnaryOp::Relu => map(a, dst, math::relu),
        UnaryOp::Gelu => {
            // The loop compiled for the CPU's SIMD level (see `math::gelu_in_place`).
            dst.copy_from_slice(a);
            math::gelu_in_place(dst)
        }
        UnaryOp::GeluTanh => map(a, dst, math::gelu_tanh),
        UnaryOp::Silu => map(a, dst, math::silu),
        UnaryOp::Affine { mul, add } => {
            let (m, c) = (f64::from_bits(mul) as f32, f64::from_bits(add) as f32);
            map(a, dst, move |x| x * m + c)
        }
        UnaryOp::Powf(e) => {
            let e = f64::from_bits(e) as f32;
            map(a, dst, move |x| x.powf(e))
        }
    }
}

/// `dst[i] = op(a[i], b[i])`; one loop per op so that each is vectorised.
#[inline(always)]
fn binary_block(op: BinaryOp, a: &[f32], b: &[f32], dst: &mut [f32]) {
    use crate::ir::Element;
    #[inline(always)]
    fn zip(a: &[f32], b: &[f32], dst: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
            *d = f(x, y);
        }
    }
    match op {
        BinaryOp::Add => zip(a, b, dst, |x, y| x + y),
        BinaryOp::Sub => zip(a, b, dst, |x, y| x - y),
        BinaryOp::Mul => zip(a, b, dst, |x, y| x * y),
        BinaryOp::Div => zip(a, b, dst, |x, y| x / y),
        BinaryOp::Maximum => zip(a, b, dst, <f32 as Element>::maximum),
        BinaryOp::Minimum => zip(a, b, dst, <f32 as Element>::minimum),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// The generic path and whichever vector path this CPU takes agree bit for bit
    /// (except where the vector path fuses a multiply-add, within an ulp or two).
    #[test]
    fn vector_paths_match_the_generic_one() {
        let mut rng = Rng::new(9);
        let (a, la) = rand_f32(&mut rng, &[3, 1000]);
        let p = FusedProgram {
            inputs: 1,
            instrs: vec![
                Instr::Input(0),
                Instr::Unary(UnaryOp::Gelu, 0),
                Instr::Unary(UnaryOp::Exp, 1),
                Instr::Binary(BinaryOp::Maximum, 2, 0),
                Instr::Unary(UnaryOp::Sigmoid, 3),
                Instr::Unary(
                    UnaryOp::Affine {
                        mul: 2f64.to_bits(),
                        add: 0.5f64.to_bits(),
                    },
                    4,
                ),
            ],
            outputs: vec![5],
        };
        let walks = vec![Walk::new(&la.dims, [&la.strides], [la.offset])];
        let mut regs = vec![0f32; p.instrs.len() * BLOCK];
        let mut o1 = vec![0f32; 3000];
        let mut o2 = vec![0f32; 3000];
        run_range_generic(&p, &[(&a, &la)], &walks, &mut [&mut o1], 0, &mut regs);
        run_range(&p, &[(&a, &la)], &walks, &mut [&mut o2], 0, &mut regs);
        for (x, y) in o1.iter().zip(&o2) {
            assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{x} vs {y}");
        }
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
