//! The int8 walk: which code multiplies ([`Path`]: a tile per tier, or the portable
//! loops), the walk over chunks of rows (each quantised once into a scratch), panels
//! and tiles, and the tile dispatch with the bounds every tile relies on.

use super::super::f32::check_epilogue;
use super::super::{
    by_rows, chunk_rows, with_stack, Cols, Epilogue, Matrix, Out, Part, CHUNK_ROWS, MR, NR,
};
#[cfg(target_arch = "aarch64")]
use super::neon;
#[cfg(target_arch = "x86_64")]
use super::{amx, avx2, avx512};
use super::{portable, quantize, Format, PackedI8};
use crate::kernels::cpu::{self, Tier};

/// Which code multiplies (every path that multiplies a weight's format gives the same
/// bits): the tile of one tier, or the portable loops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::kernels::packed) enum Path {
    /// Plain integer loops (module `portable`): any CPU.
    Portable,
    /// `vpmaddubsw` of the activations shifted to u8 by `Narrow` weights (module
    /// `avx2`).
    Avx2,
    /// `vpdpbusd` on ymm (module `avx2`).
    Avx2Vnni,
    /// Bytes widened to i16 and `vpmaddwd` on zmm (module `avx512`).
    Avx512,
    /// `vpdpbusd` on zmm (module `avx512`), and AMX tiles where AMX-INT8 runs.
    Avx512Vnni,
    /// `sdot` on `Signed` weights (module `neon`).
    NeonDotprod,
    /// `smmla` on `Signed` weights (module `neon`).
    NeonI8mm,
}

/// Every path, lowest first (each family's).
#[cfg(test)]
pub(super) const PATHS: [Path; 7] = [
    Path::Portable,
    Path::Avx2,
    Path::Avx2Vnni,
    Path::Avx512,
    Path::Avx512Vnni,
    Path::NeonDotprod,
    Path::NeonI8mm,
];

impl Path {
    /// The fastest path the tier in use lets run on weights in `format`.
    pub(super) fn best_for(format: Format) -> Path {
        match format {
            Format::Narrow if cpu::has_avx2() => return Path::Avx2,
            // `smmla` does twice the multiply-adds of an `sdot` (module `neon`).
            Format::Signed if cpu::has_i8mm() => return Path::NeonI8mm,
            Format::Signed if cpu::has_dotprod() => return Path::NeonDotprod,
            Format::Narrow | Format::Signed => return Path::Portable,
            Format::Shifted => {}
        }
        if cpu::has_avx512_vnni() {
            Path::Avx512Vnni
        } else if cpu::has_avx_vnni() {
            // `vpdpbusd` on ymm does twice the multiply-adds an instruction of the
            // widened 512-bit form does.
            Path::Avx2Vnni
        } else if cpu::has_avx512() {
            Path::Avx512
        } else {
            Path::Portable
        }
    }

    /// The tier whose features the path's code needs.
    pub(super) fn tier(self) -> Tier {
        match self {
            Path::Portable => Tier::Portable,
            Path::Avx2 => Tier::Avx2,
            Path::Avx2Vnni => Tier::Avx2Vnni,
            Path::Avx512 => Tier::Avx512,
            Path::Avx512Vnni => Tier::Avx512Vnni,
            Path::NeonDotprod => Tier::NeonDotprod,
            Path::NeonI8mm => Tier::NeonI8mm,
        }
    }

    /// Whether this CPU can run the path (whatever tier the environment forces: the
    /// tests run every path the CPU has). A CPU runs only its own family's tiers.
    pub(super) fn runs(self) -> bool {
        self == Path::Portable || cpu::cpu_runs(self.tier())
    }

    /// Whether the path multiplies weights in `format` (the portable loops take every
    /// one, the AVX2 tile `Narrow` ones, the aarch64 tiles `Signed` ones, the others
    /// `Shifted` ones).
    pub(super) fn takes(self, format: Format) -> bool {
        match self {
            Path::Portable => true,
            Path::Avx2 => format == Format::Narrow,
            Path::NeonDotprod | Path::NeonI8mm => format == Format::Signed,
            Path::Avx2Vnni | Path::Avx512 | Path::Avx512Vnni => format == Format::Shifted,
        }
    }

