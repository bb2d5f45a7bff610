//! Running a product by a packed weight: the one split of a product between threads
//! (by rows, or by panels for short products), the epilogue's checks, the prefetch the bf16 and int8 tiles issue ahead of their panels, and
//! the shapes the walks share ([`Matrix`], [`Part`], [`Cols`]).

use super::{bf16, f32, i8, tiles, Epilogue, Operand, PackedRhs, Step, MR, NR};
use crate::ir::Layout;
use crate::kernels::par::{for_each_chunk, Out, Split};
use crate::kernels::{check_input, error, KernelError, Par};

/// How far ahead of the step being multiplied the bf16 and int8 tiles ask for their
/// panel, in bytes (the next panel's, near the end of one): 4 KiB, about what arrives
/// from DRAM while 32 steps of 14 rows run. A model's weights are larger than the
/// cache; without the hint the first row block of each panel waited on DRAM. Measured
/// when the f32 tile used it too, on a pass over MiniLM's 24 weights at 28 rows in f32
/// (the hint on and off in alternate passes, medians of 40, on the EPYC): 1 thread 83 →
/// 87 GFLOP/s, 2 threads 96–112 → 134–144; 896 rows 98 → 100. Into L2 (`T1`): into L1
/// gained less with 2 threads (115–134). The f32 tile now shares out the next panel
/// among its row blocks instead (`f32::NextPanel`).
#[cfg(target_arch = "x86_64")]
pub(super) const PREFETCH_BYTES: usize = 4096;

/// Asks for the 128 bytes (two cache lines) [`PREFETCH_BYTES`] past `step`, the start
/// of the panel bytes a tile's current step reads (every form's step reads 128 bytes
/// of its panel), to be brought into L2. Past the last panel the hint is simply
/// ignored: a prefetch reads nothing and cannot fault, and `wrapping_add` keeps the
/// address computation defined for any `step`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_ahead(step: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    let ahead = step.wrapping_add(PREFETCH_BYTES);
    // SAFETY: a prefetch is only a hint: it dereferences nothing, whatever the
    // address, and needs only SSE (always present on x86_64).
    unsafe {
        _mm_prefetch::<_MM_HINT_T1>(ahead.cast());
        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64).cast());
    }
}

/// Multiplies `[b.., m, k]` (read through `lhs_layout`, any strides; rows with
/// contiguous elements take the fastest path) by the packed `[k, n]` into `dst`
/// (`b * m * n` elements, row-major). A bf16 matrix multiplies the left operand's
/// elements rounded to bf16, an int8 one its rows quantised to int8 (module `i8`);
/// both sum in f32.
#[cfg(test)]
pub(in crate::kernels) fn matmul_packed(
    lhs: &[f32],
    lhs_layout: &Layout,
    rhs: &PackedRhs,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let form = rhs.form();
    product(
        lhs,
        lhs_layout,
        (rhs.k, rhs.n),
        (form, form.simd()),
        &[],
        None,
        dst,
        par,
    )
}

/// [`matmul_packed`] as a plan decided it: split between threads as `split` says, and
/// followed by `epilogue` in the tile's registers, which the plan asks for only where
/// the tile takes one (`PackedRhs::tile`) and the product is one matrix; an epilogue
/// the form cannot apply is an error, not a silent second pass.
pub(crate) fn matmul_packed_split(
    lhs: &[f32],
    lhs_layout: &Layout,
    rhs: &PackedRhs,
    split: Split,
    epilogue: Epilogue<'_>,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    if epilogue.is_empty() {
        let form = rhs.form();
        return product(
            lhs,
            lhs_layout,
            (rhs.k, rhs.n),
            (form, form.simd()),
            &[],
            Some(split),
            dst,
            par,
        );
    }
    if epilogue_run(lhs, lhs_layout, rhs, epilogue, Some(split), dst, par)? {
        Ok(())
    } else {
        Err(error(
            "matmul",
            format_args!(
                "a product by a {} matrix of {} rows was planned with an epilogue its tile \
                 does not apply (engine bug)",
                rhs.dtype(),
                lhs_layout.dims.len()
            ),
        ))
    }
}

