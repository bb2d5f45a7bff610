//! The int8 product on AMX tiles (AMX-INT8, Sapphire Rapids and later): whole pairs of
//! 16-row tiles of a chunk, where `kp` is a multiple of [`K`]. `tdpbsud` takes the
//! signed activation bytes as its first operand (16 rows × 64 bytes of `k`, straight
//! from the chunk's rows) and the panel's unsigned bytes as its second (16 quads × 16
//! columns, the panel's own layout read with a stride of 128 bytes), four products
//! summed into each i32 as `vpdpbusd` does; the accumulators go through the AVX-512
//! conversion, so the bits are every other path's.

use super::super::Out;
use super::{avx512, Tile, NR};
use std::arch::asm;

/// The AMX tile registers, configured for this thread.
pub(super) type Regs = super::super::tiles::amx::Tiles;

/// Rows of one call of the AMX tile: two tiles of 16.
pub(super) const ROWS: usize = 32;
/// Bytes of `k` per AMX block: one tile row of activations (16 quads).
pub(super) const K: usize = 64;

/// `dst[i][j0..j0 + width] = qa[i] · b`, scaled, for the [`ROWS`] rows of `t`, on
/// AMX tiles: the same exact integer sums as the VNNI tile (`tdpbsud`: signed
/// activation bytes by unsigned weight bytes, four products a lane summed into i32),
/// then the same conversion, so the same bits.
pub(super) fn tile_pair(tiles: &Regs, t: &Tile<'_>, dst: Out) {
    // The bounds every access below relies on, checked once.
    assert!(t.width >= 1 && t.width <= NR && t.kp.is_multiple_of(K));
    assert!(t.b.len() == t.kp * NR && t.qa.len() == ROWS * t.kp);
    assert!(t.sa.len() == ROWS && t.sums.len() == ROWS && t.sw.len() == NR);
    assert!(t.at <= dst.len && (ROWS - 1) * t.ldc + t.width <= dst.len - t.at);
    assert!(crate::kernels::cpu::has_amx_int8());
    // Not cleared: the tile stores every element (clearing it was a 4 KiB store per
    // pair and panel).
    let mut acc = std::mem::MaybeUninit::<[[i32; NR]; ROWS]>::uninit();
    // SAFETY: AMX-INT8 is granted and the tiles configured (`tiles`); `t.qa` holds 32
    // rows of `kp` bytes and `t.b` `kp / 4` quads of 128 bytes, `kp` a multiple of 64
    // (asserted), and `acc` is 32 rows of 32 i32. The tile's four stores write all of
    // `acc` (rows 0–15 and 16–31, columns 0–15 and 16–31), so it is initialised after
    // (the tests hold the results to the portable path's bits, which an unwritten
    // element would break).
    let acc = unsafe {
        pair(
            tiles,
            t.qa.as_ptr(),
            t.kp,
            t.b.as_ptr(),
            acc.as_mut_ptr().cast(),
        );
        acc.assume_init()
    };
    // SAFETY: AVX-512 F and BW are present (VNNI's detection requires them; asserted
    // through `has_amx_int8`), and the bounds asserted above are `avx512::convert`'s.
    unsafe { avx512::convert::<ROWS>(&acc, t, dst.ptr) };
}

/// `acc = qa · b` in i32 for 32 rows of activations (`qa`, rows `kp` bytes apart)
/// and one panel (`b`: `kp / 4` quads of 128 bytes, columns 0–15 in the first 64
/// of each): per block of 64 bytes of `k`, two row tiles (16 rows × 64 bytes),
/// two column tiles (16 quads × 16 columns × 4 bytes) and four `tdpbsud`; the four
/// accumulators are stored to `acc`, 32 rows of 32 i32 (128 bytes apart).
///
/// # Safety
///
/// AMX-TILE and AMX-INT8 are granted to the process and this thread's tiles are
/// configured (`_tiles`: 16 rows of 64 bytes each); `kp` is a non-zero multiple of
/// 64, `qa` holds `32 · kp` bytes, `b` `kp · 32`, and `acc` is valid for writes of
/// 32 × 32 i32 that no one else touches during the call.
unsafe fn pair(_tiles: &Regs, qa: *const i8, kp: usize, b: *const u8, acc: *mut i32) {
    // SAFETY: the caller's contract. The loop reads, per block, 16 rows of 64
    // bytes at `a0` and at `a1` (rows `kp` apart: inside `qa`) and 16 quads of 64
    // bytes at `b` and `b + 64` (quads 128 apart: inside the panel), advancing by
    // one block, `kp / 64` times; the stores write the 32 × 32 i32 of `acc`. The
    // asm touches no Rust-visible memory but through these pointers, and the tile
    // registers are not Rust's.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a0} + {sa}]",
            "tileloadd tmm5, [{a1} + {sa}]",
            "tileloadd tmm6, [{b} + {sb}]",
            "tileloadd tmm7, [{b} + {sb} + 64]",
            "tdpbsud tmm0, tmm4, tmm6",
            "tdpbsud tmm1, tmm4, tmm7",
            "tdpbsud tmm2, tmm5, tmm6",
            "tdpbsud tmm3, tmm5, tmm7",
            "add {a0}, 64",
            "add {a1}, 64",
            "add {b}, 2048",
            "dec {n}",
            "jnz 2b",
            "tilestored [{c0} + {sb}], tmm0",
            "tilestored [{c0} + {sb} + 64], tmm1",
            "tilestored [{c1} + {sb}], tmm2",
            "tilestored [{c1} + {sb} + 64], tmm3",
            a0 = inout(reg) qa => _,
            a1 = inout(reg) qa.wrapping_add(16 * kp) => _,
            b = inout(reg) b => _,
            n = inout(reg) kp / 64 => _,
            sa = in(reg) kp,
            sb = in(reg) 128usize,
            c0 = in(reg) acc,
            c1 = in(reg) acc.wrapping_add(16 * 32),
            options(nostack),
        );
    }
}
