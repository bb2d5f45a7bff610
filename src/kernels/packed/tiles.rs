//! Panels in AMX tiles: bf16 products (one per product, `DType::BF16`) and f32
//! products as three bf16 products (`DType::BF16X3`), on AMX.
//!
//! **bf16x3.** An f32 `x` is split into two bf16: `hi = bf16(x)` and `lo = bf16(x - hi)` (the
//! subtraction is exact), so `hi + lo` keeps about 16 significant bits of `x`'s 24. A
//! product `a · b` is then taken as `a_hi·b_hi + a_hi·b_lo + a_lo·b_hi`: each term is
//! exact in f32 and the sums are f32; the dropped `a_lo·b_lo` and the two splits'
//! residues are each at most `2⁻¹⁶·|a·b|`. A `k`-term product stays within
//! `2⁻¹⁴ · Σ|a·b|` (plus f32 rounding of the sums) of the f32 product: about a
//! hundred times the f32 product's own rounding, and five hundred times closer than a
//! bf16 product (the tests hold it there; all-MiniLM-L6-v2's embeddings keep a cosine
//! of 0.99999 to the float64 reference, `tests/minilm.rs`).
//!
//! **bf16.** The same panels holding only `hi` ([`Parts::Hi`]): each operand rounded
//! to the nearest bf16 and one product, `a_hi·b_hi`, exactly what the `vdpbf16ps`
//! tile of module `bf16` computes (within `2 · 2⁻⁸ · Σ|a·b|` of the f32 product), in a
//! third of bf16x3's tile work and half its bytes. `PackedRhs::pack_bf16` packs here
//! where AMX runs, for `vdpbf16ps` elsewhere.
//!
//! **Why.** An AMX tile multiply (`tdpbf16ps`) does 16 × 16 × 32 bf16 multiply-adds
//! in about 16 cycles: sixteen times what the f32 tile's two AVX-512 FMAs do in that
//! time. Three of them still leave the f32 tile far behind, wherever the operands come
//! from the caches fast enough (module docs of `packed` for the measured rates).
//!
//! **Layout.** A panel of [`NR`] = 32 columns is cut into blocks of [`KB`] = 32 rows of
//! `k`; a block holds four AMX tiles of 16 × 16 pairs (1 KiB each, contiguous): the
//! `hi` halves of columns 0-15, of columns 16-31, then the `lo` halves of both (two
//! tiles, `hi` only, for bf16). Tile
//! row `r` of block `kb` holds, for each of its 16 columns, rows `2q` (low half) and
//! `2q + 1` of that column, `q = 16·kb + r`: the pair layout `tdpbf16ps` takes for its
//! second operand. `k` and `n` are padded with zeros to whole blocks and panels. The
//! left operand is split the same way into a scratch on the stack, a chunk of rows at
//! a time, in tiles of 16 rows × 32 `k` (`hi` then `lo`, 1 KiB each; `hi` only for
//! bf16), rows past `m` zero.
//!
//! **The tile.** Four accumulators cover 32 rows × 32 columns; per block, ten tile
//! loads (two row tiles and two column tiles in `hi`, both column tiles again in
//! `lo`, then the rows in `lo` and the columns in `hi` once more: eight tile registers
//! in all) feed twelve `tdpbf16ps`; for bf16, four tile loads feed four. The
//! instructions are written in `asm!`: stable Rust
//! has no AMX intrinsics. Without AMX (or with `STREAMFUSE_PORTABLE=1`) portable loops
//! compute the same three products in f32.

use std::mem::MaybeUninit;

use super::{with_stack_uninit, Matrix, Out, Part, NR};
use crate::kernels::{error, KernelError};

/// Rows of `k` in one block of a panel (one tile row: 32 bf16).
pub(super) const KB: usize = 32;
/// Rows of one AMX tile of the left operand or of the output.
const TR: usize = 16;
/// Pairs in one tile (16 rows of 64 bytes).
const TILE: usize = 256;
/// Rows of the left operand multiplied per call of the tile (two row tiles).
pub(super) const ROWS: usize = 2 * TR;

/// The largest `k` of a bf16x3 matrix: 32 rows of its left operand, split, fill the
/// largest stack scratch (`with_stack`), and a product takes them 32 at a time.
pub(super) const MAX_K: usize = 8192;

