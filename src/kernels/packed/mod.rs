//! Matrix products against a right operand packed once: the weights of a model.
//!
//! `gemm` packs both operands on every call. For the rows of one request (a few dozen
//! tokens) packing the weight costs as much as multiplying by it, and the weight is
//! read twice (strided, then packed) from DRAM: MiniLM's 24 weights are 42.5 MB, more
//! than the L3. A [`PackedRhs`] holds a `[k, n]` operand once in the layout the
//! microkernel streams: **panels** of [`NR`] columns, each `k` rows of `NR` contiguous
//! floats (the last panel padded with zeros), so a product reads the weight exactly
//! once, front to back, which the hardware prefetcher follows.
//!
//! The microkernel computes a tile of up to [`MR`] rows by [`NR`] columns of the
//! output on AVX-512 (`MR × 2` accumulators), or of up to 6 rows by one half of the
//! panel at a time on AVX2 with FMA (module `f32`); per step of `k` it loads the
//! panel's vectors and broadcasts each row's element of the left operand (read in
//! place: only its rows' current cache lines are live, so it needs no packing). A
//! product walks the panels, and for each panel the row blocks (so a panel stays in L2
//! while every row block reads it); the rows are cut into blocks as even as possible
//! (20 rows are two blocks of 10, not 14 + 6).
//!
//! Measured on this project's 2-core AVX-512 EPYC (thread CPU time, one thread, a
//! MiniLM-shaped pass over all 24 weights): 28 rows 5.9 ms against gemm's 11.1 ms,
//! 128 rows 25.4 ms against 29.6 ms, 896 rows 183.7 against 184.7 ms.
//!
//! A weight can also be packed in **bf16** ([`PackedRhs::pack_bf16`]): half the bytes.
//! Where AMX runs, in AMX tiles (module `tiles`: one `tdpbf16ps` product per block of
//! 32 `k`, 16 × 16 × 32 multiply-adds an instruction); elsewhere, on CPUs with
//! AVX512_BF16, for a tile of `vdpbf16ps` (module `bf16`) that does two multiply-adds
//! per lane and instruction where the f32 tile does one. Either way the left operand is
//! rounded to bf16 once per product, its rows into a scratch of the calling thread, and
//! the products are summed in f32. (On this project's Xeon, all-MiniLM-L6-v2 in bf16
//! went from 265 to 885 sentences/s at batch 32 and from 4.65 to 1.93 ms p50 at one
//! sentence a call when its bf16 weights moved from `vdpbf16ps` pairs to tiles.)
//!
//! Packing in f32 needs AVX2 with FMA, AVX-512 or NEON ([`PackedRhs::pack`] gives
//! `None` on the portable tier, and the caller uses `gemm` on the original operand);
//! bf16 packs everywhere, runs an AVX2 tile that widens the pairs to f32 (the left
//! operand unrounded) on the AVX2 tiers without AVX-512, the NEON tiles on aarch64
//! (`bfmmla`, or the pairs widened likewise; module `bf16`), and portable loops where
//! the CPU has none of these nor AVX512_BF16 (or `STREAMFUSE_PORTABLE=1`, see
//! `kernels::cpu`). The NEON tiles share module `neon`. `unsafe` is confined to the
//! microkernels' loads and stores, whose
//! bounds each tile checks once before its loop, and to the column split of one output
//! between threads (disjoint columns).

mod bf16;
mod epilogue;
mod f32;
mod i8;
#[cfg(target_arch = "aarch64")]
mod neon;
mod product;
mod stack;
mod tiles;

use super::par::Out;
use super::{check_input, error, KernelError};
use crate::ir::{DType, Layout};
pub(crate) use epilogue::{Epilogue, Operand, Step};
#[cfg(test)]
pub(super) use product::matmul_packed;
#[cfg(test)]
pub(crate) use product::matmul_packed_epilogue;
pub(super) use product::matmul_packed_split;
#[cfg(test)]
use product::product;
#[cfg(target_arch = "x86_64")]
use product::{lane_masks, prefetch_ahead};
use product::{rows_end, Cols, Form, Matrix, Part};
#[cfg(target_arch = "x86_64")]
use stack::store_rows;
use stack::{by_rows, chunk_rows, with_stack, with_stack_uninit, CHUNK_ROWS};

