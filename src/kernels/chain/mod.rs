//! Chains: a matrix product, an element-wise program and a row normalisation run as
//! one kernel, panel by panel, so the values between them never leave the cache.
//!
//! A chain computes, over an output of dims `[b.., m, n]`:
//!
//! 1. optionally a **matmul head**: `[b.., m, k] x [b.., k, n]`, whose result is one of
//!    the program's inputs (a matmul *epilogue*);
//! 2. a [`FusedProgram`] (the element-wise part), whose other inputs are read through
//!    their layouts;
//! 3. optionally a **row norm tail** (softmax, layer norm or RMS norm over the last
//!    dim) applied in place to one of the program's outputs (a norm *prologue*).
//!
//! The output is cut into **panels**: runs of whole rows of one matrix (`rows × n`,
//! about [`PANEL_BYTES`] each). For each panel the head's gemm writes the product
//! straight into the panel of output 0 (through [`product`], as the chain's plan decided it:
//! `ProductPlan`, restricted to the panel's rows of `lhs`), [`fused_in_place`] then runs the program on
//! the panel, reading the product from that output before overwriting it and every
//! other input through its layout narrowed to the panel's rows, and the tail normalises
//! the panel's rows of its output while they are still in cache. The product and the
//! norm's input get no memory of their own. When the plan put the program in the tile
//! (the weight is packed for a tile that takes an epilogue and the program only carries
//! the product through adds, a bias or a residual, and GELU: [`TileEpilogue`]) and the
//! weight is bound packed, the tile applies those steps to its sums before it stores
//! them, with the program's bits, and the program's pass over the panel disappears. With several threads, runs of panels are
//! halved across `rayon::join` (a few per thread, each with single-threaded gemms);
//! a chain with too few panels for that runs them one after the other, each gemm,
//! program and norm using the threads itself. (Running big panels one after the other
//! with gemm's own threads instead was measured slower on MiniLM.)

mod epilogue;
mod geometry;

pub(crate) use epilogue::TileEpilogue;
use epilogue::MAX_STEPS;
use geometry::{Geometry, Panel, PanelLayout};

use super::fused::{fused_in_place, FusedProgram};
use super::norm::RowOp;
use super::packed::Step;
use super::par::{for_each_chunk, join_split, units_per_task, MIN_TASK_WORK};
use super::product::{product, ProductPath, ProductPlan, Rhs};
use super::{check_input, error, numel_of, KernelError, Par};
use crate::ir::{DType, Layout};

/// About how many bytes of output one panel covers: the size of an L2 cache, so the
/// product is still in cache when the program reads it, while each gemm gets enough
/// rows to run at full speed (256 KiB panels made a `[1600, 384] x [384, 1152]`
/// product with its bias 15% slower than the two kernels apart; 1 MiB ones are as fast
/// or faster). Unit tests use small panels so that a matrix has several.
pub(super) const PANEL_BYTES: usize = if cfg!(test) { 64 * 1024 } else { 1024 * 1024 };

/// [`PANEL_BYTES`] for a product by a weight packed in f32, when its output is more
/// than one panel: measured on each CPU, a quarter on Intel's, the whole on AMD's.
///
/// On the 2-core Xeon, a quarter kept the panel's rows of the left operand, its
/// output and the norm that reads it in L2 while the weight's panels streamed past
/// (the f32 tile applies the element-wise program, so no pass of its own needs the
/// larger panel). MiniLM, batches of 32: binaries alternated three times, two streams
/// of one kernel thread each, 504.6 -> 508.8, 508.3 -> 513.5 and 510.7 -> 514.2
/// sentences/s; one stream of two threads, both sizes alternated batch by batch in one
/// process, 551.3 -> 556.6, 502.5 -> 505.4, 510.7 -> 516.1 and 517.1 -> 524.1 (one
/// thread 267.8 -> 269.2, 268.3 -> 269.9).
///
/// On the 2-core Zen 5 EPYC (1 MiB of L2 a core) the whole panel wins: each panel of
/// rows streams the whole weight again, from L3, and four times fewer panels stream it
/// four times less. `embed --batch 32 --workers 2`, binaries alternated: 12 runs,
/// medians 655 -> 665 sentences/s (11 of 12 won); 8 runs, 641.6 -> 664.0 (7 of 8).
///
/// The bf16, int8 and bf16x3 tiles want the whole panel everywhere: at 256 KiB on the
/// Xeon, bf16x3 ran 707 -> 629 and 698 -> 609 sentences/s, int8 1486 -> 1450 and 1503
/// -> 1433.
fn f32_panel_bytes() -> usize {
    if super::cpu::is_amd() {
        PANEL_BYTES
    } else {
        PANEL_BYTES / 4
    }
}

