//! bf16 panels: the packed format, rounding, the walk of a part, and which tile runs.
//!
//! **Format.** A bf16 is the top half of an f32 (sign, the 8 exponent bits, 7 mantissa
//! bits), so widening is exact (`bits << 16`) and a product of two bf16 is exact in
//! f32. A panel holds [`NR`] columns of `ceil(k / 2)` **pairs**: the `u32` at `q * NR +
//! j` holds rows `2q` (low half) and `2q + 1` (high half, zero past `k`) of column
//! `j`, the operand layout of `vdpbf16ps`. Every tile reads this one format.
//!
//! **Tiles, by tier** ([`Kernel`]):
//!
//! - AVX512_BF16 (without AMX, whose tiles are module `tiles`'): `vdpbf16ps`, 14 × 32
//!   (module `avx512`). It multiplies 16 pairs of bf16 from each operand and adds both
//!   products of a pair into one f32 lane, so the **left operand is rounded to bf16**
//!   too: a chunk of rows at a time, into a scratch on the stack (no allocation,
//!   whichever thread runs the product), each chunk multiplied by every panel of the
//!   thread's part.
//! - AVX2 with FMA and no AVX-512 (the `avx2` and `avx2-vnni` tiers): 6 rows × 16
//!   columns, the panel's
//!   two halves one after the other, each pair **widened to f32 in registers** (module
//!   `avx2`), multiplied by the left rows **kept in f32** and read in place, as the
//!   f32 tile reads them; the chain's epilogue applied before the store (the f32
//!   AVX2 tile's `finish`). Its sums are the f32 AVX2 tile's over the widened weight,
//!   bit for bit (one fused multiply-add per element of `k`, in the order of `k`), so
//!   the results are those of f32 weights rounded to bf16: what the model ran on this
//!   tier before, at f32's speed.
//! - aarch64 with the bf16 instructions (FEAT_BF16, tier `neon-i8mm` where present):
//!   `bfmmla` (module `neon`), a 2 × 4 by 4 × 2 product of bf16 into 2 × 2 f32 sums,
//!   on the left rows **rounded to bf16** as for `vdpbf16ps`, with the epilogue.
//! - aarch64 without them (any NEON CPU): the pairs **widened to f32 in registers**
//!   (module `neon`), the left rows in f32, with the epilogue: the f32 NEON tile's
//!   sums over the widened weight, bit for bit, as on AVX2. Not timed on hardware: it
//!   has the f32 tile's multiply-adds and 8 more instructions per 40 of them, for
//!   half the weight's bytes, so the models keep such weights in f32 there (the same
//!   results: f32 weights rounded to bf16 on the f32 tile; `models::Precision::fast_here`).
//! - AVX-512 without AVX512_BF16 (the `avx512` tier: Skylake-SP, Cascade Lake, Zen 4
//!   without it): each panel **widened once into an f32 copy** on the stack, then the
//!   f32 AVX-512 tile (14 × 32) over it with the chain's epilogue, the left rows in
//!   f32. The results are the f32 AVX-512 tile's over the widened weight, bit for bit:
//!   those of f32 weights rounded to bf16. The weight streams in half the bytes and the
//!   widening costs two instructions per 16 weights, once per panel, beside 14 rows of
//!   fused multiply-adds on each.
//! - elsewhere (`portable`): portable loops over the pairs by the rounded left rows,
//!   in `vdpbf16ps`'s order (module `portable`); the models keep such weights in f32
//!   there (`models::Precision::fast_here`).
//!
//! On the AVX2 tier a part of many rows ([`WIDE_PANEL_ROWS`]) widens each panel once
//! into an f32 copy on the stack and runs the f32 AVX2 tile over it instead (the same
//! bits, with the epilogue): measured, the copy wins there and the registers win for
//! fewer rows (see the constant).
//!
//! **Accuracy.** A product with the left operand rounded (`vdpbf16ps`, `bfmmla`,
//! portable): each operand errs by at most 2⁻⁸ relative, the products are exact and
//! the sums f32, so a product of `k` terms stays within `2 · 2⁻⁸ · Σ|a·b|` (plus f32
//! rounding of the sums) of the f32 product. With the left operand kept in f32 (AVX2,
//! NEON widened): within `2⁻⁸ · Σ|a·b|` plus the same. `bfmmla` rounds its sums its
//! own way (module `neon`: to odd, twice per pair, within `kp · 2⁻²² · Σ|ã·b̃|` of the
//! exact sum of the rounded operands' products). The tests hold all three.