/// Columns of one panel (two AVX-512 vectors).
pub(super) const NR: usize = 32;
/// Most rows of one tile (`MR × 2` accumulators of the 32 vector registers).
pub(super) const MR: usize = 14;

/// The tile that multiplies by a packed matrix on the tier in use
/// ([`PackedRhs::tile`]): what a plan records of a packed product's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tile {
    /// The element type the matrix is kept in.
    pub(crate) dtype: DType,
    /// The tile's name (instruction set, and shape where it has one).
    pub(crate) name: &'static str,
    /// Whether it applies a chain's epilogue to its sums before it stores them.
    pub(crate) epilogue: bool,
}

/// A `[k, n]` matrix packed into panels of 32 columns, kept in f32, bf16 or int8 with
/// a scale per column, for products `[.., m, k] × [k, n]` by an f32 left operand
/// (`matmul_prepacked`). Made once per weight (the engine keeps it beside the weight's
/// buffer).
#[derive(Debug)]
pub struct PackedRhs {
    k: usize,
    n: usize,
    /// The layout it was packed from (a 2-D view of its buffer), to check a reader's.
    source: (usize, usize, usize),
    /// The panels, in the element type the weight is kept in.
    panels: Panels,
}

/// `ceil(n / NR)` panels of a packed matrix.
#[derive(Debug)]
enum Panels {
    /// `k * NR` f32 each: row `p` of the panel at `p * NR`.
    F32(Vec<f32>),
    /// `ceil(k / 2) * NR` pairs each: the pair at `q * NR + j` holds rows `2q` (low
    /// half) and `2q + 1` (high half, zero past `k`) of column `j`, in bf16.
    Bf16(Vec<u32>),
    /// Signed 8-bit values with a scale per column (module `i8`).
    I8(i8::PackedI8),
    /// In AMX tiles (module `tiles`): each element as the sum of two bf16 (bf16x3), or
    /// rounded to one (bf16, where AMX runs).
    Tiles(tiles::PackedTiles),
}

/// A zeroed vector of `panels × per_panel` pairs, for the panels of a bf16 or bf16x3
/// matrix; an error names `what` when the size overflows or the memory is refused.
fn zeroed_pairs(
    what: &'static str,
    panels: usize,
    per_panel: usize,
) -> Result<Vec<u32>, KernelError> {
    let len = panels
        .checked_mul(per_panel)
        .ok_or_else(|| error(what, "the packed size overflows"))?;
    let mut data = Vec::new();
    data.try_reserve_exact(len).map_err(|_| {
        error(
            what,
            format_args!("no memory for {} bytes of panels", len * 4),
        )
    })?;
    data.resize(len, 0);
    Ok(data)
}

/// The `[k, n]` matrix `layout` reads from `src`: `(k, n, row stride, column stride)`,
/// or an error naming what does not fit.
fn matrix_of(
    what: &'static str,
    src: &[f32],
    layout: &Layout,
) -> Result<(usize, usize, usize, usize), KernelError> {
    if layout.dims.len() != 2 {
        return Err(error(
            what,
            format_args!(
                "a packed operand is a matrix [k, n], got dims {:?}",
                layout.dims
            ),
        ));
    }
    check_input(what, "rhs", src.len(), layout)?;
    let (k, n) = (layout.dims[0], layout.dims[1]);
    if k == 0 || n == 0 {
        return Err(error(
            what,
            format_args!("cannot pack an empty matrix [{k}, {n}]"),
        ));
    }
    Ok((k, n, layout.strides[0], layout.strides[1]))
}

