//! The schedule compiler: rewrites a checked [`FusedProgram`] as a [`Schedule`] of
//! [`AccInstr`]s for an accumulator machine, deciding which registers stay in the
//! accumulator, which are saved to spill tiles, which inputs are read in place,
//! gathered, or read from the output that overwrites them.

use super::program::{FusedProgram, Instr};
use super::scratch::{REG_SCRATCH, REG_SPARES, STEP_SCRATCH, STEP_SPARES};
use crate::ir::{BinaryOp, UnaryOp};
use crate::reuse::ahead::{give_scratch, take_scratch};

/// What the schedule knows of one register.
#[derive(Clone, Copy)]
pub(super) struct Reg {
    /// The instruction that finds it in the accumulator: the next one that
    /// computes something (inputs leave the accumulator alone).
    next: usize,
    /// Read by another instruction, so it must be kept in a spill tile.
    spill: bool,
    /// Where it is found when not in the accumulator. Every register read from
    /// there is an input or has `spill`, so this is set before it is read.
    at: Src,
}

/// Where a step reads its operand from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Src {
    /// Contiguous input `k`, read in place.
    Input(u16),
    /// A spill tile: a saved register or a gathered input.
    Tile(u16),
    /// Output `j`, read before it is written: an input that the output overwrites in
    /// place.
    Output(u16),
}

/// One instruction of a [`Schedule`] (named apart from the program's [`Instr`], which
/// works on registers, and from the packed tile's epilogue `Step`). Instructions work
/// on an accumulator (one register over one tile, kept in vector registers by the
/// vector paths) and on spill tiles in L1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AccInstr {
    /// Copy input `k` (read through its layout) into spill tile `t`.
    Gather(u16, u16),
    /// Copy output `j` (the input it overwrites in place) into spill tile `t`.
    Keep(u16, u16),
    /// `acc = src`.
    Load(Src),
    /// `acc = op(acc)`.
    Unary(UnaryOp),
    /// `acc = op(acc, src)`.
    AccOp(BinaryOp, Src),
    /// `acc = op(src, acc)`.
    OpAcc(BinaryOp, Src),
    /// `acc = op(acc, acc)`.
    Square(BinaryOp),
    /// `spill tile t = acc`.
    Save(u16),
    /// `output j = acc`.
    Output(u16),
}

/// A [`FusedProgram`] rewritten for an accumulator machine: each instruction works on
/// the result of the one before it where it can, so most values never leave vector
/// registers; a register read again later is saved to a spill tile, an input that is
/// not read in place is gathered into one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Schedule {
    pub(super) steps: Vec<AccInstr>,
    /// Number of spill tiles the steps use.
    pub(super) tiles: usize,
}

impl Schedule {
    /// The schedule of a checked `program`; `contiguous(k)` says whether input `k` may
    /// be read in place rather than gathered; `(k, j)` in `aliases` says input `k` is
    /// read from output `j`. An aliased input is read straight from the output when
    /// every such read comes before the output is written; otherwise it is kept in a
    /// spill tile first.
    pub(super) fn new(
        program: &FusedProgram,
        contiguous: impl Fn(usize) -> bool,
        aliases: &[(usize, usize)],
    ) -> Schedule {
        let alias = |k: usize| aliases.iter().find(|&&(i, _)| i == k).map(|&(_, j)| j);
        let direct = Schedule::build(program, &contiguous, &|k| alias(k).map(|j| (j, false)));
        // The steps reading output `j` that come after a step writing it.
        let late = |j: usize| {
            let (src, out) = (Src::Output(j as u16), AccInstr::Output(j as u16));
            direct.steps.iter().skip_while(|&&s| s != out).any(
                |s| matches!(*s, AccInstr::Load(x) | AccInstr::AccOp(_, x) | AccInstr::OpAcc(_, x) if x == src),
            )
        };
        if !aliases.iter().any(|&(_, j)| late(j)) {
            return direct;
        }
        Schedule::build(program, &contiguous, &|k| alias(k).map(|j| (j, late(j))))
    }