mod portable;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;
mod widen;

#[cfg(target_arch = "x86_64")]
use super::by_rows;

use super::f32::{check_epilogue, AVX2_ROWS};
use super::{chunk_rows, with_stack, Cols, Epilogue, Matrix, Out, Part, MR, NR};
use crate::kernels::{error, KernelError};
use widen::in_f32;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use widen::Wide;

/// `x` rounded to the nearest bf16 (ties to even); NaN stays a (quiet) NaN.
pub(super) fn round(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of a bf16 (exact).
pub(super) fn to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// The pair of rows `lo` and `hi` of one column as a `vdpbf16ps` operand.
fn pair(lo: f32, hi: f32) -> u32 {
    round(lo) as u32 | (round(hi) as u32) << 16
}

/// The panels of the `[k, n]` matrix at `offset` with strides `(rs, cs)` in `src`
/// (which the caller checked it fits), in bf16 pairs.
pub(super) fn pack(
    src: &[f32],
    offset: usize,
    (k, n, rs, cs): (usize, usize, usize, usize),
) -> Result<Vec<u32>, KernelError> {
    let kp = k.div_ceil(2);
    let per_panel = kp
        .checked_mul(NR)
        .ok_or_else(|| error("pack_bf16", "the packed size overflows"))?;
    let mut data = super::zeroed_pairs("pack_bf16", n.div_ceil(NR), per_panel)?;
    for (pj, panel) in data.chunks_exact_mut(kp * NR).enumerate() {
        let j0 = pj * NR;
        for (q, row) in panel.chunks_exact_mut(NR).enumerate() {
            for (jj, x) in row[..NR.min(n - j0)].iter_mut().enumerate() {
                let at = offset + 2 * q * rs + (j0 + jj) * cs;
                let hi = if 2 * q + 1 < k { src[at + rs] } else { 0.0 };
                *x = pair(src[at], hi);
            }
        }
    }
    Ok(data)
}

/// The loop that multiplies a part: one a tier (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// Loops over the pairs by the rounded left rows, in the compiler's code for the
    /// build target.
    Portable,
    /// The AVX2 + FMA tile: 6 rows × 16 columns, pairs widened in registers, the left
    /// rows in f32, with the epilogue.
    Avx2,
    /// The `vdpbf16ps` tile (AVX512_BF16): 14 × 32, on the pairs as they are.
    Dpbf16,
    /// AVX-512F without AVX512_BF16: each panel widened into an f32 copy, then the f32
    /// AVX-512 tile (14 × 32) with the epilogue, the left rows in f32.
    Widened512,
    /// The NEON tile: up to 5 rows × 16 columns a block, pairs widened in registers,
    /// the left rows in f32, with the epilogue.
    Neon,
    /// The `bfmmla` tile (aarch64's FEAT_BF16): up to 6 rows × 16 columns a block, on
    /// the pairs as they are and the left rows rounded, with the epilogue.
    Bfmmla,
}

impl Kernel {
    /// The kernel of the tier in use, or the portable loops when `simd` is false.
    ///
    /// On aarch64 `bfmmla` where the CPU has it (its 16 multiply-adds an instruction
    /// against `fmla`'s 4; `bfdot`, 8, would take the same rounded rows), else the
    /// widened NEON tile.
    fn chosen(simd: bool) -> Kernel {
        use crate::kernels::cpu;
        if !simd {
            Kernel::Portable
        } else if cpu::has_avx512_bf16() {
            Kernel::Dpbf16
        } else if cpu::has_avx512() {
            Kernel::Widened512
        } else if cpu::has_avx2() {
            Kernel::Avx2
        } else if cpu::has_arm_bf16() {
            Kernel::Bfmmla
        } else if cpu::has_neon() {
            Kernel::Neon
        } else {
            Kernel::Portable
        }
    }

    /// Whether this CPU has the instructions the kernel uses, whatever tier is forced:
    /// what its `unsafe` calls rely on (asserted before them), and what the tests ask
    /// before they run a kernel directly.
    fn runs_here(self) -> bool {
        use crate::kernels::cpu::{cpu_has_arm_bf16, cpu_runs, has_avx512_bf16, Tier};
        match self {
            Kernel::Portable => true,
            Kernel::Avx2 => cfg!(target_arch = "x86_64") && cpu_runs(Tier::Avx2),
            Kernel::Dpbf16 => has_avx512_bf16(),
            Kernel::Widened512 => cfg!(target_arch = "x86_64") && cpu_runs(Tier::Avx512),
            Kernel::Neon => cfg!(target_arch = "aarch64") && cpu_runs(Tier::Neon),
            Kernel::Bfmmla => cfg!(target_arch = "aarch64") && cpu_has_arm_bf16(),
        }
    }

