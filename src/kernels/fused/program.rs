//! The fused program format: [`Instr`] and [`FusedProgram`] (SSA instructions over
//! numbered registers), its validation ([`FusedProgram::check`]), its one-line
//! `Display` form and its rough cost per element.

use std::fmt;

use crate::ir::{BinaryOp, UnaryOp};
use crate::kernels::{error, KernelError};

/// One instruction of a fused program; instruction `i` defines register `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Instr {
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
pub(crate) struct FusedProgram {
    /// Number of inputs the program reads.
    pub inputs: usize,
    /// The instructions; each defines the register of its own index.
    pub instrs: Vec<Instr>,
    /// For each output, the register it receives.
    pub outputs: Vec<u16>,
}

impl FusedProgram {
    /// Element operations per output element: a rough cost, for parallel splitting.
    pub(super) fn cost(&self) -> usize {
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
