//! The int8 tile in plain integer loops over the packed layout: the path of the
//! portable tier (and of CPUs without AVX2), and the reference every vector tile is
//! held to bit for bit (the same exact i32 sums, then the same conversion).

use super::{Tile, NR, QUAD};

/// `rows[i][c] = (Σ_g (S_g[i, c] as f32 · sw[g, c])) · sa[i]` for the tile's `R` rows
/// and the panel's 32 columns, where `S_g[i, c] = Σ_p qa[i, p] · q[p, c]` over the
/// rows `p` of scale group `g` (one group for `Shifted` weights, so
/// `(S as f32 · sw[c]) · sa[i]`), `q` decoded from the panel's bytes in its format:
/// the sums in wrapping i32 arithmetic (exact: see the module doc of `i8`), then the
/// conversion every tile makes, the first group's term rounded once, each later one
/// added to the running sum with a fused multiply-add (`mul_add`, one rounding).
pub(super) fn tile<const R: usize>(t: &Tile<'_>, rows: &mut [[f32; NR]; R]) {
    let quads = t.group / 4;
    for (g, group) in t.b.chunks(quads * QUAD).enumerate() {
        let mut acc = [[0i32; NR]; R];
        for (p, quad) in group.chunks_exact(QUAD).enumerate() {
            let p = g * quads + p;
            let mut w = [[0i32; 4]; NR];
            for (w, bytes) in w.iter_mut().zip(quad.chunks_exact(4)) {
                for (w, &b) in w.iter_mut().zip(bytes) {
                    *w = t.format.decode(b) as i32;
                }
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let a = &t.qa[i * t.kp + 4 * p..i * t.kp + 4 * p + 4];
                let a = [a[0] as i32, a[1] as i32, a[2] as i32, a[3] as i32];
                for (c, w) in acc.iter_mut().zip(&w) {
                    let dot = w[0] * a[0] + w[1] * a[1] + w[2] * a[2] + w[3] * a[3];
                    *c = c.wrapping_add(dot);
                }
            }
        }
        let sw = &t.sw[g * NR..(g + 1) * NR];
        for (row, acc) in rows.iter_mut().zip(&acc) {
            for c in 0..NR {
                let v = acc[c] as f32;
                row[c] = if g == 0 {
                    v * sw[c]
                } else {
                    v.mul_add(sw[c], row[c])
                };
            }
        }
    }
    for (row, &sa) in rows.iter_mut().zip(t.sa) {
        for x in row.iter_mut() {
            *x *= sa;
        }
    }
}