/// The matrix product at the head of a chain.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChainMatMul<'a> {
    /// The left operand, `[b.., m, k]` (batch dims already those of the output).
    pub lhs: (&'a [f32], &'a Layout),
    /// The right operand, `[b.., k, n]`, as the executor bound it: packed, or its
    /// elements.
    pub rhs: (Rhs<'a>, &'a Layout),
    /// Which input of the program is the product (its slice in `inputs` is ignored).
    pub input: usize,
    /// How the product runs, as the plan decided.
    pub plan: &'a ProductPlan,
    /// What the packed tile applies to its sums, as the plan decided
    /// ([`TileEpilogue::plan`]); `None`: the program runs over the product. Applied
    /// only when the right operand is bound packed.
    pub epilogue: Option<TileEpilogue>,
}

/// The row-wise normalisation at the tail of a chain, with its parameters (1-D of the
/// last dim's size, any stride).
#[derive(Clone, Copy, Debug)]
pub(crate) enum ChainNorm<'a> {
    /// Softmax over the last dim.
    Softmax,
    /// Layer norm: weight, bias and epsilon.
    LayerNorm {
        /// The scale.
        weight: (&'a [f32], &'a Layout),
        /// The shift.
        bias: (&'a [f32], &'a Layout),
        /// Added to the variance.
        eps: f64,
    },
    /// RMS norm: weight and epsilon.
    RmsNorm {
        /// The scale.
        weight: (&'a [f32], &'a Layout),
        /// Added to the mean square.
        eps: f64,
    },
}

