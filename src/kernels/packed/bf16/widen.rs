//! The widening walks: bf16 panels multiplied by f32 left rows on the tiles that widen
//! the pairs to f32 (AVX2 and NEON in registers, block by block; AVX2 tall parts and
//! AVX-512 without AVX512_BF16 by widening each panel into an f32 copy for the f32
//! tile), with the epilogue.

use std::mem::MaybeUninit;

use super::super::f32::{self, check_epilogue, NextPanel};
use super::super::{
    by_rows, chunk_rows, with_stack, with_stack_uninit, Cols, Epilogue, Matrix, Out, Part, NR,
};
#[cfg(target_arch = "x86_64")]
use super::avx2;
#[cfg(target_arch = "aarch64")]
use super::neon;
use super::{Job, Kernel, SCRATCH};

/// [`part`] on a widening tile (`job.kernel`: AVX2, the widened AVX-512 one or NEON),
/// whose left rows are f32 with contiguous elements: read in place when they are
/// (every activation of a model), else copied so a chunk at a time (as many rows as
/// the stack scratch holds).
pub(super) fn in_f32(job: Job<'_>, g: Matrix<'_>, part: Part) {
    // The tile's walk over rows of `g` that are rows `base..` of the product.
    let walk = |g: Matrix<'_>, base: usize, part: Part| match job.kernel {
        Kernel::Widened512 => walk_widened(f32::Isa::Avx512, job, g, base, part),
        _ => walk(job, g, base, part),
    };
    if g.cs == 1 {
        return walk(g, 0, part);
    }
    let (first, end) = part.rows;
    let chunk = chunk_rows(end - first, g.k, SCRATCH);
    let copy = |scratch: &mut [f32]| {
        let mut c0 = first;
        while c0 < end {
            let rows = chunk.min(end - c0);
            let buf = &mut scratch[..rows * g.k];
            for (i, row) in buf.chunks_exact_mut(g.k).enumerate() {
                for (p, x) in row.iter_mut().enumerate() {
                    *x = g.a[(c0 + i) * g.lda + p * g.cs];
                }
            }
            let rows_g = Matrix {
                a: buf,
                lda: g.k,
                cs: 1,
                k: g.k,
            };
            let part = Part {
                rows: (c0, c0 + rows),
                ..part
            };
            walk(rows_g, c0, part);
            c0 += rows;
        }
    };
    if chunk * g.k <= STACK_MOST {
        with_stack(chunk * g.k, copy)
    } else {
        // A row longer than the stack scratch (k beyond 256 Ki): on the heap.
        copy(&mut vec![0.0f32; g.k])
    }
}

/// The most elements [`with_stack`] holds.
pub(super) const STACK_MOST: usize = 256 << 10;

/// Parts of at least this many rows widen each panel into an f32 copy on the stack
/// once and run the f32 AVX2 tile over it (the same bits); shorter ones widen in
/// registers, block by block. A pass over MiniLM's 24 weights on one thread of this
/// project's Skylake-SP forced to `avx2` (`benches/lowp.rs`, `lowp_alternate`: 21
/// rounds alternated with the f32 tile in one process, medians of the paired
/// bf16/f32 ratios), in registers against the panel copied: 12 rows 1.47 against
/// 0.99, 28 rows 1.22 against 1.03, 96 rows 1.08 against 1.05, 192 rows 1.02 against
/// 1.06, 896 rows 1.01 against 1.06. Few rows wait on the panel's stream, which the
/// tile overlaps with its multiplies and a copy does not; many rows pay the tile's
/// widening once per block of 6 (8 more instructions per 24 FMAs, and the core
/// issues about 4 a cycle), the copy once per panel.
// (Fewer in the tests, so that both ways run on their shapes.)
pub(super) const WIDE_PANEL_ROWS: usize = if cfg!(test) { 9 } else { 128 };

/// Widens the panel `b` (`ceil(k / 2) * NR` pairs) into the first `k * NR` elements
/// of `scratch`, as f32: row `p` of the panel at `p * NR`, as `PackedRhs::pack` lays
/// out an f32 panel.
pub(super) fn widen_panel<'s>(
    b: &[u32],
    k: usize,
    scratch: &'s mut [MaybeUninit<u32>],
) -> &'s [f32] {
    assert!(b.len() >= k.div_ceil(2) * NR && scratch.len() >= k * NR);
    assert!(Kernel::Avx2.runs_here(), "this CPU has no AVX2 bf16 tile");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX2 (asserted), `b` holds the ceil(k / 2) * NR pairs and
    // `scratch` the k * NR elements `avx2::widen_panel` reads and writes (asserted).
    unsafe {
        avx2::widen_panel(b.as_ptr(), k, scratch.as_mut_ptr().cast())
    };
    // SAFETY: the first k * NR elements of `scratch` were all written above (rows
    // 0..k of the panel's NR columns), and an initialised u32 has the layout of an
    // f32 and any bits are a valid f32. (Tests fill the scratch with NaN pairs first,
    // so an element missed shows as a NaN result.)
    unsafe { std::slice::from_raw_parts(scratch.as_ptr().cast::<f32>(), k * NR) }
}