/// The bf16 split of `x`: `(hi, lo)` with `hi = bf16(x)`, `lo = bf16(x - hi)`; a
/// non-finite `hi` (an infinity, a NaN, or a value beyond bf16's largest finite) has
/// `lo = 0`. So a NaN operand makes its products NaN, as in f32; an infinite one makes
/// them infinite or NaN (NaN where the other operand's `lo` is zero: `0 · ∞`), where
/// the f32 product is infinite.
pub(super) fn split(x: f32) -> (u16, u16) {
    let hi = super::bf16::round(x);
    let h = super::bf16::to_f32(hi);
    if !h.is_finite() {
        return (hi, 0);
    }
    (hi, super::bf16::round(x - h))
}

/// Which bf16 parts of each element a matrix in tiles keeps, and so how many
/// products a product takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Parts {
    /// `hi` only: each element rounded to bf16, one product (`DType::BF16`).
    Hi,
    /// `hi` and `lo`: about 16 significant bits, three products (`DType::BF16X3`).
    HiLo,
}

impl Parts {
    /// Tiles per element's parts: 1 or 2.
    fn count(self) -> usize {
        match self {
            Parts::Hi => 1,
            Parts::HiLo => 2,
        }
    }

    /// Pairs in one block of a panel: two column tiles per part.
    fn block(self) -> usize {
        2 * self.count() * TILE
    }

    /// The name of the packing, for errors.
    fn packing(self) -> &'static str {
        match self {
            Parts::Hi => "pack_bf16",
            Parts::HiLo => "pack_bf16x3",
        }
    }
}

/// The panels of a `[k, n]` matrix in AMX tiles, bf16 or bf16x3.
#[derive(Debug)]
pub(super) struct PackedTiles {
    /// `ceil(n / NR)` panels of `blocks` blocks of `parts.block()` pairs.
    data: Vec<u32>,
    /// Blocks per panel: `ceil(k / KB)`.
    blocks: usize,
    parts: Parts,
}

impl PackedTiles {
    /// Packs the `[k, n]` matrix at `offset` with strides `(rs, cs)` in `src` (which
    /// the caller checked it fits), keeping `parts` of each element.
    pub(super) fn pack(
        src: &[f32],
        offset: usize,
        (k, n, rs, cs): (usize, usize, usize, usize),
        parts: Parts,
    ) -> Result<PackedTiles, KernelError> {
        if k > MAX_K {
            return Err(error(
                parts.packing(),
                format_args!("k = {k} exceeds {MAX_K}, the most a product in tiles takes"),
            ));
        }
        let blocks = k.div_ceil(KB);
        let size = parts.block();
        let mut data = super::zeroed_pairs(parts.packing(), n.div_ceil(NR), blocks * size)?;
        for (pj, panel) in data.chunks_exact_mut(blocks * size).enumerate() {
            for (kb, block) in panel.chunks_exact_mut(size).enumerate() {
                // Each element split once: its `hi` to tile `c`, its `lo` (bf16x3) to
                // `2 + c`.
                let (hi, lo) = block.split_at_mut(2 * TILE);
                for t in 0..2 {
                    for r in 0..16 {
                        let p = 2 * (kb * 16 + r);
                        for jj in 0..16 {
                            let j = pj * NR + t * 16 + jj;
                            if j >= n {
                                break;
                            }
                            let at = |p: usize| {
                                if p < k {
                                    split(src[offset + p * rs + j * cs])
                                } else {
                                    (0, 0)
                                }
                            };
                            let (e0, e1) = (at(p), at(p + 1));
                            let x = t * TILE + 16 * r + jj;
                            hi[x] = e0.0 as u32 | (e1.0 as u32) << 16;
                            if parts == Parts::HiLo {
                                lo[x] = e0.1 as u32 | (e1.1 as u32) << 16;
                            }
                        }
                    }
                }
            }
        }
        Ok(PackedTiles {
            data,
            blocks,
            parts,
        })
    }

    /// Which parts of each element the matrix keeps.
    pub(super) fn parts(&self) -> Parts {
        self.parts
    }