impl PackedRhs {
    /// Packs the `[k, n]` matrix that `layout` reads from `src` (any strides and
    /// offset), or `None` when no f32 tile runs on this tier ([`PackedRhs::packs_f32`]),
    /// when the layout is not 2-D or does not fit `src`, or when the memory cannot be
    /// had (then the caller multiplies by the original as before).
    pub fn pack(src: &[f32], layout: &Layout) -> Option<PackedRhs> {
        if !PackedRhs::packs_f32() {
            return None;
        }
        pack_panels(src, layout)
    }

    /// Whether [`PackedRhs::pack`] packs here: the tier in use runs an f32 tile (AVX2
    /// with FMA, or AVX-512). Where it does not, products by f32 weights go through
    /// `gemm`.
    pub fn packs_f32() -> bool {
        f32::Isa::here().is_some()
    }

    /// The tile a product by a matrix packed in `dtype` runs on the tier in use, or
    /// `None` where nothing is packed in `dtype` (f32 without an f32 tile: the
    /// portable tier; a dtype that is not a weight's). What the plan builder asks
    /// when it picks a product's path.
    pub(crate) fn tile(dtype: DType) -> Option<Tile> {
        let amx = super::cpu::has_amx_bf16();
        let (name, epilogue) = match dtype {
            DType::F32 => (f32::Isa::here()?.name(), true),
            DType::BF16 if amx => ("amx tdpbf16ps", false),
            DType::BF16 => (
                bf16::tile_name(bf16::simd()),
                bf16::takes_epilogue(bf16::simd()),
            ),
            DType::I8 => i8::tile_here(),
            DType::BF16X3 if amx => ("amx tdpbf16ps x3", false),
            DType::BF16X3 => ("portable", false),
            DType::U32 | DType::I64 => return None,
        };
        Some(Tile {
            dtype,
            name,
            epilogue,
        })
    }

    /// Packs the `[k, n]` matrix `layout` reads from `src` in bf16 (each element
    /// rounded to the nearest bf16, ties to even; NaN stays NaN), on any CPU. Errors
    /// name a layout that is not 2-D or does not fit `src`, an empty matrix, or memory
    /// the system refused.
    ///
    /// Where AMX runs, the panels are AMX tiles (module `tiles`, one `tdpbf16ps`
    /// product per block: the same rounded operands and f32 sums); elsewhere, pairs
    /// for the `vdpbf16ps` tile (module `bf16`). A `k` beyond `tiles::MAX_K` is then
    /// an error too.
    pub fn pack_bf16(src: &[f32], layout: &Layout) -> Result<PackedRhs, KernelError> {
        PackedRhs::pack_bf16_in(src, layout, super::cpu::has_amx_bf16())
    }

    /// [`PackedRhs::pack_bf16`] into AMX tiles when `tiles`, into `vdpbf16ps` pairs
    /// otherwise (the tests take both on any CPU).
    fn pack_bf16_in(src: &[f32], layout: &Layout, tiles: bool) -> Result<PackedRhs, KernelError> {
        let (k, n, rs, cs) = matrix_of("pack_bf16", src, layout)?;
        let (dims, offset) = ((k, n, rs, cs), layout.offset);
        let panels = if tiles {
            Panels::Tiles(tiles::PackedTiles::pack(
                src,
                offset,
                dims,
                tiles::Parts::Hi,
            )?)
        } else {
            Panels::Bf16(bf16::pack(src, offset, dims)?)
        };
        Ok(PackedRhs {
            k,
            n,
            source: (layout.offset, rs, cs),
            panels,
        })
    }

    /// Packs the `[k, n]` matrix `layout` reads from `src` in `dtype` (`BF16` or
    /// `I8`), as the matrix of a contiguous `[k, n]` tensor: the weight `to_dtype`
    /// makes.
    pub fn pack_as(src: &[f32], layout: &Layout, dtype: DType) -> Result<PackedRhs, KernelError> {
        super::cpu::check()?;
        let mut p = match dtype {
            DType::BF16 => PackedRhs::pack_bf16(src, layout)?,
            DType::I8 => PackedRhs::pack_i8(src, layout)?,
            DType::BF16X3 => PackedRhs::pack_bf16x3(src, layout)?,
            _ => {
                return Err(error(
                    "pack",
                    format_args!("weights are not kept in {dtype} (yet)"),
                ))
            }
        };
        p.source = (0, p.n, 1);
        Ok(p)
    }