/// [`matmul_packed`] followed by `epilogue` on every element of the product, when
/// `rhs` is packed in f32 (or in int8 or bf16 where its tile takes one,
/// `i8::takes_epilogue`, `bf16::takes_epilogue`)
/// and the product is one matrix (no batch dims): the tile applies it to its sums
/// before it stores them (see [`Epilogue`]). Returns `Ok(false)`, having done nothing,
/// for the other forms and for batched products (the caller then runs the epilogue
/// itself); an error when a step's operand does not fit the product.
#[cfg(test)]
pub(crate) fn matmul_packed_epilogue(
    lhs: &[f32],
    lhs_layout: &Layout,
    rhs: &PackedRhs,
    epilogue: Epilogue<'_>,
    dst: &mut [f32],
    par: Par,
) -> Result<bool, KernelError> {
    epilogue_run(lhs, lhs_layout, rhs, epilogue, None, dst, par)
}

/// [`matmul_packed_epilogue`], split as `split` says (by [`Split::of`] when `None`).
fn epilogue_run(
    lhs: &[f32],
    lhs_layout: &Layout,
    rhs: &PackedRhs,
    epilogue: Epilogue<'_>,
    split: Option<Split>,
    dst: &mut [f32],
    par: Par,
) -> Result<bool, KernelError> {
    let form = rhs.form();
    let rank = lhs_layout.dims.len();
    // (With k = 0 no tile runs to apply the steps.)
    if !form.takes_epilogue() || rank != 2 || rhs.k == 0 {
        return Ok(false);
    }
    let (m, n) = (lhs_layout.dims[0], rhs.n);
    for step in epilogue {
        let fits = match *step {
            Step::Add {
                operand: Operand::Columns(values),
                ..
            } => values.len() == n,
            Step::Add {
                operand:
                    Operand::Rows {
                        data,
                        offset,
                        stride,
                    },
                ..
            } => m == 0 || rows_end(offset, stride, m, n).is_some_and(|end| end <= data.len()),
            Step::Gelu => true,
        };
        if !fits {
            return Err(error(
                "matmul",
                format_args!("the epilogue's {step} does not fit a [{m}, {n}] product"),
            ));
        }
    }
    product(
        lhs,
        lhs_layout,
        (rhs.k, rhs.n),
        (form, form.simd()),
        epilogue,
        split,
        dst,
        par,
    )?;
    Ok(true)
}

/// One past the last element of `rows` rows of `n` elements, each `stride` after the
/// one before, from `offset`; `None` on overflow.
pub(super) fn rows_end(offset: usize, stride: usize, rows: usize, n: usize) -> Option<usize> {
    (rows.checked_sub(1)?)
        .checked_mul(stride)?
        .checked_add(offset)?
        .checked_add(n)
}

/// The panels of a packed matrix, borrowed, in their element type.
#[derive(Clone, Copy)]
pub(super) enum Form<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u32]),
    I8(&'a i8::PackedI8),
    Tiles(&'a tiles::PackedTiles),
}

impl Form<'_> {
    /// Whether this CPU runs the form's instruction-set path (f32 panels exist only
    /// where it does).
    pub(super) fn simd(self) -> bool {
        match self {
            Form::F32(_) => true,
            Form::Bf16(_) => bf16::simd(),
            Form::I8(_) => i8::simd(),
            Form::Tiles(_) => crate::kernels::cpu::has_amx_bf16(),
        }
    }

    /// Whether the form's tile applies an [`Epilogue`] (the f32 one, and the int8 and
    /// bf16 ones of the AVX2 and aarch64 tiers).
    pub(super) fn takes_epilogue(self) -> bool {
        match self {
            Form::F32(_) => true,
            Form::Bf16(_) => bf16::takes_epilogue(self.simd()),
            Form::I8(w) => i8::takes_epilogue(w, self.simd()),
            _ => false,
        }
    }

    /// The rows of one tile: a split by rows cuts at multiples of it.
    pub(super) fn tile_rows(self) -> usize {
        match self {
            Form::Tiles(_) => tiles::ROWS,
            Form::F32(_) => f32::Isa::here().map_or(MR, f32::Isa::rows),
            Form::Bf16(_) => bf16::tile_rows(),
            _ => MR,
        }
    }
}

