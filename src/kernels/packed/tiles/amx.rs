//! The AMX tile registers (shared with the int8 form, module `i8`, whose tiles take the
//! same shape): their configuration for a thread, and the `tdpbf16ps` tile loops in
//! `asm!`.

use super::{Parts, TILE};
use std::arch::asm;

/// The tile configuration every tile of this module uses (palette 1): eight
/// tiles of 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // bytes per row (little-endian u16)
        c[48 + t] = 16; // rows
        t += 1;
    }
    Config(c)
};

/// The tile registers of this thread, configured for [`tile`] (and the int8
/// tile): made once per part of a product (`ldtilecfg` costs about as much as a
/// tile's whole block loop), released when dropped (`tilerelease`), so no tile
/// state outlives the part.
pub(in crate::kernels::packed) struct Tiles(());

impl Tiles {
    /// Loads the configuration.
    ///
    /// # Safety
    ///
    /// AMX-TILE is granted to the process (`cpu::has_amx_bf16` or
    /// `cpu::has_amx_int8`).
    pub(in crate::kernels::packed) unsafe fn configure() -> Tiles {
        // SAFETY: AMX is granted (the caller's contract); `ldtilecfg` reads the 64
        // bytes of `CONFIG` and changes only the tile registers, which no compiled
        // code uses.
        unsafe {
            asm!("ldtilecfg [{cfg}]", cfg = in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        }
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a `Tiles` exists only where AMX is granted; releasing the tiles
        // zeroes them and their configuration, which only this module uses.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// One `asm!` tile loop: zero the accumulators, run `$body` once per block
/// (`blocks` times; the body advances `{a0}` (and `{a1}`) and `{b}` by a block),
/// store the accumulators. `two`: four accumulators, row tile 0's at `{c0}` and
/// row tile 1's at `{c1}`; `one`: two, row tile 0's only.
macro_rules! tile_loop {
    (two, $a0:expr, $a1:expr, $b:expr, $n:expr, $c:expr, [$($body:literal),* $(,)?]) => {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            $($body,)*
            "dec {n}",
            "jnz 2b",
            "tilestored [{c0} + {ldc0}], tmm0",
            "tilestored [{c0} + {ldc0} + 64], tmm1",
            "tilestored [{c1} + {ldc1}], tmm2",
            "tilestored [{c1} + {ldc1} + 64], tmm3",
            a0 = inout(reg) $a0 => _,
            a1 = inout(reg) $a1 => _,
            b = inout(reg) $b => _,
            n = inout(reg) $n => _,
            s = in(reg) 64usize,
            c0 = in(reg) $c[0].0,
            c1 = in(reg) $c[1].0,
            ldc0 = in(reg) $c[0].1,
            ldc1 = in(reg) $c[1].1,
            options(nostack),
        )
    };
    (one, $a0:expr, $b:expr, $n:expr, $c:expr, [$($body:literal),* $(,)?]) => {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "2:",
            $($body,)*
            "dec {n}",
            "jnz 2b",
            "tilestored [{c0} + {ldc0}], tmm0",
            "tilestored [{c0} + {ldc0} + 64], tmm1",
            a0 = inout(reg) $a0 => _,
            b = inout(reg) $b => _,
            n = inout(reg) $n => _,
            s = in(reg) 64usize,
            c0 = in(reg) $c[0].0,
            ldc0 = in(reg) $c[0].1,
            options(nostack),
        )
    };
}

/// `c = a · b` for two row tiles of the split left operand (`a`: per block, the
/// first tile's parts, `count · blocks · TILE` pairs on, the second's; `count` =
/// `parts.count()`) and one panel of `blocks` blocks (`b`): row tile 0's 16 × 32
/// results at `c0`, rows `ldc0` floats apart, row tile 1's at `c1`, rows `ldc1`
/// apart. With `two` false only the first row tile is multiplied (`c1` is not
/// written). Per block: bf16 (`Parts::Hi`) loads each row tile's `hi` and the two
/// column tiles and takes four products; bf16x3 takes twelve (`hi·hi`, `hi·lo`,
/// `lo·hi`) from ten loads.
///
/// # Safety
///
/// AMX-TILE and AMX-BF16 are granted to the process, and this thread's tiles are
/// configured (`_tiles`); `a` holds `2 · count · blocks · TILE` pairs (one row
/// tile's when `two` is false: `count · blocks · TILE`), `b` `blocks ·
/// parts.block()` pairs; `c0` (and `c1` when `two`) is valid for writes of 16 rows
/// of 32 floats, `ldc0` (`ldc1`) apart, that no one else touches during the call.
pub(super) unsafe fn tile(
    _tiles: &Tiles,
    a: *const u32,
    b: *const u32,
    (blocks, parts): (usize, Parts),
    two: bool,
    [(c0, ldc0), (c1, ldc1)]: [(*mut f32, usize); 2],
) {
    let a1 = a.wrapping_add(parts.count() * blocks * TILE);
    let c = [(c0, ldc0 * 4), (c1, ldc1 * 4)];
    // SAFETY: the caller's contract. Each loop reads, per block, the row tiles'
    // tiles (1 KiB each: `hi` at `a`, `lo` right after it for bf16x3, the same
    // past `a1`) and the block's tiles of `b` (two for bf16, four for bf16x3),
    // advancing by one block's pairs each step, `blocks` times; the stores write
    // the accumulators at `c0` (and `c1`). The asm touches no Rust-visible memory
    // but through these pointers, and the tile registers are not Rust's (no
    // compiled code uses AMX): between two calls under one `Tiles` nothing else
    // touches them.
    unsafe {
        match (parts, two) {
            (Parts::Hi, true) => tile_loop!(
                two,
                a,
                a1,
                b,
                blocks,
                c,
                [
                    "tileloadd tmm4, [{a0} + {s}]",
                    "tileloadd tmm5, [{a1} + {s}]",
                    "tileloadd tmm6, [{b} + {s}]",
                    "tileloadd tmm7, [{b} + {s} + 1024]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "add {a0}, 1024",
                    "add {a1}, 1024",
                    "add {b}, 2048",
                ]
            ),
            (Parts::Hi, false) => tile_loop!(
                one,
                a,
                b,
                blocks,
                c,
                [
                    "tileloadd tmm4, [{a0} + {s}]",
                    "tileloadd tmm6, [{b} + {s}]",
                    "tileloadd tmm7, [{b} + {s} + 1024]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "add {a0}, 1024",
                    "add {b}, 2048",
                ]
            ),
            (Parts::HiLo, true) => tile_loop!(
                two,
                a,
                a1,
                b,
                blocks,
                c,
                [
                    "tileloadd tmm4, [{a0} + {s}]",
                    "tileloadd tmm5, [{a1} + {s}]",
                    "tileloadd tmm6, [{b} + {s}]",
                    "tileloadd tmm7, [{b} + {s} + 1024]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "tileloadd tmm6, [{b} + {s} + 2048]",
                    "tileloadd tmm7, [{b} + {s} + 3072]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "tileloadd tmm4, [{a0} + {s} + 1024]",
                    "tileloadd tmm5, [{a1} + {s} + 1024]",
                    "tileloadd tmm6, [{b} + {s}]",
                    "tileloadd tmm7, [{b} + {s} + 1024]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "add {a0}, 2048",
                    "add {a1}, 2048",
                    "add {b}, 4096",
                ]
            ),
            (Parts::HiLo, false) => tile_loop!(
                one,
                a,
                b,
                blocks,
                c,
                [
                    "tileloadd tmm4, [{a0} + {s}]",
                    "tileloadd tmm6, [{b} + {s}]",
                    "tileloadd tmm7, [{b} + {s} + 1024]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm6, [{b} + {s} + 2048]",
                    "tileloadd tmm7, [{b} + {s} + 3072]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm4, [{a0} + {s} + 1024]",
                    "tileloadd tmm6, [{b} + {s}]",
                    "tileloadd tmm7, [{b} + {s} + 1024]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "add {a0}, 2048",
                    "add {b}, 4096",
                ]
            ),
        }
    }
}
