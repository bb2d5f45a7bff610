//! The bf16 tile in portable code: the pairs' products with f32 operations, in the
//! order `vdpbf16ps` adds them (per pair, the product of the high halves, then of the
//! low halves), over the left rows rounded to bf16 pairs.

use super::{to_f32, Tile, NR};
use crate::kernels::par::Out;

/// `dst[i][j0..j0 + width] = a[i] · b` for the tile's `rows` rows (the bounds checked
/// by the caller, `super::tile`).
pub(super) fn tile(t: &Tile<'_>, rows: usize, dst: Out) {
    for i in 0..rows {
        let mut acc = [0.0f32; NR];
        for (q, &x) in t.a[i * t.kp..(i + 1) * t.kp].iter().enumerate() {
            let (x0, x1) = (to_f32(x as u16), to_f32((x >> 16) as u16));
            for (s, &w) in acc.iter_mut().zip(&t.b[q * NR..(q + 1) * NR]) {
                *s += x1 * to_f32((w >> 16) as u16);
                *s += x0 * to_f32(w as u16);
            }
        }
        let start = i * t.at.ldc + t.at.j0;
        // SAFETY: the elements are row i's columns j0..j0 + width, inside `dst`
        // (asserted by `super::tile`) and written by no one else (see `Out`).
        let row = unsafe { dst.part(start, t.at.width) };
        row.copy_from_slice(&acc[..t.at.width]);
    }
}