/// [`matmul_packed`] by the `[k, n]` matrix whose panels are `form`, on the
/// instruction-set path when `simd`, on the portable loops otherwise (the tests run
/// both), split between threads as `split` says ([`Split::of`] the product when
/// `None`: a direct call, not a plan's).
#[allow(clippy::too_many_arguments)]
pub(super) fn product(
    lhs: &[f32],
    lhs_layout: &Layout,
    (k, n): (usize, usize),
    (form, simd): (Form<'_>, bool),
    epilogue: Epilogue<'_>,
    split: Option<Split>,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "matmul";
    check_input(kernel, "lhs", lhs.len(), lhs_layout)?;
    let ld = &lhs_layout.dims;
    let rank = ld.len();
    if rank < 2 || ld[rank - 1] != k {
        return Err(error(
            kernel,
            format_args!("cannot multiply lhs dims {ld:?} by a packed [{k}, {n}]"),
        ));
    }
    let m = ld[rank - 2];
    // Strides of size-1 dims are never multiplied by a non-zero index.
    let lda = if m > 1 {
        lhs_layout.strides[rank - 2]
    } else {
        0
    };
    let cs = if k > 1 {
        lhs_layout.strides[rank - 1]
    } else {
        1
    };
    let batch: usize = ld[..rank - 2].iter().product();
    let numel = batch
        .checked_mul(m)
        .and_then(|x| x.checked_mul(n))
        .ok_or_else(|| error(kernel, "output element count overflows"))?;
    crate::kernels::check_dst(kernel, dst.len(), numel)?;
    if numel == 0 {
        return Ok(());
    }
    if k == 0 {
        // (`matmul_packed_epilogue` takes no epilogue for k = 0.)
        debug_assert!(epilogue.is_empty());
        dst.fill(0.0);
        return Ok(());
    }
    let split = split.unwrap_or_else(|| Split::of(batch, m, n, k));
    // Matrix `b` of the batch, into its `m * n` elements of `dst`, on `threads`.
    let one = |b: usize, out: &mut [f32], threads: usize| {
        let base = crate::kernels::strided::offset_of(
            &ld[..rank - 2],
            &lhs_layout.strides[..rank - 2],
            lhs_layout.offset,
            b,
        );
        // The matrix: element (i, p) at i * lda + p * cs. The layout fits `lhs`
        // (checked), so its last element is inside it.
        let a = &lhs[base..base + (m - 1) * lda + (k - 1) * cs + 1];
        let job = Job {
            g: Matrix { a, lda, cs, k },
            n,
            form,
            simd,
            epilogue,
        };
        let out = Out::new(out);
        match split {
            Split::Rows => split_rows(&job, (0, m), out, threads),
            _ => split_columns(&job, (0, m), out, (0, n.div_ceil(NR)), threads),
        }
    };
    match split {
        Split::Batch => {
            let work = m.saturating_mul(n).saturating_mul(k);
            for_each_chunk(dst, m * n, work, par, |first, out| {
                for (i, out) in out.chunks_exact_mut(m * n).enumerate() {
                    one(first + i, out, 1);
                }
            });
        }
        Split::Serial => {
            for (b, out) in dst.chunks_exact_mut(m * n).enumerate() {
                one(b, out, 1);
            }
        }
        Split::Rows | Split::Columns => {
            for (b, out) in dst.chunks_exact_mut(m * n).enumerate() {
                one(b, out, par.threads);
            }
        }
    }
    Ok(())
}

/// The left operand of one product, in f32.
#[derive(Clone, Copy)]
pub(super) struct Matrix<'a> {
    /// Element `(i, p)` is `a[i * lda + p * cs]`; `a` ends at the last one.
    pub(super) a: &'a [f32],
    pub(super) lda: usize,
    pub(super) cs: usize,
    pub(super) k: usize,
}

/// One product: the left operand, the panels of the right one (`n` columns), and
/// whether the instruction-set path runs.
pub(super) struct Job<'a> {
    pub(super) g: Matrix<'a>,
    pub(super) n: usize,
    pub(super) form: Form<'a>,
    pub(super) simd: bool,
    /// Applied to every element of the product (by the forms that take one, see
    /// [`matmul_packed_epilogue`]).
    pub(super) epilogue: Epilogue<'a>,
}