    /// The path's name, for plan listings.
    pub(super) fn name(self) -> &'static str {
        match self {
            Path::Portable => "portable",
            Path::Avx2 => "avx2 vpmaddubsw",
            Path::Avx2Vnni => "avx-vnni vpdpbusd",
            Path::Avx512 => "avx512 vpmaddwd",
            #[cfg(target_arch = "x86_64")]
            Path::Avx512Vnni if cpu::has_amx_int8() => "amx tdpbsud, avx512 vpdpbusd",
            Path::Avx512Vnni => "avx512 vpdpbusd",
            Path::NeonDotprod => "neon sdot",
            Path::NeonI8mm => "neon smmla",
        }
    }

    /// Whether the path's tile applies an [`Epilogue`] (module `avx2`'s store, module
    /// `neon`'s).
    pub(super) fn takes_epilogue(self) -> bool {
        matches!(
            self,
            Path::Avx2 | Path::Avx2Vnni | Path::NeonDotprod | Path::NeonI8mm
        )
    }

    /// How the path's tile takes the quantised activations.
    pub(super) fn bytes(self) -> quantize::Bytes {
        match self {
            Path::Avx2 => quantize::Bytes::Unsigned,
            _ => quantize::Bytes::Signed,
        }
    }
}

/// Whether the tier in use runs an int8 tile other than the portable loops (AVX2 or
/// above, `neon-dotprod` or above): `matmul_packed`'s `simd`.
pub(in crate::kernels::packed) fn simd() -> bool {
    Path::best_for(Format::best()) != Path::Portable
}

/// The name of the tile that multiplies a weight packed here ([`Format::best`]), and
/// whether it applies an [`Epilogue`]: what a plan records of it.
pub(in crate::kernels::packed) fn tile_here() -> (&'static str, bool) {
    let path = Path::best_for(Format::best());
    (path.name(), path.takes_epilogue())
}

/// Whether the tile that multiplies `w` (on the fastest tile the tier in use has when
/// `simd`, as [`part`] picks it) applies an [`Epilogue`] to its results: the AVX2 and
/// aarch64 ones.
pub(in crate::kernels::packed) fn takes_epilogue(w: &PackedI8, simd: bool) -> bool {
    simd && Path::best_for(w.format).takes_epilogue()
}

/// Computes `part` of the product of `g` by `w`, followed by `epilogue` (empty unless
/// [`takes_epilogue`]), on the fastest tile the tier in use has when `simd`, on the
/// portable loops otherwise (see [`part_on`]).
pub(in crate::kernels::packed) fn part(
    g: Matrix<'_>,
    w: &PackedI8,
    epilogue: Epilogue<'_>,
    part: Part,
    simd: bool,
    out: Out,
) {
    let path = if simd {
        Path::best_for(w.format)
    } else {
        Path::Portable
    };
    part_on(path, g, w, epilogue, part, out);
}

/// Computes `part` of the product of `g` by `w` on `path`: its rows a chunk at a time
/// (at most [`CHUNK_ROWS`], and as many as fit in the largest scratch; whole tiles
/// when the part takes more than one chunk), each quantised once into a stack scratch
/// and multiplied by every panel of the part. On the VNNI path, where AMX-INT8 runs
/// (and `kp` is a multiple of `amx::K`), each chunk's whole pairs of 16-row tiles go to
/// the AMX tile instead (`amx::tile_pair`), the other rows to the VNNI tile.
pub(super) fn part_on(
    path: Path,
    g: Matrix<'_>,
    w: &PackedI8,
    epilogue: Epilogue<'_>,
    part: Part,
    out: Out,
) {
    assert!(epilogue.is_empty() || path.takes_epilogue());
    let kp = w.kp;
    let chunk = chunk_rows(part.rows.1 - part.rows.0, kp, SCRATCH);
    #[cfg(target_arch = "x86_64")]
    let tiles = (path == Path::Avx512Vnni
        && kp.is_multiple_of(amx::K)
        && part.rows.1 - part.rows.0 >= amx::ROWS
        && cpu::has_amx_int8())
    .then(|| {
        // SAFETY: AMX is granted (`has_amx_int8`).
        unsafe { amx::Regs::configure() }
    });
    let job = Chunked {
        g,
        w,
        epilogue,
        part,
        path,
        chunk,
        #[cfg(target_arch = "x86_64")]
        tiles: tiles.as_ref(),
    };
    with_stack(chunk * kp, |qa: &mut [i8]| chunks(&job, qa, out));
}

/// The AMX tile registers, configured, where the AMX tile runs.
#[cfg(target_arch = "x86_64")]
pub(super) type Regs = amx::Regs;

/// A part of a product, taken `chunk` rows at a time.
pub(super) struct Chunked<'a> {
    pub(super) g: Matrix<'a>,
    pub(super) w: &'a PackedI8,
    /// What the tiles apply to their results before they store them.
    pub(super) epilogue: Epilogue<'a>,
    pub(super) part: Part,
    pub(super) path: Path,
    pub(super) chunk: usize,
    /// The AMX tile registers when the AMX tile takes whole pairs of row tiles.
    #[cfg(target_arch = "x86_64")]
    pub(super) tiles: Option<&'a Regs>,
}

