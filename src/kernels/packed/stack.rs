//! The stack scratch the tiles take their left rows into, the chunking of rows that
//! fits it, and the two macros the tiles share: a store of a tile's rows masked to a
//! panel's width, and the dispatch of a row count to a tile compiled for it.

use std::mem::MaybeUninit;

use super::MR;

/// Stores a tile's `$r` rows of the f32 accumulators `$acc0`, `$acc1` (arrays of
/// `__m512`) to the columns `$at` of `$dst`, masked to the panel's width. A macro, not a
/// function: the accumulators must stay in registers (passing them by reference to a
/// call the compiler does not inline spilled them and halved the tiles' speed).
///
/// Needs, inside an `unsafe` context compiled with AVX-512F: `$dst` valid for writes
/// of `($r - 1) * ldc + j0 + width` elements that no one else touches, `1 <= width
/// <= NR`.
#[cfg(target_arch = "x86_64")]
macro_rules! store_rows {
    ($r:expr, $acc0:expr, $acc1:expr, $at:expr, $dst:expr) => {{
        let (m0, m1) = super::super::lane_masks($at.width);
        for i in 0..$r {
            let row = $dst.add(i * $at.ldc + $at.j0);
            _mm512_mask_storeu_ps(row, m0, $acc0[i]);
            _mm512_mask_storeu_ps(row.add(16), m1, $acc1[i]);
        }
    }};
}
#[cfg(target_arch = "x86_64")]
pub(super) use store_rows;

/// The most rows of one chunk of a bf16 or int8 product (18 tiles of [`MR`]).
pub(super) const CHUNK_ROWS: usize = 18 * MR;

/// Rows per chunk when `m` rows of `per_row` scratch elements each are taken a chunk
/// at a time into a scratch of at most `budget` elements: all of them when they fit,
/// else as many whole tiles as fit (single rows when not even a tile does).
pub(super) fn chunk_rows(m: usize, per_row: usize, budget: usize) -> usize {
    let fit = (budget / per_row.max(1)).clamp(1, CHUNK_ROWS);
    if m <= fit {
        m.max(1)
    } else if fit >= MR {
        fit / MR * MR
    } else {
        fit
    }
}

/// Calls `f` with a zeroed scratch of `len` elements on the stack (`len` at most 256
/// Ki), taken from the smallest of four sizes that holds it, so that a small product
/// does not clear a large one. A product's scratch lives here, not on the heap: it
/// allocates nothing, whichever thread runs it.
pub(super) fn with_stack<T: Copy + Default, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    /// Not inlined, so that each size has its own frame.
    #[inline(never)]
    fn sized<T: Copy + Default, R, const N: usize>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
        let mut buf = [T::default(); N];
        f(&mut buf[..len])
    }
    match len {
        0..=4096 => sized::<T, R, 4096>(len, f),
        4097..=16384 => sized::<T, R, 16384>(len, f),
        16385..=65536 => sized::<T, R, 65536>(len, f),
        _ => sized::<T, R, 262144>(len, f),
    }
}

/// Calls `f` with a scratch of `len` elements (at most 256 Ki) on the stack whose
/// contents are unspecified, taken from the smallest of four sizes that holds it: for
/// a caller that writes every element it reads, so that the scratch costs no clearing
/// (clearing 256 KiB per thread and product was 7% of a one-sentence forward). In
/// tests the elements are `0x7fc0_7fc0` (a pair of bf16 NaNs), so a read of one never
/// written shows in a result.
pub(super) fn with_stack_uninit<R>(len: usize, f: impl FnOnce(&mut [MaybeUninit<u32>]) -> R) -> R {
    /// Not inlined, so that each size has its own frame.
    #[inline(never)]
    fn sized<R, const N: usize>(len: usize, f: impl FnOnce(&mut [MaybeUninit<u32>]) -> R) -> R {
        let mut buf = [const { MaybeUninit::<u32>::uninit() }; N];
        if cfg!(test) {
            for x in &mut buf[..len] {
                x.write(0x7fc0_7fc0);
            }
        }
        f(&mut buf[..len])
    }
    match len {
        0..=4096 => sized::<R, 4096>(len, f),
        4097..=16384 => sized::<R, 16384>(len, f),
        16385..=65536 => sized::<R, 65536>(len, f),
        _ => sized::<R, 262144>(len, f),
    }
}

/// Runs `$tile::<R, ..>` for the row count `$rows` (1 to [`MR`]) as a constant.
macro_rules! by_rows {
    ($rows:expr, $call:ident ! ()) => {
        match $rows {
            1 => $call!(1),
            2 => $call!(2),
            3 => $call!(3),
            4 => $call!(4),
            5 => $call!(5),
            6 => $call!(6),
            7 => $call!(7),
            8 => $call!(8),
            9 => $call!(9),
            10 => $call!(10),
            11 => $call!(11),
            12 => $call!(12),
            13 => $call!(13),
            14 => $call!(14),
            _ => unreachable!("row blocks hold 1 to MR rows"),
        }
    };
}
pub(super) use by_rows;