/// Runs a chain over an output of `dims` (rank 1 or more; with a matmul head, rank 2
/// or more).
///
/// `inputs[k]` is the program's input `k` with a layout broadcast to `dims`, except
/// the one named by `matmul.input`, which the head computes. `outputs[j]` receives
/// register `program.outputs[j]` and holds exactly the output's element count; with a
/// tail `(norm, j)`, output `j` is then normalised over its rows in place.
pub(crate) fn chain(
    dims: &[usize],
    matmul: Option<ChainMatMul<'_>>,
    program: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
    norm: Option<(ChainNorm<'_>, usize)>,
    outputs: &mut [&mut [f32]],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "chain";
    let geom = Geometry::new(kernel, dims, matmul.is_some())?;
    let numel = numel_of(kernel, dims)?;
    if inputs.len() != program.inputs || outputs.len() != program.outputs.len() {
        return Err(error(
            kernel,
            format_args!(
                "{} inputs and {} outputs given for a program of {} and {}",
                inputs.len(),
                outputs.len(),
                program.inputs,
                program.outputs.len()
            ),
        ));
    }
    let head = matmul.map(|m| m.input);
    for (k, (src, layout)) in inputs.iter().enumerate() {
        if Some(k) == head {
            continue;
        }
        check_input(kernel, "input", src.len(), layout)?;
        if layout.dims[..] != *dims {
            return Err(error(
                kernel,
                format_args!("input {k} has dims {:?}, expected {dims:?}", layout.dims),
            ));
        }
    }
    if let Some(o) = outputs.iter().find(|o| o.len() != numel) {
        return Err(error(
            kernel,
            format_args!("an output holds {} elements, {numel} expected", o.len()),
        ));
    }
    let depth = match &matmul {
        Some(mm) => geom.check_matmul(kernel, mm, program.inputs)?,
        None => 0,
    };
    let tail = match norm {
        None => None,
        Some((_, j)) if j >= outputs.len() => {
            return Err(error(
                kernel,
                format_args!("the norm reads output {j} of {}", outputs.len()),
            ))
        }
        Some((n, j)) => Some((row_op(n, geom.n)?, j)),
    };
    if numel == 0 {
        return Ok(());
    }
    program.check()?;
    let ctx = Ctx {
        geom: &geom,
        matmul,
        program,
        inputs,
        tail: tail.as_ref(),
    };
    // Panels: runs of whole rows of one matrix, of equal size within a matrix.
    //
    // A product whose whole output fits in one PANEL_BYTES panel (a request or two:
    // tens of rows) is not cut by rows for the threads: each thread would stream the
    // whole weight for its half of the rows. It stays one panel, and its product
    // splits by columns (each thread reads half the weight; `kernels::packed`), its
    // program and norm by rows. With the kernel workers spinning through a flush
    // (`set_kernel_spin`), one sentence a call on the 2-core Xeon, paired ratios
    // against the row split: f32 0.956, bf16x3 0.851 (p50 2.59 -> 2.28 ms; the AMX
    // tile needs its two row tiles to keep up with the weight's stream).
    let one_product_panel =
        matmul.is_some() && geom.m.saturating_mul(geom.n).saturating_mul(4) <= PANEL_BYTES;
    let panel_bytes = match matmul.map(|m| m.plan.path) {
        Some(ProductPath::Packed(t)) if t.dtype == DType::F32 => f32_panel_bytes(),
        _ => PANEL_BYTES,
    };
    let mut per_matrix = if one_product_panel {
        1
    } else {
        geom.m.div_ceil((panel_bytes / 4 / geom.n).clamp(1, geom.m))
    };
    if par.threads > 1 && !one_product_panel {
        // Cut a little finer when that gives every thread as many panels.
        let fits = |p: &usize| (geom.batch * p).is_multiple_of(par.threads);
        if let Some(p) = (per_matrix..=(2 * per_matrix).min(geom.m)).find(fits) {
            per_matrix = p;
        }
    }
    let rows = geom.m.div_ceil(per_matrix);
    // Rounding the rows up can leave trailing panels with no rows at all (25 rows in 8
    // panels are 7 panels of 4): count only the panels that start inside the matrix.
    let per_matrix = geom.m.div_ceil(rows);
    let layout = PanelLayout { rows, per_matrix };
    let n_panels = geom.batch * per_matrix;
    // Work per element of a panel: the product's multiply-adds, the program, the norm.
    let cost = 2 * depth + program.instrs.len() + tail.as_ref().map_or(0, |(op, _)| op.cost());
    // At most a few runs of panels per thread.
    let per_task = units_per_task(n_panels, rows * geom.n * cost, par)
        .max(n_panels.div_ceil(4 * par.threads.max(1)));
    let work = numel.saturating_mul(cost);
    if par.threads <= 1 || work < 2 * MIN_TASK_WORK {
        ctx.panels(layout, 0..n_panels, outputs, Par::serial())
    } else if n_panels >= par.threads && per_task < n_panels {
        // Runs of panels halved across rayon::join (no allocation), each run with its
        // own pieces of the outputs and single-threaded gemms. (Before the kernel
        // workers spun through a flush, one request's 28 rows also went this way, as
        // two panels of 14: 4.3 ms a sentence against 4.9 ms split by columns on the
        // 2-core EPYC, when the other worker slept between the steps.)
        ctx.split(layout, 0..n_panels, outputs, per_task)
    } else {
        // Too few panels to share out: each gemm, program and norm uses the threads.
        ctx.panels(layout, 0..n_panels, outputs, par)
    }
}

/// The gathered parameters of a tail.
fn row_op(norm: ChainNorm<'_>, n: usize) -> Result<RowOp<'_>, KernelError> {
    Ok(match norm {
        ChainNorm::Softmax => RowOp::Softmax,
        ChainNorm::LayerNorm { weight, bias, eps } => {
            RowOp::layer_norm(weight.0, weight.1, bias.0, bias.1, eps, n)?
        }
        ChainNorm::RmsNorm { weight, eps } => RowOp::rms_norm(weight.0, weight.1, eps, n)?,
    })
}

/// Everything a panel needs, shared by the tasks.
struct Ctx<'a> {
    geom: &'a Geometry<'a>,
    matmul: Option<ChainMatMul<'a>>,
    program: &'a FusedProgram,
    inputs: &'a [(&'a [f32], &'a Layout)],
    tail: Option<&'a (RowOp<'a>, usize)>,
}

/// The inputs one panel reads, kept inline for up to this many program inputs (and
/// outputs), so that a panel allocates nothing.
const INLINE: usize = 16;

/// The placeholder of an unused inline slot.
const NO_LAYOUT: Layout = Layout {
    dims: crate::ir::Dims::new(),
    strides: crate::ir::Dims::new(),
    offset: 0,
};