/// Most bytes of the stack scratch of one chunk of quantised rows (256 KiB).
pub(super) const SCRATCH: usize = 256 << 10;

/// Runs the part `job.chunk` rows at a time with the scratch `qa` (`chunk * kp`
/// bytes).
pub(super) fn chunks(job: &Chunked<'_>, qa: &mut [i8], out: Out) {
    let (g, kp) = (job.g, job.w.kp);
    assert!((1..=CHUNK_ROWS).contains(&job.chunk) && qa.len() == job.chunk * kp);
    let mut sa = [0f32; CHUNK_ROWS];
    let mut sums = [0i32; CHUNK_ROWS];
    let (mut r0, end) = job.part.rows;
    while r0 < end {
        let rows = job.chunk.min(end - r0);
        let qa = &mut qa[..rows * kp];
        for (i, (q, (s, sum))) in qa
            .chunks_exact_mut(kp)
            .zip(sa.iter_mut().zip(&mut sums))
            .enumerate()
        {
            let start = (r0 + i) * g.lda;
            (*s, *sum) = quantize::row(job.path, &g.a[start..], g.cs, g.k, q);
        }
        for pj in job.part.panels.0..job.part.panels.1 {
            let rows = Rows {
                qa,
                sa: &sa[..rows],
                sums: &sums[..rows],
                first: r0,
            };
            panel(job, pj, rows, out);
        }
        r0 += rows;
    }
}

/// One chunk of quantised rows: `qa` holds them (`kp` bytes each), `sa` their scales,
/// `sums` their sums of quantised values, `first` the index of the first.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub(super) qa: &'a [i8],
    pub(super) sa: &'a [f32],
    pub(super) sums: &'a [i32],
    pub(super) first: usize,
}

/// Computes the columns of panel `pj` for the rows of `rows`, tile by tile.
pub(super) fn panel(job: &Chunked<'_>, pj: usize, rows: Rows<'_>, dst: Out) {
    let (w, kp) = (job.w, job.w.kp);
    let at = job.part.cols(pj);
    let b = &w.data[pj * kp * NR..(pj + 1) * kp * NR];
    let per = w.groups() * NR;
    let sw = &w.scales[pj * per..(pj + 1) * per];
    let cols = w.sums.get(pj * per..(pj + 1) * per).unwrap_or(&[]);
    let tile_of = |r0: usize, h: usize| Tile {
        qa: &rows.qa[r0 * kp..(r0 + h) * kp],
        kp,
        sa: &rows.sa[r0..r0 + h],
        sums: &rows.sums[r0..r0 + h],
        format: w.format,
        group: w.group,
        b,
        sw,
        cols,
        epilogue: job.epilogue,
        row0: rows.first + r0,
        j0: at.j0,
        at: (rows.first + r0) * at.ldc + at.j0,
        width: at.width,
        ldc: at.ldc,
    };
    // Whole pairs of row tiles on AMX, where it runs; the rest on the tile below.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut first = 0;
    #[cfg(target_arch = "x86_64")]
    if let Some(tiles) = job.tiles {
        while rows.sa.len() - first >= amx::ROWS {
            amx::tile_pair(tiles, &tile_of(first, amx::ROWS), dst);
            first += amx::ROWS;
        }
    }
    Part::blocks(first, rows.sa.len() - first, |r0, h| {
        let t = tile_of(r0, h);
        macro_rules! call {
            ($r:literal) => {
                tile::<$r>(job.path, &t, dst)
            };
        }
        by_rows!(h, call!());
    });
}

/// One tile's operands: `R` quantised rows (`kp` bytes each) with their scales and
/// sums, the panel `b` (`kp / 4` quads, in `format`) with its 32 column scales per
/// group of `group` rows of `k` (`sw[g * NR + c]`; and, `Narrow`, its column sums
/// `cols` laid out alike; empty otherwise), the epilogue its results take (row `i` is
/// row `row0 + i` of the product, its columns start at `j0`), and where the tile goes
/// in the output (row `i`'s `width` columns at `at + i * ldc`).
pub(super) struct Tile<'a> {
    pub(super) qa: &'a [i8],
    pub(super) kp: usize,
    pub(super) sa: &'a [f32],
    pub(super) sums: &'a [i32],
    pub(super) format: Format,
    pub(super) group: usize,
    pub(super) b: &'a [u8],
    pub(super) sw: &'a [f32],
    pub(super) cols: &'a [i32],
    // (Read by the AVX2 and NEON tiles only: the portable loops leave the epilogue to
    // the caller.)
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(super) epilogue: Epilogue<'a>,
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(super) row0: usize,
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(super) j0: usize,
    pub(super) at: usize,
    pub(super) width: usize,
    pub(super) ldc: usize,
}

