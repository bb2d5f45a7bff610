//! The packed tile's epilogue of a chain: when the chain's program only carries the
//! product through adds (a bias, a residual) and GELU, those steps are handed to the
//! packed f32 tile, which applies them to its sums before it stores them, with the
//! program's bits, and the program's pass over the panel disappears.

use super::super::fused::Instr;
use super::super::packed::Step;
use super::geometry::Panel;
use super::Ctx;
use crate::ir::{BinaryOp, UnaryOp};

/// The most steps of a tile's epilogue ([`Ctx::tile_epilogue`]; MiniLM's longest
/// are two).
pub(super) const MAX_STEPS: usize = 4;

/// The longest program [`Ctx::tile_epilogue`] looks at: the product and, for each
/// step, an input and an add.
pub(super) const MAX_EPILOGUE_INSTRS: usize = 1 + 2 * MAX_STEPS;

impl Ctx<'_> {
    /// When the chain's program is a product followed by steps the packed f32 tile can
    /// take in its registers (adds of a bias or a residual, GELU; one output): those
    /// steps on panel `p`, written to `steps`, and how many there are. The tile then
    /// applies them to its sums before it stores them ([`matmul_prepacked_epilogue`]),
    /// each the operation the program would do, so the bits are the program's, without
    /// the program's pass over the panel: a fused QKV projection's bias, the FFN's
    /// `gelu(product + bias)`, the output projections' `product + bias + residual`
    /// before their layer norm.
    ///
    /// The program must keep one running result: the product first, then each
    /// instruction an add of that result and an input (a bias reading the same `n`
    /// contiguous values on every row, or a matrix with contiguous rows) or its GELU.
    pub(super) fn tile_epilogue<'s>(
        &'s self,
        p: Panel,
        steps: &mut [Step<'s>; MAX_STEPS],
    ) -> Option<usize> {
        let head = self.matmul.as_ref()?.input;
        let program = self.program;
        if program.outputs.len() != 1 || program.instrs.len() > MAX_EPILOGUE_INSTRS {
            return None;
        }
        // Register r holds input loaded[r] (not the product); `sum` the running result.
        let mut loaded = [None::<usize>; MAX_EPILOGUE_INSTRS];
        let mut sum = None::<usize>;
        let mut len = 0;
        for (r, instr) in program.instrs.iter().enumerate() {
            match *instr {
                Instr::Input(k) if k as usize == head && sum.is_none() => sum = Some(r),
                Instr::Input(k) if k as usize != head => loaded[r] = Some(k as usize),
                Instr::Binary(BinaryOp::Add, x, y) => {
                    let (x, y, s) = (x as usize, y as usize, sum?);
                    let (other, sum_first) = match (x == s, y == s) {
                        (true, false) => (y, true),
                        (false, true) => (x, false),
                        _ => return None,
                    };
                    let k = loaded[other]?;
                    *steps.get_mut(len)? = self.operand(k, p, sum_first)?;
                    len += 1;
                    sum = Some(r);
                }
                Instr::Unary(UnaryOp::Gelu, x) if Some(x as usize) == sum => {
                    *steps.get_mut(len)? = Step::Gelu;
                    len += 1;
                    sum = Some(r);
                }
                _ => return None,
            }
        }
        (sum? == usize::from(program.outputs[0])).then_some(len)
    }

    /// Input `k` on panel `p` as the operand of an add in a tile's epilogue: a
    /// [`Step::Columns`] when every row reads the same `n` contiguous values, a
    /// [`Step::Rows`] when its rows are contiguous; `None` otherwise.
    pub(super) fn operand(&self, k: usize, p: Panel, sum_first: bool) -> Option<Step<'_>> {
        let (data, layout) = self.inputs[k];
        let l = self.geom.panel_layout(layout, p);
        let n = self.geom.n;
        if l.dims[1] != n || (n > 1 && l.strides[1] != 1) {
            return None;
        }
        Some(if l.dims[0] == 1 || l.strides[0] == 0 {
            Step::Columns {
                values: data.get(l.offset..l.offset + n)?,
                sum_first,
            }
        } else {
            Step::Rows {
                data,
                offset: l.offset,
                stride: l.strides[0],
                sum_first,
            }
        })
    }
}