    /// Quantises the `[k, n]` matrix `layout` reads from `src` to int8 with one scale
    /// per column, on any CPU (module `i8`). Errors name a layout that is not 2-D or
    /// does not fit `src`, an empty matrix, a `k` beyond `i8::MAX_K`, a non-finite
    /// element, or memory the system refused.
    pub fn pack_i8(src: &[f32], layout: &Layout) -> Result<PackedRhs, KernelError> {
        let (k, n, rs, cs) = matrix_of("pack_i8", src, layout)?;
        Ok(PackedRhs {
            k,
            n,
            source: (layout.offset, rs, cs),
            panels: Panels::I8(i8::PackedI8::quantize(src, layout)?),
        })
    }

    /// Packs the `[k, n]` matrix `layout` reads from `src` with each element split
    /// into two bf16 (`hi + lo`, about 16 significant bits), for products taken as
    /// three bf16 products on AMX tiles (module `tiles`; portable loops elsewhere), on
    /// any CPU. Errors name a layout that is not 2-D or does not fit `src`, an empty
    /// matrix, a `k` beyond `tiles::MAX_K`, or memory the system refused.
    pub fn pack_bf16x3(src: &[f32], layout: &Layout) -> Result<PackedRhs, KernelError> {
        let (k, n, rs, cs) = matrix_of("pack_bf16x3", src, layout)?;
        Ok(PackedRhs {
            k,
            n,
            source: (layout.offset, rs, cs),
            panels: Panels::Tiles(tiles::PackedTiles::pack(
                src,
                layout.offset,
                (k, n, rs, cs),
                tiles::Parts::HiLo,
            )?),
        })
    }

    /// The panels, borrowed.
    fn form(&self) -> Form<'_> {
        match &self.panels {
            Panels::F32(d) => Form::F32(d),
            Panels::Bf16(d) => Form::Bf16(d),
            Panels::I8(w) => Form::I8(w),
            Panels::Tiles(w) => Form::Tiles(w),
        }
    }

    /// The element type the matrix is kept in: `F32`, `BF16`, `I8` or `BF16X3`.
    pub fn dtype(&self) -> DType {
        match &self.panels {
            Panels::F32(_) => DType::F32,
            Panels::Bf16(_) => DType::BF16,
            Panels::I8(_) => DType::I8,
            Panels::Tiles(w) => match w.parts() {
                tiles::Parts::Hi => DType::BF16,
                tiles::Parts::HiLo => DType::BF16X3,
            },
        }
    }

    /// The matrix's dims `[k, n]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.k, self.n]
    }

    /// Whether this packs the matrix `layout` reads (after broadcasting to the batch
    /// dims of a product: every batch stride 0), so a product may use it instead.
    pub fn packs(&self, layout: &Layout) -> bool {
        let r = layout.dims.len();
        let (offset, rs, cs) = self.source;
        // A dim of one element reaches no other element, whatever its stride (views
        // and ops may set it to 0): only the strides of longer dims must agree.
        let agrees = |d: usize, s: usize, want: usize| d <= 1 || s == want;
        r >= 2
            && layout.dims[r - 2] == self.k
            && layout.dims[r - 1] == self.n
            && (0..r - 2).all(|i| agrees(layout.dims[i], layout.strides[i], 0))
            && layout.offset == offset
            && agrees(self.k, layout.strides[r - 2], rs)
            && agrees(self.n, layout.strides[r - 1], cs)
    }

    /// The `[k, n]` matrix back in f32, row-major (a bf16 matrix's values exactly, an
    /// int8 one's values times their scales), or `None` when the memory cannot be had.
    pub fn unpack(&self) -> Option<Vec<f32>> {
        let (k, n) = (self.k, self.n);
        if let Panels::I8(w) = &self.panels {
            return w.dequantize();
        }
        let mut out = Vec::new();
        out.try_reserve_exact(k.checked_mul(n)?).ok()?;
        if let Panels::Tiles(w) = &self.panels {
            out.extend((0..k).flat_map(|p| (0..n).map(move |j| w.get(p, j))));
            return Some(out);
        }
        for p in 0..k {
            for j0 in (0..n).step_by(NR) {
                let w = NR.min(n - j0);
                match &self.panels {
                    Panels::F32(data) => {
                        let at = (j0 / NR) * k * NR + p * NR;
                        out.extend_from_slice(&data[at..at + w]);
                    }
                    Panels::I8(_) | Panels::Tiles(_) => unreachable!("unpacked above"),
                    Panels::Bf16(data) => {
                        let at = (j0 / NR) * k.div_ceil(2) * NR + (p / 2) * NR;
                        let half = 16 * (p % 2) as u32;
                        out.extend(
                            data[at..at + w]
                                .iter()
                                .map(|&pair| bf16::to_f32((pair >> half) as u16)),
                        );
                    }
                }
            }
        }
        Some(out)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match &self.panels {
            Panels::F32(d) => d.capacity() * std::mem::size_of::<f32>(),
            Panels::Bf16(d) => d.capacity() * std::mem::size_of::<u32>(),
            Panels::I8(w) => w.bytes(),
            Panels::Tiles(w) => w.bytes(),
        }
    }
}