/// The widening tile of `job.kernel` over `part`, whose rows start at row `base` of
/// the product in `g` (elements contiguous): panel by panel, and in each panel row
/// block by row block (so a panel stays in L2 while every row block reads it), each
/// block asking for its share of the next panel (`f32::NextPanel`; the x86 tile), as
/// the f32 tile's walk does. On AVX2, from [`WIDE_PANEL_ROWS`] rows on, each panel is
/// widened into a copy first ([`walk_widened`]).
pub(super) fn walk(job: Job<'_>, g: Matrix<'_>, base: usize, part: Part) {
    let (kernel, data, epilogue, out) = (job.kernel, job.data, job.epilogue, job.out);
    let kp = g.k.div_ceil(2);
    if kernel == Kernel::Avx2 && part.rows.1 - part.rows.0 >= WIDE_PANEL_ROWS {
        return walk_widened(f32::Isa::Avx2, job, g, base, part);
    }
    let (first, count) = (part.rows.0, part.rows.1 - part.rows.0);
    let rows = kernel.wide_rows();
    let blocks = count.div_ceil(rows);
    for pj in part.panels.0..part.panels.1 {
        let b = &data[pj * kp * NR..(pj + 1) * kp * NR];
        let next = b.as_ptr().wrapping_add(kp * NR).cast::<u8>();
        let at = part.cols(pj);
        let mut bi = 0;
        Part::blocks_of(rows, first, count, |r0, h| {
            // A step of the tile reads one line of a half-panel: 2kp lines, 2kp steps.
            let next = NextPanel::share(next, 2 * kp, 2 * kp, bi, blocks);
            let t = Wide {
                a: &g.a[(r0 - base) * g.lda..],
                lda: g.lda,
                k: g.k,
                b,
                at,
                row0: r0,
                epilogue,
                next,
            };
            bi += 1;
            wide_tile(kernel, &t, h, out.skip(r0 * part.n));
        });
    }
}

/// `part` panel by panel, each widened into an f32 copy (on the stack; on the heap for
/// a `k` beyond [`STACK_MOST`] / [`NR`], 8192) and multiplied by `isa`'s f32 tile with
/// the epilogue, each row block asking for its share of the next bf16 panel. `g`'s
/// first row is row `base` of the product. The results are the f32 tile's over the
/// widened weight, bit for bit.
pub(super) fn walk_widened(isa: f32::Isa, job: Job<'_>, g: Matrix<'_>, base: usize, part: Part) {
    let kp = g.k.div_ceil(2);
    let panels = |scratch: &mut [MaybeUninit<u32>]| {
        for pj in part.panels.0..part.panels.1 {
            let b = &job.data[pj * kp * NR..(pj + 1) * kp * NR];
            let next = (b.as_ptr().wrapping_add(kp * NR).cast::<u8>(), 2 * kp);
            let wide = widen_panel(b, g.k, scratch);
            let rows = (part.rows.0, part.rows.1 - part.rows.0);
            let at = part.cols(pj);
            let (epilogue, out) = (job.epilogue, job.out);
            f32::panel_on(isa, (g, base), wide, at, rows, epilogue, next, part.n, out);
        }
    };
    if g.k * NR <= STACK_MOST {
        with_stack_uninit(g.k * NR, panels)
    } else {
        panels(&mut vec![MaybeUninit::new(0); g.k * NR])
    }
}

/// One widening tile's operands: rows of `a` (element `(i, p)` at `i * lda + p`), the
/// panel `b` (`ceil(k / 2)` rows of [`NR`] pairs), where the results go (`at`; the
/// tile's first row is row `row0` of the product, which the epilogue's residuals are
/// indexed by), what happens to them before, and the next panel's share.
pub(super) struct Wide<'a> {
    pub(super) a: &'a [f32],
    pub(super) lda: usize,
    pub(super) k: usize,
    pub(super) b: &'a [u32],
    pub(super) at: Cols,
    pub(super) row0: usize,
    pub(super) epilogue: Epilogue<'a>,
    // Read by the x86 tile only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) next: NextPanel,
}

/// `dst[i][j0..j0 + width] = (a[i] · b)`, then the epilogue, for the tile's `rows`
/// rows on `kernel`'s widening tile.
pub(super) fn wide_tile(kernel: Kernel, t: &Wide<'_>, rows: usize, dst: Out) {
    macro_rules! call {
        ($r:literal) => {
            checked::<$r>(kernel, t, dst)
        };
    }
    by_rows!(rows, call!())
}

/// Checks the bounds the widening tiles rely on, then runs `kernel`'s for `R` rows.
pub(super) fn checked<const R: usize>(kernel: Kernel, t: &Wide<'_>, dst: Out) {
    let w = t.at;
    assert!(R >= 1 && R <= kernel.wide_rows() && w.width >= 1 && w.width <= NR);
    assert!(t.k >= 1 && t.b.len() >= t.k.div_ceil(2) * NR);
    assert!(t.a.len() > (R - 1) * t.lda + (t.k - 1));
    assert!(dst.len >= (R - 1) * w.ldc + w.j0 + w.width);
    check_epilogue(t.epilogue, w, t.row0 + R);
    assert!(
        kernel.widens() && kernel.runs_here(),
        "this CPU has no {kernel:?} bf16 tile"
    );
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the CPU has the tile's instructions (asserted), the asserts above
        // are the bounds the tiles document, and this tile's elements of `dst` are
        // written by no one else (see `Out`).
        unsafe { avx2::tile::<R>(t, dst.ptr) }
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: as for the x86 tile just above.
        unsafe { neon::wide_tile::<R>(t, dst.ptr) }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    unreachable!("the widening bf16 tiles run on x86_64 and aarch64 only")
}