    /// Whether the kernel multiplies the left rows in f32, the pairs widened (the AVX2
    /// and NEON tiles, and the AVX-512 one on panels widened into a copy), rather than
    /// rounded to bf16 pairs.
    fn widens(self) -> bool {
        matches!(self, Kernel::Avx2 | Kernel::Widened512 | Kernel::Neon)
    }

    /// The most rows of one tile of a widening kernel.
    fn wide_rows(self) -> usize {
        match self {
            Kernel::Avx2 => AVX2_ROWS,
            _ => MR,
        }
    }
}

/// Whether the tier in use runs a vector tile for bf16 (see [`Kernel`]).
pub(super) fn simd() -> bool {
    Kernel::chosen(true) != Kernel::Portable
}

/// Whether the tile [`part`] runs (for `simd`) applies an [`Epilogue`]: all but the
/// portable loops and `vdpbf16ps`.
pub(super) fn takes_epilogue(simd: bool) -> bool {
    !matches!(Kernel::chosen(simd), Kernel::Portable | Kernel::Dpbf16)
}

/// The name of the tile [`part`] runs here (for `simd`), for plan listings.
pub(super) fn tile_name(simd: bool) -> &'static str {
    match Kernel::chosen(simd) {
        Kernel::Portable => "portable",
        Kernel::Avx2 => "avx2 6x16 widening",
        Kernel::Dpbf16 => "avx512 vdpbf16ps 14x32",
        Kernel::Widened512 => "avx512 14x32 on widened panels",
        Kernel::Neon => "neon widening",
        Kernel::Bfmmla => "neon bfmmla",
    }
}

/// The rows of one tile of the tier in use (a split by rows cuts at multiples of it).
pub(super) fn tile_rows() -> usize {
    match Kernel::chosen(simd()) {
        Kernel::Avx2 => AVX2_ROWS,
        _ => MR,
    }
}

/// Whether the path [`part`] runs for `simd` rounds the left operand to bf16 (all
/// but the widening tiles'), for the tests' reference.
#[cfg(test)]
pub(super) fn rounds_left(simd: bool) -> bool {
    !Kernel::chosen(simd).widens()
}

/// Most elements of the stack scratch that holds one chunk of rows, in bf16 pairs or
/// (strided rows copied for the AVX2 tile) in f32: 64 KiB.
pub(super) const SCRATCH: usize = 16 << 10;

/// Computes `part` of the product of `g` by the bf16 panels `data`, followed by
/// `epilogue` (which must be empty unless [`takes_epilogue`]), on the tile of the
/// tier in use when `simd` (else the portable loops).
pub(super) fn part(
    g: Matrix<'_>,
    data: &[u32],
    epilogue: Epilogue<'_>,
    part: Part,
    simd: bool,
    out: Out,
) {
    let job = Job {
        kernel: Kernel::chosen(simd),
        data,
        epilogue,
        out,
    };
    part_on(job, g, part)
}

/// What every part of a product by bf16 panels shares: the kernel that multiplies, the
/// panels, the epilogue and the output.
#[derive(Clone, Copy)]
struct Job<'a> {
    kernel: Kernel,
    data: &'a [u32],
    epilogue: Epilogue<'a>,
    out: Out,
}

/// [`part`] on `job.kernel` (which this CPU must run: asserted).
fn part_on(job: Job<'_>, g: Matrix<'_>, part: Part) {
    let kernel = job.kernel;
    assert!(
        kernel.runs_here(),
        "the bf16 {kernel:?} tile cannot run here"
    );
    // (`tile` asserts that only `bfmmla` of the pairs' tiles gets an epilogue.)
    if kernel.widens() {
        in_f32(job, g, part)
    } else {
        in_pairs(job, g, part)
    }
}