    /// Element `(p, j)` of the matrix: `hi + lo` (exact in f32), or `hi`.
    pub(super) fn get(&self, p: usize, j: usize) -> f32 {
        let (pj, c, jj) = (j / NR, (j % NR) / 16, j % 16);
        let (kb, r, half) = (p / KB, (p % KB) / 2, 16 * (p % 2) as u32);
        let block = (pj * self.blocks + kb) * self.parts.block();
        let at = |h: usize| {
            let pair = self.data[block + (2 * h + c) * TILE + r * 16 + jj];
            super::bf16::to_f32((pair >> half) as u16)
        };
        match self.parts {
            Parts::Hi => at(0),
            Parts::HiLo => at(0) + at(1),
        }
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.data.capacity() * std::mem::size_of::<u32>()
    }
}

/// Most pairs of the stack scratch that holds one chunk of the left operand's rows,
/// split (512 KiB: with a panel, it stays in L2).
const SCRATCH: usize = 128 << 10;

/// Computes `part` of the product of `g` by `w`: its rows a chunk at a time (as many
/// whole pairs of row tiles as the stack scratch holds), each chunk split once and
/// multiplied by every panel of the part.
pub(super) fn part(g: Matrix<'_>, w: &PackedTiles, part: Part, simd: bool, out: Out) {
    let (first, end) = part.rows;
    // Pairs per row of the split operand: KB / 2 per block and part.
    let per_row = w.blocks * w.parts.count() * KB / 2;
    let fit = (SCRATCH / per_row / ROWS).max(1) * ROWS;
    let chunk = fit.min((end - first).next_multiple_of(ROWS));
    #[cfg(target_arch = "x86_64")]
    let regs = simd.then(|| {
        assert!(crate::kernels::cpu::has_amx_bf16());
        // SAFETY: AMX is granted (asserted).
        unsafe { amx::Tiles::configure() }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let regs: Option<()> = None;
    // The rows a tile cannot store in place, cleared once per part.
    let mut buf = [0.0f32; ROWS * NR];
    with_stack_uninit(chunk * per_row, |scratch| {
        let mut c0 = first;
        while c0 < end {
            let rows = chunk.min(end - c0);
            let tiles = rows.div_ceil(TR);
            let a = &mut scratch[..tiles.next_multiple_of(2) * TR * per_row];
            let a = split_rows(g, (c0, rows), (w.blocks, w.parts), simd, a);
            let size = w.blocks * w.parts.block();
            for pj in part.panels.0..part.panels.1 {
                let b = &w.data[pj * size..(pj + 1) * size];
                let at = part.cols(pj);
                for t in (0..tiles).step_by(2) {
                    let h = (rows - t * TR).min(ROWS);
                    let r0 = c0 + t * TR;
                    let a = &a[t * TR * per_row..(t + 2) * TR * per_row];
                    let dst = Dst {
                        out: out.skip(r0 * part.n + at.j0),
                        rows: h,
                        width: at.width,
                        ldc: at.ldc,
                    };
                    tile(a, b, (w.blocks, w.parts), regs.as_ref(), dst, &mut buf);
                }
            }
            c0 += rows;
        }
    });
}

/// The tile registers' configuration where AMX runs (`()` stands in elsewhere).
#[cfg(target_arch = "x86_64")]
type Regs = amx::Tiles;
#[cfg(not(target_arch = "x86_64"))]
type Regs = ();

/// Splits `rows.1` rows of `g` from row `rows.0` into `a` (its `parts`) and returns
/// it, every element written: row tile `t`, block `kb` at `((t · blocks + kb) · count
/// + part) · TILE` (`count` = `parts.count()`), row `r` of the tile at `+ 16 r`. Rows
/// past the count and `k` past the matrix are zero.
fn split_rows<'s>(
    g: Matrix<'_>,
    (r0, rows): (usize, usize),
    (blocks, parts): (usize, Parts),
    simd: bool,
    a: &'s mut [MaybeUninit<u32>],
) -> &'s [u32] {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    let count = parts.count();
    let per_row = blocks * count * KB / 2;
    let per_tile = blocks * count * TILE;
    assert!(a.len().is_multiple_of(2 * TR * per_row) && rows <= a.len() / per_row);
    // The rows past the count, up to the end of the last pair of row tiles: zero.
    for i in rows..a.len() / per_row {
        let (t, r) = (i / TR, i % TR);
        for tile in a[t * per_tile..(t + 1) * per_tile].chunks_exact_mut(TILE) {
            for x in &mut tile[16 * r..16 * r + 16] {
                x.write(0);
            }
        }
    }
    for i in 0..rows {
        let (t, r) = (i / TR, i % TR);
        let row = &g.a[(r0 + i) * g.lda..];
        let tiles = &mut a[t * per_tile..(t + 1) * per_tile];
        #[cfg(target_arch = "x86_64")]
        if simd && g.cs == 1 {
            assert!(crate::kernels::cpu::has_avx512_bf16() && row.len() >= g.k);
            // SAFETY: AVX-512F and AVX512_BF16 are present (asserted); the row's `k`
            // elements are `row[..k]` (cs == 1, and `g.a` ends at the last element of
            // the last row) and `tiles` holds the row tile's blocks.
            unsafe { avx512::split_row(&row[..g.k], tiles, r, parts) };
            continue;
        }
        for kb in 0..blocks {
            let base = kb * count * TILE + 16 * r;
            for q in 0..16 {
                let p = kb * KB + 2 * q;
                let at = |p: usize| {
                    if p < g.k {
                        split(row[p * g.cs])
                    } else {
                        (0, 0)
                    }
                };
                let (e0, e1) = (at(p), at(p + 1));
                tiles[base + q].write(e0.0 as u32 | (e1.0 as u32) << 16);
                if parts == Parts::HiLo {
                    tiles[base + TILE + q].write(e0.1 as u32 | (e1.1 as u32) << 16);
                }
            }
        }
    }
    // SAFETY: every element of `a` was written above: each row below `rows` in all 16
    // pairs of its `hi` (and `lo`) tile rows of every block (by `split_row`, which stores
    // whole tile rows, or by the loop), each row from `rows` to the end zeroed the same
    // way; `MaybeUninit<u32>` has `u32`'s layout. (Tests fill the scratch with NaN
    // pairs first, so an element of a row below `rows` missed here shows as a NaN
    // result; the zero rows feed only output rows that are never stored.)
    unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<u32>(), a.len()) }
}