impl Ctx<'_> {
    /// Runs panels `panels`, whose pieces of the outputs are `outs`, halving the run
    /// across `rayon::join` while it is longer than `per_task` panels.
    fn split(
        &self,
        layout: PanelLayout,
        panels: std::ops::Range<usize>,
        outs: &mut [&mut [f32]],
        per_task: usize,
    ) -> Result<(), KernelError> {
        if panels.len() <= per_task {
            return self.panels(layout, panels, outs, Par::serial());
        }
        let g = self.geom;
        let mid = panels.start + panels.len() / 2;
        let len = layout.start(g, mid) - layout.start(g, panels.start);
        let (left, right) = (panels.start..mid, mid..panels.end);
        let (r0, r1) = join_split(
            outs,
            len,
            |a| self.split(layout, left, a, per_task),
            |b| self.split(layout, right, b, per_task),
        );
        r0.and(r1)
    }

    /// Runs panels `panels` (in order), whose pieces of the outputs are `outs` (they
    /// start at the first panel's first element).
    fn panels(
        &self,
        layout: PanelLayout,
        panels: std::ops::Range<usize>,
        outs: &mut [&mut [f32]],
        par: Par,
    ) -> Result<(), KernelError> {
        let g = self.geom;
        let base = layout.start(g, panels.start);
        let n_out = outs.len();
        for t in panels {
            let p = layout.panel(g, t);
            let at = layout.start(g, t) - base;
            let range = at..at + p.rows * g.n;
            if n_out <= INLINE {
                let mut inline: [&mut [f32]; INLINE] = Default::default();
                for (slot, o) in inline.iter_mut().zip(outs.iter_mut()) {
                    *slot = &mut o[range.clone()];
                }
                self.panel(p, &mut inline[..n_out], par)?;
            } else {
                let mut pieces: Vec<&mut [f32]> =
                    outs.iter_mut().map(|o| &mut o[range.clone()]).collect();
                self.panel(p, &mut pieces, par)?;
            }
        }
        Ok(())
    }

    /// Runs the chain on one panel; `outs` are the panel's pieces of the outputs. The
    /// head's product is written straight into output 0's piece (in cache), and the
    /// program reads it from there while it overwrites it (an in-place input), so the
    /// product needs no memory of its own.
    fn panel(&self, p: Panel, outs: &mut [&mut [f32]], par: Par) -> Result<(), KernelError> {
        let g = self.geom;
        let len = p.rows * g.n;
        let head = self.matmul.map(|m| m.input);
        if let Some(mm) = &self.matmul {
            // The panel's rows of lhs times the whole of rhs (of the same matrix).
            let lhs = g.panel_layout(mm.lhs.1, p);
            let k = mm.rhs.1.dims[g.dims.len() - 2];
            let rhs = g.panel_layout(
                mm.rhs.1,
                Panel {
                    b: p.b,
                    r0: 0,
                    rows: k,
                },
            );
            let out = outs
                .first_mut()
                .ok_or_else(|| error("chain", "a matmul head needs an output"))?;
            let mut steps = [Step::Gelu; MAX_STEPS];
            let (bound, plan) = (mm.rhs.0, mm.plan);
            if let (Rhs::Packed(_), Some(n_steps)) = (bound, self.tile_epilogue(p, &mut steps)) {
                let steps = &steps[..n_steps];
                product(
                    plan,
                    mm.lhs.0,
                    &lhs,
                    bound,
                    &rhs,
                    steps,
                    &mut out[..len],
                    par,
                )?;
                self.tail(outs, par);
                return Ok(());
            }
            product(plan, mm.lhs.0, &lhs, bound, &rhs, &[], &mut out[..len], par)?;
        }
        // Every other input, narrowed to the panel's rows; the product as output 0.
        let local = Layout::contiguous(&[p.rows, g.n]);
        let layout = |k: usize| {
            if Some(k) == head {
                local
            } else {
                g.panel_layout(self.inputs[k].1, p)
            }
        };
        let src = |k: usize| -> &[f32] {
            if Some(k) == head {
                &[]
            } else {
                self.inputs[k].0
            }
        };
        let n_in = self.inputs.len();
        let in_place: &[(usize, usize)] = match head {
            Some(k) => &[(k, 0)][..],
            None => &[],
        };
        let run = |data: &[(&[f32], &Layout)], outs: &mut [&mut [f32]]| {
            fused_in_place(self.program, data, in_place, outs, par)
        };
        if n_in > INLINE {
            let layouts: Vec<Layout> = (0..n_in).map(layout).collect();
            let data: Vec<(&[f32], &Layout)> = layouts
                .iter()
                .enumerate()
                .map(|(k, l)| (src(k), l))
                .collect();
            run(&data, outs)?;
        } else {
            let mut layouts = [NO_LAYOUT; INLINE];
            for (k, l) in layouts.iter_mut().enumerate().take(n_in) {
                *l = layout(k);
            }
            let mut data: [(&[f32], &Layout); INLINE] = [(&[], &NO_LAYOUT); INLINE];
            for k in 0..n_in {
                data[k] = (src(k), &layouts[k]);
            }
            run(&data[..n_in], outs)?;
        }
        self.tail(outs, par);
        Ok(())
    }

    /// The norm at the chain's tail, if any, on the panel's rows of its output.
    fn tail(&self, outs: &mut [&mut [f32]], par: Par) {
        if let Some((op, j)) = self.tail {
            let n = self.geom.n;
            for_each_chunk(outs[*j], n, n * op.cost(), par, |_, rows| {
                op.apply_rows(rows, n)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, UnaryOp};
    use crate::kernels::fused::Instr;
    use crate::kernels::testutil::*;
    use crate::kernels::{binary, layer_norm, matmul, matmul_prepacked, softmax, unary};
    use crate::kernels::{PackedRhs, ProductPlan};

    /// A chain's head as a plan and the executor's binding make it: on `packed`'s tile
    /// when given, by `gemm` on `rhs` otherwise, with `program` in the tile where the
    /// plan would put it.
    fn head<'a>(
        lhs: (&'a [f32], &'a Layout),
        rhs: (&'a [f32], &'a Layout),
        packed: Option<&'a PackedRhs>,
        plan: &'a ProductPlan,
        program: &FusedProgram,
    ) -> ChainMatMul<'a> {
        ChainMatMul {
            lhs,
            rhs: (
                match (plan.path, packed) {
                    (ProductPath::Packed(_), Some(p)) => Rhs::Packed(p),
                    _ => Rhs::Elements(rhs.0),
                },
                rhs.1,
            ),
            input: 0,
            plan,
            epilogue: if plan.epilogue_in_tile(lhs.1) {
                TileEpilogue::plan(program, 0)
            } else {
                None
            },
        }
    }

    /// The programs after a product that the packed f32 tile takes in its registers
    /// ([`Ctx::tile_epilogue`]): a bias (either operand order), GELU of it, a bias
    /// and a residual (the output projections', before their norm); and ones it must
    /// leave to the program.
    #[test]
    fn the_tile_takes_only_a_running_sum_of_adds_and_gelu() {
        let (m, n) = (3, 4);
        let dims = [m, n];
        let bias = vec![1.0f32; n];
        let res = vec![2.0f32; m * n];
        let bl = Layout::contiguous(&[n]).broadcast_as(&dims).unwrap();
        let rl = Layout::contiguous(&dims);
        let empty = Layout::contiguous(&[]);
        let inputs = [(&[][..], &empty), (&bias[..], &bl), (&res[..], &rl)];
        let geom = Geometry::new("chain", &dims, true).unwrap();
        let lhs = Layout::contiguous(&[m, 2]);
        let rhs = Layout::contiguous(&[2, n]);
        let gemm = ProductPlan::with(&lhs, &rhs, None);
        let (i, u, add) = (
            Instr::Input,
            |x| Instr::Unary(UnaryOp::Gelu, x),
            |x, y| Instr::Binary(BinaryOp::Add, x, y),
        );
        let cases: [(Vec<Instr>, u16, Option<usize>); 9] = [
            (vec![i(0), i(1), add(0, 1)], 2, Some(1)),
            (vec![i(1), i(0), add(0, 1)], 2, Some(1)),
            (vec![i(0), i(1), add(0, 1), u(2)], 3, Some(2)),
            (vec![i(0), i(1), add(0, 1), i(2), add(3, 2)], 4, Some(2)),
            // The product added to itself, GELU of the bias, an old sum used again,
            // a product loaded twice, an output that is not the running sum.
            (vec![i(0), add(0, 0)], 1, None),
            (vec![i(0), i(1), u(1), add(0, 2)], 3, None),
            (vec![i(0), i(1), add(0, 1), add(2, 0)], 3, None),
            (vec![i(0), i(0), add(0, 1)], 2, None),
            (vec![i(0), i(1), add(0, 1)], 1, None),
        ];
        for (instrs, out, want) in cases {
            let program = FusedProgram {
                inputs: 3,
                instrs,
                outputs: vec![out],
            };
            let ctx = Ctx {
                geom: &geom,
                matmul: Some(ChainMatMul {
                    lhs: (&[], &lhs),
                    rhs: (Rhs::Elements(&[]), &rhs),
                    input: 0,
                    plan: &gemm,
                    epilogue: TileEpilogue::plan(&program, 0),
                }),
                program: &program,
                inputs: &inputs,
                tail: None,
            };
            let mut steps = [Step::Gelu; MAX_STEPS];
            let p = Panel {
                b: 0,
                r0: 0,
                rows: m,
            };
            assert_eq!(ctx.tile_epilogue(p, &mut steps), want, "{program}");
        }
    }

    /// Chains whose program the tile takes (a bias, GELU of it, a bias and a
    /// residual in either order, then a layer norm), by a packed f32 weight: the bits
    /// of the product followed by the program's operations one kernel at a time, for
    /// ragged panels and several chain panels; by an unpacked weight (the program
    /// runs), the same values.
    #[test]
    fn an_epilogue_in_the_tile_gives_the_bits_of_the_program() {
        let mut rng = Rng::new(72);
        for (m, k, n) in [(1, 5, 1), (13, 9, 33), (700, 24, 70), (40, 1, 1000)] {
            let (lb, ll) = rand_f32(&mut rng, &[m, k]);
            let (rb, rl) = rand_f32(&mut rng, &[k, n]);
            let (bias, bl1) = rand_f32(&mut rng, &[n]);
            let res: Vec<f32> = (0..m * (n + 2)).map(|_| rng.f32()).collect();
            let dims = [m, n];
            let c = Layout::contiguous(&dims);
            // The residual's rows are padded: stride n + 2.
            let resl = Layout {
                dims: dims.into(),
                strides: [n + 2, 1].into(),
                offset: 0,
            };
            let mut prod = vec![0f32; m * n];
            let packed = crate::kernels::PackedRhs::pack(&rb, &rl);
            matmul_prepacked(
                &lb,
                &ll,
                &rb,
                &rl,
                packed.as_ref(),
                &mut prod,
                Par::serial(),
            )
            .unwrap();
            let bl = bl1.broadcast_as(&dims).unwrap();
            let s = Par::serial();
            let op = |f: &dyn Fn(&mut [f32])| {
                let mut v = vec![0f32; m * n];
                f(&mut v);
                v
            };
            let summed = op(&|v| binary(BinaryOp::Add, &prod, &c, &bias, &bl, v, s).unwrap());
            let gelu = op(&|v| unary(UnaryOp::Gelu, &summed, &c, v, s).unwrap());
            let res_after = op(&|v| binary(BinaryOp::Add, &summed, &c, &res, &resl, v, s).unwrap());
            let res_before =
                op(&|v| binary(BinaryOp::Add, &res, &resl, &summed, &c, v, s).unwrap());
            let normed =
                op(&|v| layer_norm(&res_after, &c, &bias, &bl1, &bias, &bl1, 1e-5, v, s).unwrap());
            let (i, add) = (Instr::Input, |x, y| Instr::Binary(BinaryOp::Add, x, y));
            let program = |instrs: Vec<Instr>| FusedProgram {
                inputs: 3,
                outputs: vec![instrs.len() as u16 - 1],
                instrs,
            };
            let norm = ChainNorm::LayerNorm {
                weight: (&bias, &bl1),
                bias: (&bias, &bl1),
                eps: 1e-5,
            };
            let gelu_program = program(vec![i(0), i(1), add(0, 1), Instr::Unary(UnaryOp::Gelu, 2)]);
            let cases = [
                (program(vec![i(0), i(1), add(0, 1)]), None, &summed),
                (program(vec![i(1), i(0), add(1, 0)]), None, &summed),
                (gelu_program, None, &gelu),
                (
                    program(vec![i(0), i(1), add(0, 1), i(2), add(2, 3)]),
                    None,
                    &res_after,
                ),
                (
                    program(vec![i(0), i(1), add(0, 1), i(2), add(3, 2)]),
                    None,
                    &res_before,
                ),
                (
                    program(vec![i(0), i(1), add(0, 1), i(2), add(2, 3)]),
                    Some((norm, 0)),
                    &normed,
                ),
            ];
            let empty = Layout::contiguous(&[]);
            let inputs = [(&[][..], &empty), (&bias[..], &bl), (&res[..], &resl)];
            for (program, tail, want) in &cases {
                for par in pars() {
                    for packed in [packed.as_ref(), None] {
                        let plan = ProductPlan::with(&ll, &rl, packed);
                        let mm = head((&lb, &ll), (&rb, &rl), packed, &plan, program);
                        let mut out = vec![f32::NAN; m * n];
                        let outs = &mut [&mut out[..]];
                        chain(&dims, Some(mm), program, &inputs, *tail, outs, par).unwrap();
                        if packed.is_some() {
                            let same = same_bits(&out, want);
                            assert!(same, "[{m}, {k}] x [{k}, {n}] {program} {par:?}");
                        } else {
                            assert_close(&out, want, 1e-5);
                        }
                    }
                }
            }
        }
    }

    /// `gelu(product + bias) + residual`, then optionally a layer norm, against the
    /// single-op kernels, over batched and strided operands and several panels.
    #[test]
    fn matmul_epilogue_and_norm_match_single_ops() {
        let mut rng = Rng::new(71);
        for case in 0..24 {
            let batch = rng.dims(case % 3, 3);
            let (m, k, n) = if case % 4 == 0 {
                (300 + rng.below(40), 1 + rng.below(20), 200 + rng.below(100))
            } else {
                (1 + rng.below(9), rng.below(7), 1 + rng.below(9))
            };
            let dims: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
            let ld: Vec<usize> = batch.iter().copied().chain([m, k]).collect();
            let rd: Vec<usize> = batch.iter().copied().chain([k, n]).collect();
            let (lb, ll) = random_layout(&mut rng, &ld, |r| r.f32());
            let (rb, rl) = random_layout(&mut rng, &rd, |r| r.f32());
            let (bias, bl1) = rand_f32(&mut rng, &[n]);
            let bl = bl1.broadcast_as(&dims).unwrap();
            let (res, resl) = random_layout(&mut rng, &dims, |r| r.f32());
            let (w, wl) = rand_f32(&mut rng, &[n]);
            let numel: usize = dims.iter().product();
            let c = Layout::contiguous(&dims);
            // Reference, one kernel at a time.
            let mut prod = vec![0f32; numel];
            matmul(&lb, &ll, &rb, &rl, &mut prod, Par::serial()).unwrap();
            let mut t1 = vec![0f32; numel];
            binary(BinaryOp::Add, &prod, &c, &bias, &bl, &mut t1, Par::serial()).unwrap();
            let mut t2 = vec![0f32; numel];
            unary(UnaryOp::Gelu, &t1, &c, &mut t2, Par::serial()).unwrap();
            let mut t3 = vec![0f32; numel];
            binary(BinaryOp::Add, &t2, &c, &res, &resl, &mut t3, Par::serial()).unwrap();
            let mut ln = vec![0f32; numel];
            layer_norm(&t3, &c, &w, &wl, &bias, &bl1, 1e-5, &mut ln, Par::serial()).unwrap();
            let program = FusedProgram {
                inputs: 3,
                instrs: vec![
                    Instr::Input(0),
                    Instr::Input(1),
                    Instr::Binary(BinaryOp::Add, 0, 1),
                    Instr::Unary(UnaryOp::Gelu, 2),
                    Instr::Input(2),
                    Instr::Binary(BinaryOp::Add, 3, 4),
                ],
                outputs: vec![3, 5],
            };
            let empty = Layout::contiguous(&[]);
            let inputs = [(&[][..], &empty), (&bias[..], &bl), (&res[..], &resl)];
            // A 2-D rhs also runs packed, as a model's weight does.
            let packed = if batch.is_empty() {
                crate::kernels::PackedRhs::pack(&rb, &rl)
            } else {
                None
            };
            for (par, packed) in pars()
                .into_iter()
                .flat_map(|p| [(p, None), (p, packed.as_ref())])
            {
                let plan = ProductPlan::with(&ll, &rl, packed);
                let mm = head((&lb, &ll), (&rb, &rl), packed, &plan, &program);
                let (mut g, mut out) = (vec![f32::NAN; numel], vec![f32::NAN; numel]);
                chain(
                    &dims,
                    Some(mm),
                    &program,
                    &inputs,
                    None,
                    &mut [&mut g, &mut out],
                    par,
                )
                .unwrap();
                assert_close(&g, &t2, 1e-4);
                assert_close(&out, &t3, 1e-4);
                let norm = ChainNorm::LayerNorm {
                    weight: (&w, &wl),
                    bias: (&bias, &bl1),
                    eps: 1e-5,
                };
                chain(
                    &dims,
                    Some(mm),
                    &program,
                    &inputs,
                    Some((norm, 1)),
                    &mut [&mut g, &mut out],
                    par,
                )
                .unwrap();
                assert_close(&g, &t2, 1e-4);
                assert_close(&out, &ln, 1e-3);
            }
        }
    }

    /// A program into a softmax with no head, over rank 1 to 4 and strided inputs.
    #[test]
    fn norm_prologue_matches_single_ops() {
        let mut rng = Rng::new(72);
        for case in 0..40 {
            let dims = rng.dims(1 + case % 4, 7);
            let (a, al) = random_layout(&mut rng, &dims, |r| r.f32() * 3.0);
            let numel: usize = dims.iter().product();
            let c = Layout::contiguous(&dims);
            let mut scaled = vec![0f32; numel];
            let affine = UnaryOp::Affine {
                mul: 0.5f64.to_bits(),
                add: 0.25f64.to_bits(),
            };
            unary(affine, &a, &al, &mut scaled, Par::serial()).unwrap();
            let mut want = vec![0f32; numel];
            softmax(&scaled, &c, &mut want, Par::serial()).unwrap();
            let program = FusedProgram {
                inputs: 1,
                instrs: vec![Instr::Input(0), Instr::Unary(affine, 0)],
                outputs: vec![1],
            };
            for par in pars() {
                let mut out = vec![f32::NAN; numel];
                chain(
                    &dims,
                    None,
                    &program,
                    &[(&a, &al)],
                    Some((ChainNorm::Softmax, 0)),
                    &mut [&mut out],
                    par,
                )
                .unwrap();
                assert_close(&out, &want, 1e-6);
            }
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let a = vec![1.0f32; 6];
        let l = Layout::contiguous(&[2, 3]);
        let copy = FusedProgram {
            inputs: 1,
            instrs: vec![Instr::Input(0)],
            outputs: vec![0],
        };
        let mut o = vec![0f32; 6];
        let s = Par::serial();
        chain(&[2, 3], None, &copy, &[(&a, &l)], None, &mut [&mut o], s).unwrap();
        assert_eq!(o, a);
        // Scalars, wrong sizes, wrong dims, layouts past their buffers.
        assert!(chain(&[], None, &copy, &[(&a, &l)], None, &mut [&mut o], s).is_err());
        assert!(chain(
            &[2, 3],
            None,
            &copy,
            &[(&a, &l)],
            None,
            &mut [&mut o[..5]],
            s
        )
        .is_err());
        assert!(chain(&[3, 2], None, &copy, &[(&a, &l)], None, &mut [&mut o], s).is_err());
        assert!(chain(
            &[2, 3],
            None,
            &copy,
            &[(&a[..5], &l)],
            None,
            &mut [&mut o],
            s
        )
        .is_err());
        assert!(chain(&[2, 3], None, &copy, &[], None, &mut [&mut o], s).is_err());
        let norm = Some((ChainNorm::Softmax, 1));
        assert!(chain(&[2, 3], None, &copy, &[(&a, &l)], norm, &mut [&mut o], s).is_err());
        let w = Layout::contiguous(&[2]);
        let ln = ChainNorm::RmsNorm {
            weight: (&a, &w),
            eps: 1e-5,
        };
        let e = chain(
            &[2, 3],
            None,
            &copy,
            &[(&a, &l)],
            Some((ln, 0)),
            &mut [&mut o],
            s,
        )
        .unwrap_err();
        assert!(e.0.contains("weight"), "{e}");
        // A head whose operands do not multiply into the output.
        let gemm = ProductPlan::with(&l, &l, None);
        let mm = ChainMatMul {
            lhs: (&a, &l),
            rhs: (Rhs::Elements(&a), &l),
            input: 0,
            plan: &gemm,
            epilogue: None,
        };
        let e = chain(
            &[2, 3],
            Some(mm),
            &copy,
            &[(&a, &l)],
            None,
            &mut [&mut o],
            s,
        )
        .unwrap_err();
        assert!(e.0.contains("cannot multiply"), "{e}");
        let l32 = Layout::contiguous(&[3, 3]);
        let mm = ChainMatMul {
            lhs: (&a, &l),
            rhs: (Rhs::Elements(&a), &l32),
            input: 0,
            plan: &gemm,
            epilogue: None,
        };
        assert!(chain(
            &[2, 3],
            Some(mm),
            &copy,
            &[(&a, &l)],
            None,
            &mut [&mut o],
            s
        )
        .is_err());
        assert!(chain(&[3], Some(mm), &copy, &[(&a, &l)], None, &mut [&mut o], s).is_err());
    }
}