    /// [`Schedule::new`] once the aliased inputs are known: `alias(k)` is the output
    /// input `k` is read from and whether it must be kept in a spill tile first.
    fn build(
        program: &FusedProgram,
        in_place: &dyn Fn(usize) -> bool,
        alias: &dyn Fn(usize) -> Option<(usize, bool)>,
    ) -> Schedule {
        let instrs = &program.instrs;
        let n = instrs.len();
        let mut regs = take_scratch(&REG_SCRATCH, &REG_SPARES);
        regs.resize(
            n,
            Reg {
                next: n,
                spill: false,
                at: Src::Tile(0),
            },
        );
        let mut next = n;
        for i in (0..n).rev() {
            regs[i].next = next;
            if !matches!(instrs[i], Instr::Input(_)) {
                next = i;
            }
        }
        for (j, ins) in instrs.iter().enumerate() {
            let read = match *ins {
                Instr::Input(_) => continue,
                Instr::Unary(_, a) => [a, a],
                Instr::Binary(_, a, b) => [a, b],
            };
            for r in read.map(usize::from) {
                if !matches!(instrs[r], Instr::Input(_)) && regs[r].next != j {
                    regs[r].spill = true;
                }
            }
        }
        let mut steps = take_scratch(&STEP_SCRATCH, &STEP_SPARES);
        let mut tiles = 0u16;
        let mut acc: Option<u16> = None;
        for (i, ins) in instrs.iter().enumerate() {
            let r = i as u16;
            match *ins {
                Instr::Input(k) => {
                    regs[i].at = if let Some((j, keep)) = alias(k as usize) {
                        if keep {
                            // First of all, before any step writes the output.
                            steps.insert(0, AccInstr::Keep(j as u16, tiles));
                            tiles += 1;
                            Src::Tile(tiles - 1)
                        } else {
                            Src::Output(j as u16)
                        }
                    } else if in_place(k as usize) {
                        Src::Input(k)
                    } else {
                        steps.push(AccInstr::Gather(k, tiles));
                        tiles += 1;
                        Src::Tile(tiles - 1)
                    };
                    // An input that is also an output goes through the accumulator.
                    if program.outputs.contains(&r) {
                        steps.push(AccInstr::Load(regs[i].at));
                        acc = Some(r);
                    }
                }
                Instr::Unary(op, a) => {
                    if acc != Some(a) {
                        steps.push(AccInstr::Load(regs[a as usize].at));
                    }
                    steps.push(AccInstr::Unary(op));
                    acc = Some(r);
                }
                Instr::Binary(op, a, b) => {
                    let (la, lb) = (regs[a as usize].at, regs[b as usize].at);
                    if a == b {
                        if acc != Some(a) {
                            steps.push(AccInstr::Load(la));
                        }
                        steps.push(AccInstr::Square(op));
                    } else if acc == Some(a) {
                        steps.push(AccInstr::AccOp(op, lb));
                    } else if acc == Some(b) {
                        steps.push(AccInstr::OpAcc(op, la));
                    } else {
                        steps.push(AccInstr::Load(la));
                        steps.push(AccInstr::AccOp(op, lb));
                    }
                    acc = Some(r);
                }
            }
            if acc != Some(r) {
                continue;
            }
            for (j, _) in program.outputs.iter().enumerate().filter(|(_, &o)| o == r) {
                steps.push(AccInstr::Output(j as u16));
            }
            if regs[i].spill {
                steps.push(AccInstr::Save(tiles));
                regs[i].at = Src::Tile(tiles);
                tiles += 1;
            }
        }
        give_scratch(&REG_SCRATCH, &REG_SPARES, regs);
        Schedule {
            steps,
            tiles: tiles as usize,
        }
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        give_scratch(&STEP_SCRATCH, &STEP_SPARES, std::mem::take(&mut self.steps));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fused::testutil::affine_op;

    /// A chain that reads its input three times keeps everything in the accumulator:
    /// no spill, no gather, one step per op plus the load and the store.
    #[test]
    fn chains_stay_in_the_accumulator() {
        let p = FusedProgram {
            inputs: 1,
            instrs: vec![
                Instr::Input(0),
                Instr::Unary(affine_op(1.5, 0.1), 0),
                Instr::Unary(UnaryOp::Relu, 1),
                Instr::Unary(UnaryOp::Sqrt, 2),
                Instr::Binary(BinaryOp::Mul, 3, 0),
                Instr::Unary(UnaryOp::Neg, 4),
                Instr::Unary(UnaryOp::Abs, 5),
                Instr::Binary(BinaryOp::Maximum, 6, 0),
                Instr::Unary(affine_op(0.5, 0.0), 7),
            ],
            outputs: vec![8],
        };
        let s = Schedule::new(&p, |_| true, &[]);
        assert_eq!(s.tiles, 0);
        assert_eq!(s.steps.len(), 10, "{:?}", s.steps);
        assert_eq!(s.steps[0], AccInstr::Load(Src::Input(0)));
        assert_eq!(s.steps[4], AccInstr::AccOp(BinaryOp::Mul, Src::Input(0)));
        assert_eq!(s.steps[9], AccInstr::Output(0));
        // Not read in place: the input is gathered once into a tile.
        let s = Schedule::new(&p, |_| false, &[]);
        assert_eq!(s.tiles, 1);
        assert_eq!(s.steps[0], AccInstr::Gather(0, 0));
    }
}
