//! The int8 tile in plain integer loops over the packed layout: the path of the
//! portable tier (and of CPUs without AVX2), and the reference every vector tile is
//! held to bit for bit (the same exact i32 sums, then the same conversion).

use super::{Tile, NR, QUAD, ZERO};

/// `rows[i][c] = ((Σ_p qa[i, p] · q[p, c]) as f32 · sw[c]) · sa[i]` for the tile's `R`
/// rows and the panel's 32 columns: the sums taken as the VNNI tile takes them (the
/// unsigned weight bytes, then the shift taken off with the row sums, all in wrapping
/// i32 arithmetic, so exact), then the same conversion as every other tile.
pub(super) fn tile<const R: usize>(t: &Tile<'_>, rows: &mut [[f32; NR]; R]) {
    let mut acc = [[0i32; NR]; R];
    for (p, quad) in t.b.chunks_exact(QUAD).enumerate() {
        for (i, acc) in acc.iter_mut().enumerate() {
            let a = &t.qa[i * t.kp + 4 * p..i * t.kp + 4 * p + 4];
            let a = [a[0] as i32, a[1] as i32, a[2] as i32, a[3] as i32];
            for (c, w) in acc.iter_mut().zip(quad.chunks_exact(4)) {
                let dot = w[0] as i32 * a[0]
                    + w[1] as i32 * a[1]
                    + w[2] as i32 * a[2]
                    + w[3] as i32 * a[3];
                *c = c.wrapping_add(dot);
            }
        }
    }
    for i in 0..R {
        let shift = t.sums[i].wrapping_mul(ZERO as i32);
        for c in 0..NR {
            rows[i][c] = (acc[i][c].wrapping_sub(shift) as f32 * t.sw[c]) * t.sa[i];
        }
    }
}