/// Where one call of the tile writes: `rows` (1 to [`ROWS`]) rows of `width` (1 to
/// [`NR`]) columns from `out`'s first element, rows `ldc` apart.
struct Dst {
    out: Out,
    rows: usize,
    width: usize,
    ldc: usize,
}

/// `dst = a · b` for two row tiles of the split left operand (`blocks` blocks each)
/// and one panel, on AMX when this thread's tiles are configured (`tiles`), by the
/// portable loops otherwise. `buf` takes the rows that cannot be stored in place: a
/// row tile of the output not whole (fewer than 16 rows, or a narrow last panel).
fn tile(
    a: &[u32],
    b: &[u32],
    (blocks, parts): (usize, Parts),
    tiles: Option<&Regs>,
    dst: Dst,
    buf: &mut [f32; ROWS * NR],
) {
    // The bounds every access below relies on, checked once.
    let per_row = blocks * parts.count() * KB / 2;
    assert!(blocks >= 1 && a.len() >= 2 * TR * per_row && b.len() >= blocks * parts.block());
    assert!((1..=ROWS).contains(&dst.rows) && (1..=NR).contains(&dst.width));
    assert!(dst.out.len >= (dst.rows - 1) * dst.ldc + dst.width);
    #[cfg(target_arch = "x86_64")]
    if let Some(tiles) = tiles {
        return on_amx(tiles, a, b, (blocks, parts), dst, buf);
    }
    let _ = tiles;
    *buf = portable(a, b, (blocks, parts), dst.rows);
    store(buf, &dst, 0)
}