/// [`part`] for the tiles that read the left rows as pairs: a chunk of rows at a time
/// (as many as the stack scratch holds, whole tiles), each chunk rounded to bf16 once
/// and multiplied by every panel of the part, then the epilogue (`bfmmla` only).
fn in_pairs(job: Job<'_>, g: Matrix<'_>, part: Part) {
    let (kernel, data, epilogue, out) = (job.kernel, job.data, job.epilogue, job.out);
    let kp = g.k.div_ceil(2);
    let (first, end) = part.rows;
    let chunk = chunk_rows(end - first, kp, SCRATCH);
    with_stack(chunk * kp, |scratch: &mut [u32]| {
        let mut c0 = first;
        while c0 < end {
            let rows = chunk.min(end - c0);
            let buf = &mut scratch[..rows * kp];
            for (i, dst) in buf.chunks_exact_mut(kp).enumerate() {
                round_row(g, c0 + i, kernel, dst);
            }
            let buf = &*buf;
            for pj in part.panels.0..part.panels.1 {
                let b = &data[pj * kp * NR..(pj + 1) * kp * NR];
                let at = part.cols(pj);
                Part::blocks(c0, rows, |r0, h| {
                    let t = Tile {
                        a: &buf[(r0 - c0) * kp..(r0 - c0 + h) * kp],
                        kp,
                        b,
                        at,
                        row0: r0,
                        epilogue,
                    };
                    tile(&t, h, kernel, out.skip(r0 * part.n));
                });
            }
            c0 += rows;
        }
    });
}

/// Rounds row `i` of `g` to bf16 pairs in `dst` (`ceil(k / 2)` of them).
fn round_row(g: Matrix<'_>, i: usize, kernel: Kernel, dst: &mut [u32]) {
    let row = &g.a[i * g.lda..];
    #[cfg(target_arch = "x86_64")]
    if g.cs == 1 && kernel == Kernel::Dpbf16 {
        assert!(crate::kernels::cpu::has_avx512_bf16() && dst.len() == g.k.div_ceil(2));
        // SAFETY: the CPU has AVX512_BF16 (asserted); the row's k elements are
        // `row[..k]` (cs == 1, and `g.a` ends at the last element of the last row, so
        // every row has k elements), and `dst` holds ceil(k / 2) pairs (asserted).
        unsafe { avx512::round_row(&row[..g.k], dst) };
        return;
    }
    let _ = kernel;
    for (q, x) in dst.iter_mut().enumerate() {
        let hi = if 2 * q + 1 < g.k {
            row[(2 * q + 1) * g.cs]
        } else {
            0.0
        };
        *x = pair(row[2 * q * g.cs], hi);
    }
}

/// One tile's operands on the pairs: rows of bf16 pairs (`kp` each, contiguous) and
/// the panel `b` (`kp` rows of [`NR`] pairs), where the results go (`at`; the tile's
/// first row is row `row0` of the product) and what happens to them before (empty
/// but for `bfmmla`).
struct Tile<'a> {
    a: &'a [u32],
    kp: usize,
    b: &'a [u32],
    at: Cols,
    row0: usize,
    epilogue: Epilogue<'a>,
}

/// `dst[i][j0..j0 + width] = a[i] · b`, then the epilogue, for the tile's `rows` rows,
/// on `kernel` (the portable loops, `vdpbf16ps` or `bfmmla`).
fn tile(t: &Tile<'_>, rows: usize, kernel: Kernel, dst: Out) {
    let w = t.at;
    // The bounds every access below relies on, checked once.
    assert!((1..=MR).contains(&rows) && w.width >= 1 && w.width <= NR);
    assert!(t.kp >= 1 && t.b.len() >= t.kp * NR && t.a.len() >= rows * t.kp);
    assert!(dst.len >= (rows - 1) * w.ldc + w.j0 + w.width);
    check_epilogue(t.epilogue, w, t.row0 + rows);
    assert!(
        t.epilogue.is_empty() || kernel == Kernel::Bfmmla,
        "the bf16 {kernel:?} tile takes no epilogue"
    );
    #[cfg(target_arch = "aarch64")]
    if kernel == Kernel::Bfmmla {
        assert!(kernel.runs_here(), "this CPU has no bfmmla");
        // SAFETY: the CPU has FEAT_BF16 (asserted), the asserts above are the bounds
        // `neon::mmla_tile` documents, and this tile's elements of `dst` are written
        // by no one else (see `Out`).
        return unsafe { neon::mmla_tile(t, rows, dst.ptr) };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Dpbf16 {
        assert!(crate::kernels::cpu::has_avx512_bf16());
        macro_rules! call {
            ($r:literal) => {
                // SAFETY: AVX512_BF16 is present (asserted) and the asserts above are
                // the bounds `avx512::tile` documents; this tile's elements of `dst`
                // are written by no one else (see `Out`).
                unsafe { avx512::tile::<$r>(t, dst.ptr) }
            };
        }
        return by_rows!(rows, call!());
    }
    let _ = kernel;
    portable::tile(t, rows, dst)
}

#[cfg(test)]
mod tests;