/// The `[k, n]` matrix that `layout` reads from `src` in f32 panels, whichever tier is
/// in use (`PackedRhs::pack` asks first whether a tile runs; the tests run each tile
/// the CPU has), or `None` as `pack` says.
fn pack_panels(src: &[f32], layout: &Layout) -> Option<PackedRhs> {
    let (k, n, rs, cs) = matrix_of("pack", src, layout).ok()?;
    let panels = n.div_ceil(NR);
    let len = panels.checked_mul(k)?.checked_mul(NR)?;
    let mut data = Vec::new();
    data.try_reserve_exact(len).ok()?;
    data.resize(len, 0.0);
    for (pj, panel) in data.chunks_exact_mut(k * NR).enumerate() {
        let j0 = pj * NR;
        let w = NR.min(n - j0);
        for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
            let base = layout.offset + p * rs + j0 * cs;
            if cs == 1 {
                row[..w].copy_from_slice(&src[base..base + w]);
            } else {
                for (jj, x) in row[..w].iter_mut().enumerate() {
                    *x = src[base + jj * cs];
                }
            }
        }
    }
    Some(PackedRhs {
        k,
        n,
        source: (layout.offset, rs, cs),
        panels: Panels::F32(data),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::*;
    use crate::kernels::Par;

    /// `(m, k, n)` of the products every form is tested on: row counts 1..=2*MR+3
    /// cover every tile height and uneven blocks; widths cover a partial first half, a
    /// partial second half and several panels.
    pub(super) const SHAPES: [(usize, usize, usize); 7] = [
        (1, 1, 1),
        (3, 7, 5),
        (MR, 9, 16),
        (MR + 1, 13, 17),
        (2 * MR + 3, 40, 70),
        (20, 33, 96),
        (60, 5, 31),
    ];

    /// Strided operands of a `(9, 21) x (21, 40)` product in a batch of 3: the right
    /// one stored `[n, k]` (as a PyTorch linear) and read transposed, the left one's
    /// rows at a stride wider than `k` (a narrowed view), at an offset. Returns
    /// `(a, a's layout, b, b's layout)`.
    pub(super) fn strided_operands(rng: &mut Rng) -> (Vec<f32>, Layout, Vec<f32>, Layout) {
        let (m, k, n) = (9, 21, 40);
        let b: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
        let bl = Layout::contiguous(&[n, k]).permute(&[1, 0]);
        let wide = k + 4;
        let a: Vec<f32> = (0..3 * m * wide).map(|_| rng.f32()).collect();
        let al = Layout {
            dims: vec![3, m, k].into(),
            strides: vec![m * wide, wide, 1].into(),
            offset: 2,
        };
        (a, al, b, bl)
    }

    /// The operands of the epilogues the tiles are held to, for an `m × n` product: a
    /// bias of `n` columns and a residual of `m` rows `n + 3` apart from `offset`.
    pub(super) struct EpilogueOperands {
        pub(super) bias: Vec<f32>,
        pub(super) res: Vec<f32>,
        pub(super) offset: usize,
        pub(super) stride: usize,
    }

    impl EpilogueOperands {
        /// Random operands from `rng` (the bias first, then the residual).
        pub(super) fn new(rng: &mut Rng, m: usize, n: usize, offset: usize) -> Self {
            let bias: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            let stride = n + 3;
            let res: Vec<f32> = (0..offset + m * stride).map(|_| rng.f32()).collect();
            EpilogueOperands {
                bias,
                res,
                offset,
                stride,
            }
        }

        /// The residual as a step.
        pub(super) fn rows(&self, sum_first: bool) -> Step<Operand<'_>> {
            let operand = Operand::Rows {
                data: &self.res,
                offset: self.offset,
                stride: self.stride,
            };
            Step::Add { operand, sum_first }
        }

        /// The bias as a step.
        pub(super) fn columns(&self, sum_first: bool) -> Step<Operand<'_>> {
            let operand = Operand::Columns(&self.bias);
            Step::Add { operand, sum_first }
        }

        /// A bias added (the sum first); a bias added the other way round, then GELU;
        /// a bias, a residual, GELU and the residual again (as MiniLM's chains, with
        /// both orders of the operands).
        pub(super) fn epilogues(&self) -> [Vec<Step<Operand<'_>>>; 3] {
            [
                vec![self.columns(true)],
                vec![self.columns(false), Step::Gelu],
                vec![
                    self.columns(true),
                    self.rows(false),
                    Step::Gelu,
                    self.rows(true),
                ],
            ]
        }
    }

    /// `product` (`[m, n]`) followed by `epilogue`, element by element in scalar code.
    pub(super) fn then(product: &[f32], n: usize, epilogue: Epilogue<'_>) -> Vec<f32> {
        product
            .iter()
            .enumerate()
            .map(|(e, &x)| {
                let (i, j) = (e / n, e % n);
                epilogue.iter().fold(x, |acc, s| s.apply_scalar(acc, i, j))
            })
            .collect()
    }

    pub(super) fn naive(a: &[f32], al: &Layout, b: &[f32], bl: &Layout) -> Vec<f32> {
        let r = al.dims.len();
        let (m, k, n) = (al.dims[r - 2], al.dims[r - 1], bl.dims[1]);
        let batch: usize = al.dims[..r - 2].iter().product();
        let mut out = vec![0.0f32; batch * m * n];
        for bi in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0f64;
                    for p in 0..k {
                        let mut idx = vec![0; r];
                        let mut rest = bi;
                        for d in (0..r - 2).rev() {
                            idx[d] = rest % al.dims[d];
                            rest /= al.dims[d];
                        }
                        idx[r - 2] = i;
                        idx[r - 1] = p;
                        acc += at(a, al, &idx) as f64 * at(b, bl, &[p, j]) as f64;
                    }
                    out[(bi * m + i) * n + j] = acc as f32;
                }
            }
        }
        out
    }

    #[test]
    fn matches_naive_for_every_row_count_and_ragged_width() {
        if !PackedRhs::packs_f32() {
            assert!(PackedRhs::pack(&[1.0; 4], &Layout::contiguous(&[2, 2])).is_none());
            return;
        }
        let mut rng = Rng::new(90);
        for (m, k, n) in SHAPES {
            let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
            let al = Layout::contiguous(&[m, k]);
            let bl = Layout::contiguous(&[k, n]);
            let packed = PackedRhs::pack(&b, &bl).unwrap();
            assert!(packed.packs(&bl));
            let want = naive(&a, &al, &b, &bl);
            for threads in [1, 2, 3] {
                let mut out = vec![f32::NAN; m * n];
                matmul_packed(&a, &al, &packed, &mut out, Par { threads }).unwrap();
                assert_close(&out, &want, 1e-5);
            }
        }
    }

    #[test]
    fn strided_operands_batches_and_refusals() {
        if !PackedRhs::packs_f32() {
            return;
        }
        let mut rng = Rng::new(91);
        let (a, al, b, bl) = strided_operands(&mut rng);
        let (m, k, n) = (9, 21, 40);
        let packed = PackedRhs::pack(&b, &bl).unwrap();
        // The product's layout of rhs as the engine hands it: broadcast over the batch.
        let bb = bl.broadcast_as(&[3, k, n]).unwrap();
        assert!(packed.packs(&bb));
        assert!(!packed.packs(&Layout::contiguous(&[k, n])));
        let want = naive(&a, &al, &b, &bl);
        let mut out = vec![f32::NAN; 3 * m * n];
        matmul_packed(&a, &al, &packed, &mut out, Par { threads: 2 }).unwrap();
        assert_close(&out, &want, 1e-5);
        // A transposed lhs (column stride m) and a single row (stride of no use).
        let at_ = Layout::contiguous(&[k, m]).permute(&[1, 0]);
        let want = naive(&a, &at_, &b, &bl);
        for threads in [1, 2] {
            let mut out = vec![f32::NAN; m * n];
            matmul_packed(&a, &at_, &packed, &mut out, Par { threads }).unwrap();
            assert_close(&out, &want, 1e-5);
        }
        let row = Layout {
            dims: vec![1, k].into(),
            strides: vec![1000, 2].into(),
            offset: 1,
        };
        let want = naive(&a, &row, &b, &bl);
        let mut out1 = vec![f32::NAN; n];
        matmul_packed(&a, &row, &packed, &mut out1, Par::serial()).unwrap();
        assert_close(&out1, &want, 1e-5);
        // The same in bf16 (the rows of `a` rounded per call, except on the AVX2 tile):
        // close to the product of the rounded operands.
        let packed16 = PackedRhs::pack_bf16(&b, &bl).unwrap();
        assert!(packed16.packs(&bb) && packed16.dtype() == DType::BF16);
        let a16 = rounded_left(&a, packed16.form());
        let want16 = naive(&a16, &al, &rounded(&b), &bl);
        let mut out = vec![f32::NAN; 3 * m * n];
        matmul_packed(&a, &al, &packed16, &mut out, Par { threads: 2 }).unwrap();
        assert_close(&out, &want16, 1e-5);
        // A wrong k or dst size is an error.
        let e = matmul_packed(
            &a,
            &Layout::contiguous(&[m, k + 1]),
            &packed,
            &mut out,
            Par::serial(),
        );
        assert!(e.is_err());
        assert!(matmul_packed(
            &a,
            &Layout::contiguous(&[m, k]),
            &packed,
            &mut out,
            Par::serial()
        )
        .is_err());
        // A layout that does not fit its buffer is an error, not a read past it.
        assert!(matmul_packed(&a[..5], &al, &packed, &mut out, Par::serial()).is_err());
        // Layouts that do not fit are not packed.
        assert!(PackedRhs::pack(&b[..10], &bl).is_none());
        assert!(PackedRhs::pack(&b, &Layout::contiguous(&[n * k])).is_none());
        assert!(PackedRhs::pack_bf16(&b[..10], &bl).is_err());
        let e = PackedRhs::pack_bf16(&b, &Layout::contiguous(&[n * k])).unwrap_err();
        assert!(e.to_string().contains("matrix [k, n]"), "{e}");
        assert!(PackedRhs::pack_bf16(&[], &Layout::contiguous(&[0, 3])).is_err());
    }

    /// The values of `x` rounded to bf16, as f32.
    fn rounded(x: &[f32]) -> Vec<f32> {
        x.iter().map(|&v| bf16::to_f32(bf16::round(v))).collect()
    }

    /// The left operand `a` as `form`'s instruction-set path multiplies it: rounded to
    /// bf16 (AMX tiles, `vdpbf16ps`, the portable loops) or not (the AVX2 bf16 tile).
    fn rounded_left(a: &[f32], form: Form<'_>) -> Vec<f32> {
        match form {
            Form::Bf16(_) if !bf16::rounds_left(form.simd()) => a.to_vec(),
            _ => rounded(a),
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan_and_infinities() {
        for (x, want) in [
            (1.0f32, 0x3f80u16),
            (f32::from_bits(0x3f80_8000), 0x3f80), // a tie, to even
            (f32::from_bits(0x3f81_8000), 0x3f82), // a tie, to even (up)
            (f32::from_bits(0x3f80_8001), 0x3f81),
            (f32::INFINITY, 0x7f80),
            (f32::NEG_INFINITY, 0xff80),
            (f32::MAX, 0x7f80), // rounds up to infinity, as it must
            (-0.0, 0x8000),
        ] {
            assert_eq!(bf16::round(x), want, "{x:e}");
        }
        assert!(bf16::to_f32(bf16::round(f32::NAN)).is_nan());
        // A NaN whose payload is only in the low half stays a NaN.
        assert!(bf16::to_f32(bf16::round(f32::from_bits(0x7f80_0001))).is_nan());
        for v in [0.1f32, -3.7, 1e-20, 6.5e4] {
            let r = bf16::to_f32(bf16::round(v));
            assert!((r - v).abs() <= v.abs() * 2f32.powi(-8), "{v} -> {r}");
        }
    }

    #[test]
    fn bf16_matches_the_rounded_product_on_every_path() {
        let mut rng = Rng::new(92);
        // SHAPES, and shapes with whole and partial AMX row tiles, blocks and panels.
        let more = [(16, 32, 32), (33, 65, 33), (100, 130, 70)];
        for (m, k, n) in SHAPES.into_iter().chain(more) {
            let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
            let al = Layout::contiguous(&[m, k]);
            let bl = Layout::contiguous(&[k, n]);
            let want = naive(&rounded(&a), &al, &rounded(&b), &bl);
            let exact = naive(&a, &al, &b, &bl);
            // Both packings, whatever this CPU runs: `vdpbf16ps` pairs and AMX tiles.
            for in_tiles in [false, true] {
                let packed = PackedRhs::pack_bf16_in(&b, &bl, in_tiles).unwrap();
                assert_eq!(packed.dtype(), DType::BF16);
                // The packed values are the rounded ones, exactly.
                assert_eq!(packed.unpack().unwrap(), rounded(&b));
                let mut portable = vec![f32::NAN; m * n];
                let (form, dims) = (packed.form(), (k, n));
                product(
                    &a,
                    &al,
                    dims,
                    (form, false),
                    &[],
                    None,
                    &mut portable,
                    Par::serial(),
                )
                .unwrap();
                assert_close(&portable, &want, 1e-5);
                let tier_want = naive(&rounded_left(&a, form), &al, &rounded(&b), &bl);
                for threads in [1, 2, 3] {
                    let mut out = vec![f32::NAN; m * n];
                    matmul_packed(&a, &al, &packed, &mut out, Par { threads }).unwrap();
                    assert_close(&out, &tier_want, 1e-5);
                    // The stated bound against the f32 product: 2 · 2⁻⁸ · Σ|a·b| (plus
                    // f32 rounding of the sums).
                    for i in 0..m {
                        for j in 0..n {
                            let mag: f32 =
                                (0..k).map(|p| (a[i * k + p] * b[p * n + j]).abs()).sum();
                            let err = (out[i * n + j] - exact[i * n + j]).abs();
                            assert!(
                                err <= 2.0 * 2f32.powi(-8) * mag + 1e-6,
                                "{err} > bound for {mag}"
                            );
                        }
                    }
                }
                if form.simd() && rounded_left(&a, form) != a {
                    // Both paths take the same exact products and sum them in f32 in
                    // nearly the same order: they agree to the last bit or two.
                    let mut simd = vec![f32::NAN; m * n];
                    matmul_packed(&a, &al, &packed, &mut simd, Par::serial()).unwrap();
                    assert_close(&simd, &portable, 1e-6);
                }
            }
        }
    }
}