/// [`tile`] on AMX, with the bounds it asserted.
#[cfg(target_arch = "x86_64")]
fn on_amx(
    tiles: &Regs,
    a: &[u32],
    b: &[u32],
    (blocks, parts): (usize, Parts),
    dst: Dst,
    buf: &mut [f32; ROWS * NR],
) {
    let two = dst.rows > TR;
    // Row tile 0 in place when it is whole (16 rows of the full width), else in
    // `buf`; row tile 1 (when `two`) in place when whole, else in `buf`'s second half.
    let whole = |rows: usize| rows >= TR && dst.width == NR;
    let (c0, ldc0) = if whole(dst.rows) {
        (dst.out.ptr, dst.ldc)
    } else {
        (buf.as_mut_ptr(), NR)
    };
    let (c1, ldc1) = if two && whole(dst.rows - TR) {
        (dst.out.skip(TR * dst.ldc).ptr, dst.ldc)
    } else {
        (buf[TR * NR..].as_mut_ptr(), NR)
    };
    // SAFETY: AMX is granted and the tiles configured (`tiles`); `a` holds two row
    // tiles and `b` a panel of `blocks` blocks (asserted by `tile`). Each row tile's
    // 16 × 32 results go either to the output, when all 16 rows of all 32 columns are
    // inside it (`whole`, with the bounds `tile` asserted; rows `ldc` apart, written
    // by no one else, see `Out`), or to `buf` (16 rows of NR at its start or at row
    // 16).
    unsafe {
        amx::tile(
            tiles,
            a.as_ptr(),
            b.as_ptr(),
            (blocks, parts),
            two,
            [(c0, ldc0), (c1, ldc1)],
        )
    };
    if !whole(dst.rows) {
        store(buf, &dst, 0);
    } else if two && !whole(dst.rows - TR) {
        store(buf, &dst, TR);
    }
}

/// Copies rows `from..dst.rows` of the 32 × 32 `buf` (the first `dst.width` of each)
/// to the same rows of `dst`.
fn store(buf: &[f32; ROWS * NR], dst: &Dst, from: usize) {
    for i in from..dst.rows {
        // SAFETY: row i's first `width` elements are inside the output (asserted by
        // `tile`) and written by no one else (see `Out`).
        let row = unsafe { dst.out.part(i * dst.ldc, dst.width) };
        let src = &buf[i * NR..(i + 1) * NR];
        match <&mut [f32; NR]>::try_from(&mut *row) {
            // A whole row as one fixed-size copy (vector moves, not a call).
            Ok(whole) => *whole = src.try_into().expect("NR elements"),
            Err(_) => row.copy_from_slice(&src[..dst.width]),
        }
    }
}