/// Halves rows `rows.0..rows.1` between threads (block-aligned), each computing all
/// columns of its rows.
pub(super) fn split_rows(job: &Job<'_>, rows: (usize, usize), out: Out, threads: usize) {
    let (r0, r1) = rows;
    let m = r1 - r0;
    let tile = job.form.tile_rows();
    if threads <= 1 || m <= 2 * tile {
        return split_columns(job, rows, out, (0, job.n.div_ceil(NR)), 1);
    }
    let mid = r0 + (m / 2).next_multiple_of(tile).min(m - tile);
    rayon::join(
        || split_rows(job, (r0, mid), out, threads / 2),
        || split_rows(job, (mid, r1), out, threads - threads / 2),
    );
}

/// Computes panels `panels.0..panels.1` of rows `rows.0..rows.1` of `out` (`m × n`),
/// halving the panels between `threads` threads.
pub(super) fn split_columns(
    job: &Job<'_>,
    rows: (usize, usize),
    out: Out,
    panels: (usize, usize),
    threads: usize,
) {
    let (p0, p1) = panels;
    if threads > 1 && p1 - p0 >= 2 {
        let mid = p0 + (p1 - p0) / 2;
        rayon::join(
            || split_columns(job, rows, out, (p0, mid), threads / 2),
            || split_columns(job, rows, out, (mid, p1), threads - threads / 2),
        );
        return;
    }
    let part = Part {
        rows,
        panels,
        n: job.n,
    };
    match job.form {
        Form::F32(data) => f32::part(job.g, data, job.epilogue, part, out),
        Form::Bf16(data) => bf16::part(job.g, data, job.epilogue, part, job.simd, out),
        Form::I8(w) => i8::part(job.g, w, job.epilogue, part, job.simd, out),
        Form::Tiles(w) => tiles::part(job.g, w, part, job.simd, out),
    }
}

/// The part of a product one thread computes: panels `panels` of rows `rows`, of an
/// output `n` wide.
#[derive(Clone, Copy)]
pub(super) struct Part {
    pub(super) rows: (usize, usize),
    pub(super) panels: (usize, usize),
    pub(super) n: usize,
}

impl Part {
    /// Calls `f(first row, rows)` for the row blocks of rows `first..first + count`:
    /// at most [`MR`] rows each, as even as possible (20 rows are two blocks of 10, not
    /// 14 + 6).
    pub(super) fn blocks(first: usize, count: usize, f: impl FnMut(usize, usize)) {
        Part::blocks_of(MR, first, count, f)
    }

    /// [`Part::blocks`] for tiles of at most `rows` rows.
    pub(super) fn blocks_of(
        rows: usize,
        first: usize,
        count: usize,
        mut f: impl FnMut(usize, usize),
    ) {
        let blocks = count.div_ceil(rows);
        let mut r0 = first;
        for bi in 0..blocks {
            let h = (first + count - r0).div_ceil(blocks - bi);
            f(r0, h);
            r0 += h;
        }
    }

    /// Where panel `pj`'s columns go.
    pub(super) fn cols(self, pj: usize) -> Cols {
        let j0 = pj * NR;
        Cols {
            j0,
            width: NR.min(self.n - j0),
            ldc: self.n,
        }
    }
}

/// Where a tile's results go: columns `j0..j0 + width` of rows at stride `ldc`.
#[derive(Clone, Copy)]
pub(super) struct Cols {
    pub(super) j0: usize,
    pub(super) width: usize,
    pub(super) ldc: usize,
}

/// The masks of the two 16-lane halves of a panel that hold its first `width` columns
/// (the last panel may be narrower).
#[cfg(target_arch = "x86_64")]
pub(super) fn lane_masks(width: usize) -> (u16, u16) {
    let m0 = if width >= 16 {
        0xffff
    } else {
        (1u16 << width) - 1
    };
    let m1 = if width >= NR {
        0xffff
    } else if width > 16 {
        (1u16 << (width - 16)) - 1
    } else {
        0
    };
    (m0, m1)
}
