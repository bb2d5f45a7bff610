//! The packed tile's epilogue of a chain: when the chain's program only carries the
//! product through adds (a bias, a residual) and GELU, those steps are handed to the
//! packed f32 tile, which applies them to its sums before it stores them, with the
//! program's bits, and the program's pass over the panel disappears.

use super::super::fused::{FusedProgram, Instr};
use super::super::packed::{Operand, Step};
use super::geometry::Panel;
use super::Ctx;
use crate::ir::{BinaryOp, UnaryOp};

/// The most steps of a tile's epilogue (MiniLM's longest are two).
pub(crate) const MAX_STEPS: usize = 4;

/// The longest program [`TileEpilogue::plan`] looks at: the product and, for each
/// step, an input and an add.
const MAX_EPILOGUE_INSTRS: usize = 1 + 2 * MAX_STEPS;

/// What the packed f32 tile of a chain applies to its sums before it stores them,
/// decided once when the chain is planned (`fusion/chains.rs`) and stored on its
/// matmul head: the kernel only binds each add's operand to the panel it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TileEpilogue {
    steps: [Step<u8>; MAX_STEPS],
    len: u8,
}

impl TileEpilogue {
    /// When `program` is its product (program input `head`) followed by steps the
    /// packed f32 tile can take in its registers (adds of a bias or a residual, GELU;
    /// one output): those steps. The tile applies them to its sums before it stores
    /// them (a planned product's epilogue, `kernels::product`),
    /// each the operation the program would do, so the bits are the program's, without
    /// the program's pass over the panel: a fused QKV projection's bias, the FFN's
    /// `gelu(product + bias)`, the output projections' `product + bias + residual`
    /// before their layer norm.
    ///
    /// The program must keep one running result: the product first, then each
    /// instruction an add of that result and another input, or its GELU. Whether an
    /// add's operand can be read by the tile (a bias with the same `n` contiguous
    /// values on every row, or a matrix with contiguous rows) depends on its layout,
    /// and is checked when the kernel binds it to a panel.
    pub(crate) fn plan(program: &FusedProgram, head: usize) -> Option<TileEpilogue> {
        if program.outputs.len() != 1 || program.instrs.len() > MAX_EPILOGUE_INSTRS {
            return None;
        }
        let mut plan = TileEpilogue {
            steps: [Step::Gelu; MAX_STEPS],
            len: 0,
        };
        // Register r holds input loaded[r] (not the product); `sum` the running result.
        let mut loaded = [None::<u8>; MAX_EPILOGUE_INSTRS];
        let mut sum = None::<usize>;
        for (r, instr) in program.instrs.iter().enumerate() {
            let step = match *instr {
                Instr::Input(k) if k as usize == head && sum.is_none() => {
                    sum = Some(r);
                    continue;
                }
                Instr::Input(k) if k as usize != head => {
                    loaded[r] = Some(u8::try_from(k).ok()?);
                    continue;
                }
                Instr::Binary(BinaryOp::Add, x, y) => {
                    let (x, y, s) = (x as usize, y as usize, sum?);
                    let (other, sum_first) = match (x == s, y == s) {
                        (true, false) => (y, true),
                        (false, true) => (x, false),
                        _ => return None,
                    };
                    Step::Add {
                        operand: loaded[other]?,
                        sum_first,
                    }
                }
                Instr::Unary(UnaryOp::Gelu, x) if Some(x as usize) == sum => Step::Gelu,
                _ => return None,
            };
            *plan.steps.get_mut(usize::from(plan.len))? = step;
            plan.len += 1;
            sum = Some(r);
        }
        (sum? == usize::from(program.outputs[0])).then_some(plan)
    }

    /// The steps, in order.
    pub(crate) fn steps(&self) -> &[Step<u8>] {
        &self.steps[..usize::from(self.len)]
    }
}

impl Ctx<'_> {
    /// The head's planned epilogue bound to panel `p`: its steps written to `steps`,
    /// and how many there are; `None` when the head has none or an add's operand is
    /// not one the tile reads (see [`Ctx::operand`]), and then the program runs.
    pub(super) fn tile_epilogue<'s>(
        &'s self,
        p: Panel,
        steps: &mut [Step<Operand<'s>>; MAX_STEPS],
    ) -> Option<usize> {
        let plan = self.matmul.as_ref()?.epilogue?;
        for (slot, step) in steps.iter_mut().zip(plan.steps()) {
            *slot = step.bind(|input| self.operand(usize::from(input), p))?;
        }
        Some(plan.steps().len())
    }

    /// Input `k` on panel `p` as what an add in a tile's epilogue reads: an
    /// [`Operand::Columns`] when every row reads the same `n` contiguous values, an
    /// [`Operand::Rows`] when its rows are contiguous; `None` otherwise.
    pub(super) fn operand(&self, k: usize, p: Panel) -> Option<Operand<'_>> {
        let (data, layout) = self.inputs[k];
        let l = self.geom.panel_layout(layout, p);
        let n = self.geom.n;
        if l.dims[1] != n || (n > 1 && l.strides[1] != 1) {
            return None;
        }
        Some(if l.dims[0] == 1 || l.strides[0] == 0 {
            Operand::Columns(data.get(l.offset..l.offset + n)?)
        } else {
            Operand::Rows {
                data,
                offset: l.offset,
                stride: l.strides[0],
            }
        })
    }
}