impl Tile<'_> {
    /// Scale groups along `k`.
    pub(super) fn groups(&self) -> usize {
        self.kp.div_ceil(self.group)
    }

    /// Rows `i0..i0 + h` of the tile, as a tile of their own (the same panel and
    /// columns). Panics when they are not inside it.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn rows(&self, i0: usize, h: usize) -> Tile<'_> {
        Tile {
            qa: &self.qa[i0 * self.kp..(i0 + h) * self.kp],
            kp: self.kp,
            sa: &self.sa[i0..i0 + h],
            sums: &self.sums[i0..i0 + h],
            format: self.format,
            group: self.group,
            b: self.b,
            sw: self.sw,
            cols: self.cols,
            epilogue: self.epilogue,
            row0: self.row0 + i0,
            j0: self.j0,
            at: self.at + i0 * self.ldc,
            width: self.width,
            ldc: self.ldc,
        }
    }
}

/// `dst[i][j0..j0 + width] = qa[i] · b`, scaled, for the tile's `R` rows, on `path`.
pub(super) fn tile<const R: usize>(path: Path, t: &Tile<'_>, dst: Out) {
    // The bounds every access below relies on, checked once (a failed check is a bug of
    // this module, caught at the kernel boundary as a panic).
    assert!((1..=MR).contains(&R) && t.width >= 1 && t.width <= NR);
    assert!(t.kp >= 4 && t.kp.is_multiple_of(4) && t.b.len() == t.kp * NR);
    assert!(t.qa.len() == R * t.kp && t.sa.len() == R && t.sums.len() == R);
    assert!(t.group >= 4 && t.group.is_multiple_of(4));
    assert!(t.sw.len() == t.groups() * NR);
    assert!(
        t.cols.len()
            == if t.format == Format::Narrow {
                t.sw.len()
            } else {
                0
            }
    );
    // The tiles other than the portable and AVX2 ones take one group (`Shifted`).
    assert!(matches!(path, Path::Portable | Path::Avx2) || t.sw.len() == NR);
    assert!(t.at <= dst.len && (R - 1) * t.ldc + t.width <= dst.len - t.at);
    let at = Cols {
        j0: t.j0,
        width: t.width,
        ldc: t.ldc,
    };
    check_epilogue(t.epilogue, at, t.row0 + R);
    assert!(path.runs(), "the {path:?} int8 tile on a CPU without it");
    assert!(
        path.takes(t.format),
        "{:?} weights on the {path:?} tile",
        t.format
    );
    // Each call below: the CPU has the path's features (asserted), the asserts above
    // are the bounds the tiles document, and this tile's elements of `dst` are written
    // by no one else (see `Out`).
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: as said above, for AVX512_VNNI.
        Path::Avx512Vnni => return unsafe { avx512::tile::<R>(t, dst.ptr) },
        // SAFETY: as said above, for AVX-512F and BW.
        Path::Avx512 => return unsafe { avx512::tile_bw::<R>(t, dst.ptr) },
        // SAFETY: as said above, for AVX-VNNI.
        Path::Avx2Vnni => return unsafe { avx2::tile_vnni::<R>(t, dst.ptr) },
        // SAFETY: as said above, for AVX2.
        Path::Avx2 => return unsafe { avx2::tile::<R>(t, dst.ptr) },
        Path::Portable => {}
        Path::NeonDotprod | Path::NeonI8mm => unreachable!("asserted: the CPU runs it"),
    }
    #[cfg(target_arch = "aarch64")]
    match path {
        // SAFETY: as said above, for the dot product instructions.
        Path::NeonDotprod => return unsafe { neon::tile_sdot::<R>(t, dst.ptr) },
        // SAFETY: as said above, for the int8 matrix instructions.
        Path::NeonI8mm => return unsafe { neon::tile_smmla::<R>(t, dst.ptr) },
        Path::Portable => {}
        _ => unreachable!("asserted: the CPU runs it"),
    }
    let mut rows = [[0f32; NR]; R];
    portable::tile::<R>(t, &mut rows);
    for (i, row) in rows.iter().enumerate() {
        // SAFETY: the elements are row i's columns of the tile, inside `dst`
        // (asserted above) and written by no one else (see `Out`).
        let part = unsafe { dst.part(t.at + i * t.ldc, t.width) };
        part.copy_from_slice(&row[..t.width]);
    }
}