/// The tile with f32 operations: per block, per pair of `k`, the three products (the
/// one, for bf16).
fn portable(
    a: &[u32],
    b: &[u32],
    (blocks, parts): (usize, Parts),
    rows: usize,
) -> [f32; ROWS * NR] {
    let x = |pair: u32, half: u32| super::bf16::to_f32((pair >> (16 * half)) as u16);
    let (count, size) = (parts.count(), parts.block());
    let mut acc = [0.0f32; ROWS * NR];
    for i in 0..rows {
        let (t, r) = (i / TR, i % TR);
        for kb in 0..blocks {
            let rows_at = (t * blocks + kb) * count * TILE + 16 * r;
            let block = &b[kb * size..(kb + 1) * size];
            for q in 0..16 {
                let ah = a[rows_at + q];
                for j in 0..NR {
                    let (c, jj) = (j / 16, j % 16);
                    let bh = block[c * TILE + q * 16 + jj];
                    let s = &mut acc[i * NR + j];
                    match parts {
                        Parts::Hi => {
                            for half in 0..2 {
                                *s += x(ah, half) * x(bh, half);
                            }
                        }
                        Parts::HiLo => {
                            let al = a[rows_at + TILE + q];
                            let bl = block[(2 + c) * TILE + q * 16 + jj];
                            for half in 0..2 {
                                *s += x(ah, half) * x(bh, half)
                                    + x(ah, half) * x(bl, half)
                                    + x(al, half) * x(bh, half);
                            }
                        }
                    }
                }
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
pub(super) mod amx;

#[cfg(test)]
mod tests {
    use super::super::tests::{naive, strided_operands, SHAPES};
    use super::super::{matmul_packed, product, PackedRhs};
    use super::*;
    use crate::ir::{DType, Layout};
    use crate::kernels::testutil::*;
    use crate::kernels::Par;

    /// The product of `a` by `w` on the AMX path (`simd`) or the portable loops.
    fn on(simd: bool, a: &[f32], al: &Layout, w: &PackedRhs, threads: usize) -> Vec<f32> {
        let r = al.dims.len();
        let len = al.dims[..r - 1].iter().product::<usize>() * w.n;
        let mut out = vec![f32::NAN; len];
        product(
            a,
            al,
            (w.k, w.n),
            (w.form(), simd),
            &[],
            None,
            &mut out,
            Par { threads },
        )
        .unwrap();
        out
    }

    /// The paths this CPU runs: the portable loops always, AMX where granted.
    fn paths() -> Vec<bool> {
        if crate::kernels::cpu::has_amx_bf16() {
            vec![false, true]
        } else {
            vec![false]
        }
    }

    /// Checks `got` against the f32 product of `a` and `b` (`[m, k] x [k, n]` per
    /// batch, contiguous after gathering) within the stated bound, `2⁻¹⁴ · Σ|a·b|`
    /// plus the f32 sums' rounding.
    fn assert_within_bound(got: &[f32], a: &[f32], al: &Layout, b: &[f32], bl: &Layout) {
        let exact = naive(a, al, b, bl);
        let abs = |x: &[f32]| x.iter().map(|v| v.abs()).collect::<Vec<f32>>();
        let mag = naive(&abs(a), al, &abs(b), bl);
        let k = bl.dims[0] as f32;
        for (i, ((g, e), m)) in got.iter().zip(&exact).zip(&mag).enumerate() {
            let bound = (2f32.powi(-14) + k * 2f32.powi(-23)) * m + 1e-30;
            assert!(
                (g - e).abs() <= bound,
                "element {i}: {g} vs {e}, bound {bound}"
            );
        }
    }

    #[test]
    fn split_keeps_sixteen_bits_and_special_values() {
        let mut rng = Rng::new(300);
        for _ in 0..10_000 {
            let x = (rng.f32() - 0.5) * 2f32.powi(rng.below(60) as i32 - 30);
            let (hi, lo) = split(x);
            let (h, l) = (
                super::super::bf16::to_f32(hi),
                super::super::bf16::to_f32(lo),
            );
            assert!(
                (h + l - x).abs() <= x.abs() * 2f32.powi(-16),
                "{x:e}: {h:e} + {l:e}"
            );
        }
        for x in [f32::INFINITY, f32::NEG_INFINITY, f32::MAX] {
            let (hi, lo) = split(x);
            assert!(
                super::super::bf16::to_f32(hi).is_infinite() && lo == 0,
                "{x}"
            );
        }
        let (hi, lo) = split(f32::NAN);
        assert!(super::super::bf16::to_f32(hi).is_nan() && lo == 0);
        assert_eq!(split(0.0), (0, 0));
    }

    #[test]
    fn packing_keeps_hi_plus_lo_of_every_element() {
        let mut rng = Rng::new(301);
        for (k, n) in [(1, 1), (33, 17), (64, 32), (70, 70)] {
            let b: Vec<f32> = (0..k * n).map(|_| rng.f32() - 0.5).collect();
            let w = PackedRhs::pack_bf16x3(&b, &Layout::contiguous(&[k, n])).unwrap();
            assert_eq!(w.dtype(), DType::BF16X3);
            assert_eq!(w.bytes(), n.div_ceil(NR) * k.div_ceil(KB) * 4 * TILE * 4);
            let back = w.unpack().unwrap();
            for (x, y) in b.iter().zip(&back) {
                let (hi, lo) = split(*x);
                let want = super::super::bf16::to_f32(hi) + super::super::bf16::to_f32(lo);
                assert_eq!(y.to_bits(), want.to_bits());
            }
        }
        let (big, bl) = (
            vec![0.0; (MAX_K + 1) * 2],
            Layout::contiguous(&[MAX_K + 1, 2]),
        );
        let e = PackedRhs::pack_bf16x3(&big, &bl).unwrap_err();
        assert!(e.to_string().contains("exceeds"), "{e}");
        let e = PackedRhs::pack_bf16_in(&big, &bl, true).unwrap_err();
        assert!(
            e.to_string().contains("pack_bf16") && e.to_string().contains("exceeds"),
            "{e}"
        );
        // bf16 in tiles: two tiles a block, `hi` only.
        let b: Vec<f32> = (0..70 * 40).map(|_| rng.f32() - 0.5).collect();
        let w = PackedRhs::pack_bf16_in(&b, &Layout::contiguous(&[70, 40]), true).unwrap();
        assert_eq!(
            w.bytes(),
            40usize.div_ceil(NR) * 70usize.div_ceil(KB) * 2 * TILE * 4
        );
    }

    #[test]
    fn every_path_stays_within_the_bound_for_every_shape() {
        let mut rng = Rng::new(302);
        // SHAPES, and shapes with whole and partial row tiles, blocks and panels.
        let more = [
            (16, 32, 32),
            (32, 64, 64),
            (33, 65, 33),
            (47, 96, 40),
            (64, 31, 96),
            (100, 130, 70),
        ];
        for (m, k, n) in SHAPES.into_iter().chain(more) {
            let a: Vec<f32> = (0..m * k).map(|_| rng.f32() - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.f32() - 0.5).collect();
            let (al, bl) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
            let w = PackedRhs::pack_bf16x3(&b, &bl).unwrap();
            assert!(w.packs(&bl));
            for simd in paths() {
                for threads in [1, 2, 3] {
                    let got = on(simd, &a, &al, &w, threads);
                    assert_within_bound(&got, &a, &al, &b, &bl);
                }
            }
        }
    }

    #[test]
    fn amx_and_portable_paths_agree_closely() {
        if !crate::kernels::cpu::has_amx_bf16() {
            return;
        }
        let mut rng = Rng::new(303);
        let (m, k, n) = (70, 200, 100);
        let a: Vec<f32> = (0..m * k).map(|_| rng.f32() - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.f32() - 0.5).collect();
        let w = PackedRhs::pack_bf16x3(&b, &Layout::contiguous(&[k, n])).unwrap();
        let al = Layout::contiguous(&[m, k]);
        let (x, y) = (on(true, &a, &al, &w, 2), on(false, &a, &al, &w, 1));
        // The same exact products, summed in another order.
        assert_close(&x, &y, 1e-5);
    }

    #[test]
    fn strided_operands_batches_and_special_values() {
        let mut rng = Rng::new(304);
        let (a, al, b, bl) = strided_operands(&mut rng);
        let w = PackedRhs::pack_bf16x3(&b, &bl).unwrap();
        let (k, n) = (21, 40);
        assert!(w.packs(&bl.broadcast_as(&[3, k, n]).unwrap()));
        let want = naive(&a, &al, &b, &bl);
        for simd in paths() {
            let got = on(simd, &a, &al, &w, 2);
            assert_close(&got, &want, 1e-4);
            let mut out = vec![f32::NAN; want.len()];
            matmul_packed(&a, &al, &w, &mut out, Par { threads: 2 }).unwrap();
            assert_close(&out, &want, 1e-4);
        }
        // A NaN weight gives NaN, as in f32; an infinite one infinity or NaN (module
        // docs of `split`; bf16: infinity, the operands being positive), never a
        // finite value.
        let (k, n) = (40, 20);
        let mut b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
        b[3 * n + 2] = f32::INFINITY;
        b[5 * n + 7] = f32::NAN;
        let a: Vec<f32> = (0..2 * k).map(|_| rng.f32().abs() + 0.1).collect();
        let bl = Layout::contiguous(&[k, n]);
        let forms = [
            PackedRhs::pack_bf16x3(&b, &bl).unwrap(),
            PackedRhs::pack_bf16_in(&b, &bl, true).unwrap(),
        ];
        for (w, simd) in forms
            .iter()
            .flat_map(|w| paths().into_iter().map(move |s| (w, s)))
        {
            let got = on(simd, &a, &Layout::contiguous(&[2, k]), w, 1);
            for i in 0..2 {
                let x = got[i * n + 2];
                assert!(x == f32::INFINITY || x.is_nan(), "{x}");
                assert!(got[i * n + 7].is_nan());
                assert!(got[i * n].is_finite());
            }
        }
    }
}
