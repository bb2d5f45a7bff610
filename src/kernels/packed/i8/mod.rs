//! The int8 form of a packed weight ([`PackedI8`], made by `PackedRhs::pack_i8`) and
//! the part of a product by it that one thread computes ([`part`]; `matmul_packed`
//! splits the product).
//!
//! **Weights.** A `[k, n]` f32 weight is quantised symmetrically per output column:
//! `sw[j] = max_p |w[p, j]| / L` and `q[p, j] = round(w[p, j] / sw[j])` in `-L..=L`
//! (ties to even; an all-zero column has scale 0 and zeros), in one of two
//! [`Format`]s, the one the tier's tile takes, picked when the weight is packed:
//! `Shifted`, 8 bits (`L` = 127) stored **shifted to u8** (`q + 128`), on x86-64 but
//! plain AVX2 and on aarch64 without `sdot`; `Signed`, the same 8-bit values stored as
//! signed bytes, where aarch64's `sdot` runs (module `neon`); `Narrow`, 7 bits (`L` =
//! 63) stored as signed bytes, with a scale and a `Σ_p q` per column and **group** of
//! [`NARROW_GROUP`] rows of `k` (the max taken over the group), on AVX2 without VNNI or
//! AVX-512 (module `avx2` says why). The
//! bytes lie in the layout the tile streams: panels of [`NR`] = 32 columns; in a
//! panel, `k` in quads of 4 (`kp = k` rounded up to 4), and for each quad the 4 bytes
//! of column 0, then of column 1, …: `[n/32][kp/4][32][4]`, zero weights in the
//! padding. One quad of a panel is two 64-byte vectors, one per 16 columns.
//!
//! **Activations** are quantised inside the kernel, dynamically, **per row** (per
//! token; module `quantize`): `sa[i] = max_p |a[i, p]| / 127`, `qa[i, p] = round(a[i,
//! p] / sa[i])`, signed. A tile keeps i32 accumulators of **exact** integer sums and
//! converts once per scale group: `out[i, j] = (Σ_g (Σ_{p in g} qa[i, p] · q[p, j]) as
//! f32 · sw[g, j]) · sa[i]` (one group for `Shifted` weights: `((Σ_p qa · q) as f32 ·
//! sw[j]) · sa[i]`; later groups added with fused multiply-adds). The sums are exact on every path (wrapping i32 arithmetic, whose result is
//! exact since `|Σ qa·q| ≤ 127²·k < 2³¹` for `k ≤` [`MAX_K`]) and the conversion is
//! the same, so **every path gives the same bits** on a weight in a given format (the
//! tests hold each tile to the portable one on every format). A row holding a NaN or
//! an infinity gives a row of NaN.
//!
//! **Paths**, one per tier ([`Path`]; the tier in use picks the fastest it has for the
//! weight's format):
//!
//! - `avx512-vnni` (module `avx512`): `vpdpbusd` on zmm, four u8 × s8 products summed
//!   into each i32 lane, the weight as the unsigned operand and four activation bytes
//!   broadcast from memory as the signed one; the shift of the weight taken off with
//!   the row sums, `Σ qa·(q + 128) - 128 Σ qa = Σ qa·q`. With AMX-INT8, whole pairs of
//!   16-row tiles on AMX (module `amx`, below).
//! - `avx2-vnni` (module `avx2`): the same on ymm (VEX `vpdpbusd`).
//! - `avx512` without VNNI (module `avx512`): bytes widened to i16, `vpmaddwd`.
//! - `avx2` (module `avx2`), on `Narrow` weights: `vpmaddubsw` of the activations
//!   shifted to u8 by the 7-bit weights, whose saturating i16 pair sums then never
//!   saturate; the shift taken off with the weight's column sums.
//! - `neon-i8mm` (module `neon`), on `Signed` weights: `smmla`, a 2 × 8 by 8 × 2
//!   product of signed bytes into four i32 sums, rows and columns in pairs;
//!   `neon-dotprod`: `sdot`, four s8 × s8 products summed into each i32 lane. Both
//!   apply the chains' epilogue as the f32 tile does. On plain `neon` (no `sdot`) the
//!   portable loops: the widest exact NEON form there, `smull` and `sadalp` (16
//!   multiply-adds in two instructions), is no faster than the f32 tile's `fmla`, so
//!   the models keep such weights in f32 (`models::Precision::fast_here`). Checked
//!   under emulation only (`scripts/test-aarch64.sh`), not timed on hardware.
//! - `portable` (module `portable`): plain integer loops over the same layout, any
//!   format (any CPU, or `STREAMFUSE_ISA=portable`).
//!
//! **Scratch.** The quantised activations live on the stack, never the heap: rows are
//! taken in **chunks** (at most 252 rows and, for long rows, as many as fit in 256 KiB),
//! each quantised once into a stack buffer (16, 64 or 256 KiB, the smallest that holds
//! it, so small products do not clear a large one), then multiplied by every panel of
//! the part of the weight this thread computes (in a split by columns every thread
//! quantises all the rows itself: at most 128 of them). A call allocates nothing; a weight is
//! re-read from cache once per chunk (its int8 form, a quarter of the f32 one, fits in
//! the L2 for MiniLM's shapes).
//!
//! **Accuracy.** The error against the product by the dequantised weight is at most
//! half an activation step per element, `sa[i] / 2 · Σ_p |ŵ[p, j]|` (the tests assert
//! it). Against the f32 product, the cosine per row: ≥ 0.999 on synthetic rows shaped
//! like BERT's hidden states (layer-normed, three channels 10–20× larger; a test asserts
//! it); on MiniLM-L6's 36 real weights (the ignored test `minilm_weights_cosine`: real
//! embeddings into layer 0, rows through each layer's LayerNorm weights, GELU outputs
//! into the FFN's second product; 64 rows each), minimum 0.9983 and median 0.99994 over
//! the 2304 rows, the lowest in the FFN's second product (k = 1536, GELU inputs). Per-row
//! scales are enough there; per-group scales along `k` were not needed. `Narrow`
//! weights (the AVX2 tier's) halve the weight's resolution, which per-group scales win
//! back: minimum 0.99912 and median 0.99989 over the same rows (0.9945 and 0.99984 with
//! one scale per column), ≥ 0.999 on the synthetic rows.
//!
//! **Speed** of the VNNI path, measured on one core of this project's Zen 4 EPYC (thread CPU time from
//! `/proc/thread-self/schedstat`, median of 7 rounds alternating the two kernels, a
//! pass over MiniLM-L6's 24 weights as in `benches/lowp.rs`): 28 rows 1.52 ms (390
//! GOP/s) against the f32 packed kernel's 5.81 ms (102 GFLOP/s), 3.8×; 896 rows 51.9
//! ms (366 GOP/s) against 171.6 ms (111 GFLOP/s), 3.3×. The int8 peak of a core is
//! about 4 × the f32 one (≈ 456 GOP/s at 3.56 GHz): the tile runs at about 80% of it.
//! Quantising the activations (O(m·k): a max pass and a rounding pass per row, both
//! vectorised) takes about 7% of the pass at 28 rows and 6% at 896 (perf, on products
//! by one 32-column panel); its byte stores (`vpmovdb`) are the first thing to improve.
//!
//! **AMX.** Where the CPU has AMX-INT8 (and `kp` is a multiple of 64), each chunk's
//! whole pairs of 16-row tiles are multiplied on AMX tiles instead (`amx::tile_pair`):
//! `tdpbsud` takes the signed activation bytes as its first operand (16 rows × 64
//! bytes of `k`, straight from the chunk's rows) and the panel's unsigned bytes as its
//! second (16 quads × 16 columns, the panel's own layout read with a stride of 128
//! bytes), four products summed into each i32 as `vpdpbusd` does; the accumulators go
//! through the same conversion, so every path gives the same bits (the tests hold
//! them to it). The rows left over (fewer than 32 in a chunk: one sentence's) stay on
//! the VNNI tile. Measured on this project's Xeon (a pass over MiniLM's 24 weights,
//! one thread, medians of 21): 896 rows 395 → 453 GOP/s, 224 rows 436 → 493;
//! all-MiniLM-L6-v2 in int8 at batch 32 (binaries alternated, 3 pairs) 770 → 905
//! sentences/s. The tile is held back by its loads (four 1 KiB tiles per four
//! products), as the bf16 one is (module `tiles`).
//!
//! `unsafe` is confined to the vector tiles' and quantisers' loads and stores (bounds
//! checked once before their loops), to calling the `#[target_feature]` functions
//! after the CPU check ([`Path::runs`]), to writing the output through the raw pointer
//! that the split by columns shares between threads (disjoint columns), and to the AMX
//! tile loop and aarch64's `sdot` and `smmla` (`asm!`).

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;
mod portable;
mod quantize;
mod walk;

use super::NR;
use crate::ir::Layout;
use crate::kernels::cpu;
use crate::kernels::{check_input, error, KernelError};
use walk::Tile;
#[cfg(test)]
use walk::PATHS;
pub(super) use walk::{part, simd, takes_epilogue, tile_here, Path};

/// The largest `k` a weight may have: the exact integer sums fit in i32 up to it.
pub(super) const MAX_K: usize = 1 << 17;
/// Bytes of one quad of one panel (4 bytes of each of its 32 columns).
const QUAD: usize = 4 * NR;
/// The zero of a weight byte (weights are stored shifted to u8).
const ZERO: u8 = 128;

/// How a packed weight's bytes hold its quantised values `q`: the operand the tier's
/// tile multiplies. The format is picked when the weight is packed ([`Format::best`]:
/// the tier in use's), so the weight is packed once, in the form its products take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    /// 8 bits: `q` in `-127..=127`, stored shifted to u8 (`q + 128`), the unsigned
    /// operand of `vpdpbusd` and `tdpbsud` (VNNI, AMX), widened on AVX-512 without VNNI.
    Shifted,
    /// 7 bits: `q` in `-63..=63`, stored as signed bytes, with each column's `Σ_p q`:
    /// the signed operand of AVX2's `vpmaddubsw` by the activations shifted to u8
    /// (`qa + 128`), whose i16 pair sums then cannot saturate (`2 · 255 · 63 = 32130 <
    /// 2¹⁵`); the column sums take the activations' shift off. Half the weight's
    /// resolution, as ONNX Runtime's `reduce_range` and oneDNN's weight scaling on
    /// CPUs without VNNI.
    Narrow,
    /// 8 bits: `q` in `-127..=127`, stored as signed bytes: the operand of aarch64's
    /// `sdot` and `smmla`, which multiply signed bytes by signed bytes (module `neon`).
    /// The same values and scales as `Shifted`, so the same products, bit for bit.
    Signed,
}

impl Format {
    /// The largest `|q|`.
    fn levels(self) -> f32 {
        match self {
            Format::Shifted | Format::Signed => 127.0,
            Format::Narrow => 63.0,
        }
    }

    /// Rows of `k` that share a scale, for a weight of `kp` rows: all of them for
    /// `Shifted`; [`NARROW_GROUP`] for `Narrow`.
    fn group(self, kp: usize) -> usize {
        match self {
            Format::Shifted | Format::Signed => kp.max(4),
            Format::Narrow => NARROW_GROUP,
        }
    }

    /// The byte that stores `q`.
    fn encode(self, q: i32) -> u8 {
        match self {
            Format::Shifted => (q as u8) ^ ZERO,
            Format::Narrow | Format::Signed => q as u8,
        }
    }

    /// The `q` a stored byte holds.
    #[inline(always)]
    fn decode(self, byte: u8) -> i8 {
        match self {
            Format::Shifted => (byte ^ ZERO) as i8,
            Format::Narrow | Format::Signed => byte as i8,
        }
    }

    /// The format of the fastest path the tier in use has: `Signed` where aarch64's
    /// `sdot` runs (`neon-dotprod` and above); `Narrow` on AVX2 without VNNI or AVX-512
    /// (where an exact 8-bit product would cost a `vpsignb` per `vpmaddubsw`: see
    /// module `avx2`); `Shifted` everywhere else (the portable loops take any at the
    /// same speed, so there an 8-bit one).
    pub(super) fn best() -> Format {
        if cpu::has_dotprod() {
            Format::Signed
        } else if Path::best_for(Format::Shifted) == Path::Portable && cpu::has_avx2() {
            Format::Narrow
        } else {
            Format::Shifted
        }
    }
}

/// Rows of `k` that share a scale in a `Narrow` weight (16 quads). all-MiniLM-L6-v2's
/// embeddings of `scripts/data/sentences-512.txt` against its f32 ones, minimum
/// cosine: from the 7-bit weights alone (their dequantised values in the f32 model),
/// 0.99468 with a scale per column over all of `k` (the FFN outputs, `k` = 1536, have
/// columns whose largest weight is 4 to 38 times their RMS), 0.99737 in groups of
/// 128, 0.99835 in groups of 64 (8-bit weights per column: 0.99872); the int8 model on
/// the AVX2 tier: 0.98999 per column (below the 0.99 of [`crate::models::Precision`]),
/// 0.99163 in groups of 128, 0.99318 in groups of 64 (8-bit weights per column, the
/// other tiers': 0.99234). Each group costs its sums' conversion (module `avx2`): a
/// pass over MiniLM's weight shapes at 896 rows, one thread, 88.2 GOP/s in one group,
/// 85.4 in groups of 128, 81.4 in groups of 64.
pub(super) const NARROW_GROUP: usize = 64;

/// A `[k, n]` f32 weight quantised to int8 with one f32 scale per column, packed for
/// the products of `matmul_packed` (see the module doc for the layout) in a [`Format`].
/// Made once per weight; the layout is the same on every CPU.
#[derive(Debug)]
pub(super) struct PackedI8 {
    k: usize,
    n: usize,
    /// `k` rounded up to a multiple of 4.
    kp: usize,
    /// How `data` holds the quantised values.
    format: Format,
    /// Rows of `k` that share a scale ([`Format::group`]): a multiple of 4.
    group: usize,
    /// `ceil(n / NR)` panels of `kp * NR` bytes, each `q` as `format` stores it.
    data: Vec<u8>,
    /// One scale per column and group of `group` rows of `k`, `[ceil(n / NR)][groups][NR]`
    /// (0 in the padding).
    scales: Vec<f32>,
    /// `Narrow`: each column's `Σ_p q` over each group, laid out as the scales (0 in
    /// the padding); `Shifted`: empty.
    sums: Vec<i32>,
}

impl PackedI8 {
    /// Quantises and packs the `[k, n]` weight that `layout` reads from `src` (any
    /// strides and offset) in the format of the tier in use ([`Format::best`]).
    /// Errors when the layout is not 2-D or does not fit `src`, when `k` exceeds
    /// [`MAX_K`], when a weight is not finite, or when the memory cannot be had.
    pub(super) fn quantize(src: &[f32], layout: &Layout) -> Result<PackedI8, KernelError> {
        Self::quantize_as(Format::best(), src, layout)
    }

    /// [`PackedI8::quantize`] in `format`: `sw[j] = max_p |w[p, j]| / L`, `q[p, j] =
    /// round(w[p, j] / sw[j])` for `L` = [`Format::levels`].
    fn quantize_as(format: Format, src: &[f32], layout: &Layout) -> Result<PackedI8, KernelError> {
        let kernel = "quantize_i8";
        check_input(kernel, "weight", src.len(), layout)?;
        if layout.dims.len() != 2 {
            return Err(error(
                kernel,
                format_args!("weight dims {:?} are not [k, n]", layout.dims),
            ));
        }
        let (k, n) = (layout.dims[0], layout.dims[1]);
        if k > MAX_K {
            return Err(error(
                kernel,
                format_args!("k = {k} exceeds {MAX_K}, beyond which i32 sums may overflow"),
            ));
        }
        let (rs, cs) = (layout.strides[0], layout.strides[1]);
        let at = |p: usize, j: usize| src[layout.offset + p * rs + j * cs];
        let kp = k.next_multiple_of(4);
        let panels = n.div_ceil(NR);
        let len = panels
            .checked_mul(kp)
            .and_then(|x| x.checked_mul(NR))
            .ok_or_else(|| error(kernel, "packed size overflows"))?;
        let refused = |what: &str, bytes: usize| {
            error(
                kernel,
                format_args!("cannot allocate {bytes} bytes for the {what}"),
            )
        };
        let levels = format.levels();
        let group = format.group(kp);
        let groups = kp.div_ceil(group).max(1);
        // Scales (and `Narrow` column sums): `[panels][groups][NR]`.
        let count = panels * groups * NR;
        let mut scales = Vec::new();
        scales
            .try_reserve_exact(count)
            .map_err(|_| refused("scales", count * 4))?;
        scales.resize(count, 0.0f32);
        let mut sums = Vec::new();
        if format == Format::Narrow {
            sums.try_reserve_exact(count)
                .map_err(|_| refused("column sums", count * 4))?;
            sums.resize(count, 0i32);
        }
        let mut data = Vec::new();
        data.try_reserve_exact(len)
            .map_err(|_| refused("packed weight", len))?;
        data.resize(len, format.encode(0));
        for j in 0..n {
            let (pj, jj) = (j / NR, j % NR);
            for g in 0..groups {
                let rows = g * group..((g + 1) * group).min(k);
                let mut max = 0.0f32;
                for p in rows.clone() {
                    let w = at(p, j);
                    if !w.is_finite() {
                        return Err(error(
                            kernel,
                            format_args!("weight [{p}, {j}] is {w}, not finite"),
                        ));
                    }
                    max = max.max(w.abs());
                }
                let at_scale = (pj * groups + g) * NR + jj;
                scales[at_scale] = max / levels;
                let inv = inverse_step(scales[at_scale] * levels, levels);
                let mut sum = 0i32;
                for p in rows {
                    let q = round_to_i8(at(p, j) * inv);
                    data[pj * kp * NR + (p / 4) * QUAD + jj * 4 + p % 4] = format.encode(q);
                    sum += q;
                }
                if let Some(s) = sums.get_mut(at_scale) {
                    *s = sum;
                }
            }
        }
        Ok(PackedI8 {
            k,
            n,
            kp,
            format,
            group,
            data,
            scales,
            sums,
        })
    }

    /// Scale groups along `k` (at least 1).
    fn groups(&self) -> usize {
        self.kp.div_ceil(self.group).max(1)
    }

    /// The scale of weight `[p, j]`.
    fn scale(&self, p: usize, j: usize) -> f32 {
        self.scales[((j / NR) * self.groups() + p / self.group) * NR + j % NR]
    }

    /// The `[k, n]` weight as the kernel sees it (`q * scale`), row-major, or `None`
    /// when the memory cannot be had.
    pub(super) fn dequantize(&self) -> Option<Vec<f32>> {
        let (k, n) = (self.k, self.n);
        let mut out = Vec::new();
        out.try_reserve_exact(k.checked_mul(n)?).ok()?;
        for p in 0..k {
            for j in 0..n {
                out.push(self.weight(p, j) as f32 * self.scale(p, j));
            }
        }
        Some(out)
    }

    /// The quantised weight `q[p, j]`.
    fn weight(&self, p: usize, j: usize) -> i8 {
        let at = (j / NR) * self.kp * NR + (p / 4) * QUAD + (j % NR) * 4 + p % 4;
        self.format.decode(self.data[at])
    }

    /// Bytes held (the packed weight, its scales and column sums).
    pub(super) fn bytes(&self) -> usize {
        self.data.capacity()
            + self.scales.capacity() * std::mem::size_of::<f32>()
            + self.sums.capacity() * std::mem::size_of::<i32>()
    }
}

/// `levels / max`, the factor that maps `[-max, max]` onto `[-levels, levels]`; 0 for
/// `max == 0`.
fn inverse_step(max: f32, levels: f32) -> f32 {
    if max > 0.0 {
        levels / max
    } else {
        0.0
    }
}

/// `1.5 · 2²³`: adding it to an f32 of magnitude below 2²² rounds it to an integer (ties
/// to even), held in the low bits of the sum.
pub(super) const MAGIC: f32 = 12_582_912.0;

/// `x` (expected in `[-127, 127]`, clamped to it) rounded to the nearest integer, ties
/// to even. Pure f32 and bit arithmetic, so every path rounds alike and it vectorises.
#[inline(always)]
pub(super) fn round_to_i8(x: f32) -> i32 {
    let y = x.clamp(-127.0, 127.0);
    ((y + MAGIC).to_bits() as i32) - (MAGIC.to_bits() as i32)
}

#[cfg(test)]
mod tests {
    use super::super::{by_rows, Epilogue, Matrix, Out, Part, MR};
    use super::walk::{part_on, tile, PATHS};
    use super::*;
    use crate::kernels::testutil::*;
    use crate::kernels::Par;

    /// Every format, the tier's own first.
    fn formats() -> [Format; 3] {
        let mut all = [Format::Shifted, Format::Narrow, Format::Signed];
        let own = all.iter().position(|&f| f == Format::best());
        all.swap(0, own.expect("the tier's format is one of them"));
        all
    }

    /// The product by `w` through the module's caller (as the engine runs it): on the
    /// fastest tile of the tier in use when `simd`, on the portable loops otherwise.
    fn matmul_on(
        simd: bool,
        a: &[f32],
        al: &Layout,
        w: &PackedI8,
        out: &mut [f32],
        par: Par,
    ) -> Result<(), KernelError> {
        let form = super::super::Form::I8(w);
        super::super::product(a, al, (w.k, w.n), (form, simd), &[], None, out, par)
    }

    /// The product by `w` on `path`, on one thread, straight through [`part_on`]
    /// (batch by batch), whatever tier the environment forces.
    fn product_on(path: Path, a: &[f32], al: &Layout, w: &PackedI8) -> Vec<f32> {
        product_then(path, a, al, w, &[])
    }

    /// [`product_on`] with `epilogue` applied by the tiles (a path that takes one).
    fn product_then(
        path: Path,
        a: &[f32],
        al: &Layout,
        w: &PackedI8,
        epilogue: Epilogue<'_>,
    ) -> Vec<f32> {
        let r = al.dims.len();
        let (m, k) = (al.dims[r - 2], al.dims[r - 1]);
        let batch: usize = al.dims[..r - 2].iter().product();
        let lda = if m > 1 { al.strides[r - 2] } else { 0 };
        let cs = if k > 1 { al.strides[r - 1] } else { 1 };
        let mut out = vec![f32::NAN; batch * m * w.n];
        for (b, dst) in out.chunks_exact_mut(m * w.n).enumerate() {
            let base = crate::kernels::strided::offset_of(
                &al.dims[..r - 2],
                &al.strides[..r - 2],
                al.offset,
                b,
            );
            let g = Matrix {
                a: &a[base..base + (m - 1) * lda + (k - 1) * cs + 1],
                lda,
                cs,
                k,
            };
            let part = Part {
                rows: (0, m),
                panels: (0, w.n.div_ceil(NR)),
                n: w.n,
            };
            part_on(path, g, w, epilogue, part, Out::new(dst));
        }
        out
    }

    /// Runs the product on the tier in use's fastest tile and on the portable loops,
    /// on 1 to 3 threads, and on every path this CPU runs (one thread), checks that
    /// they all give the same bits, and returns the result.
    fn product(a: &[f32], al: &Layout, w: &PackedI8) -> Vec<f32> {
        let r = al.dims.len();
        let len = al.dims[..r - 1].iter().product::<usize>() * w.n;
        let mut first: Option<Vec<f32>> = None;
        let mut same = |out: Vec<f32>, what: &str| match &first {
            None => first = Some(out),
            Some(f) => {
                let same = f.iter().zip(&out).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{what} differs");
            }
        };
        for simd in [true, false] {
            for threads in [1, 2, 3] {
                let mut out = vec![f32::NAN; len];
                matmul_on(simd, a, al, w, &mut out, Par { threads }).unwrap();
                same(out, &format!("simd {simd} with {threads} threads"));
            }
        }
        if k_of(al) > 0 {
            for path in PATHS.into_iter().filter(|p| p.runs() && p.takes(w.format)) {
                same(product_on(path, a, al, w), &format!("{path:?}"));
            }
        }
        first.unwrap()
    }

    /// The `k` of the left operand `al`.
    fn k_of(al: &Layout) -> usize {
        *al.dims.last().unwrap()
    }

    /// Runs [`product`] and checks it with [`assert_within_step`].
    fn check(a: &[f32], al: &Layout, w: &PackedI8) {
        let got = product(a, al, w);
        assert_within_step(&got, &rows_of(a, al), w);
    }

    /// A random `[m, k]` times a random `[k, n]` weight, checked.
    fn check_random(rng: &mut Rng, m: usize, k: usize, n: usize) {
        let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
        let w: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
        for format in formats() {
            let q = PackedI8::quantize_as(format, &w, &Layout::contiguous(&[k, n])).unwrap();
            check(&a, &Layout::contiguous(&[m, k]), &q);
        }
    }

    /// The rows of `a` (`[.., m, k]` through `al`) as `rows × k`, row-major.
    fn rows_of(a: &[f32], al: &Layout) -> Vec<Vec<f32>> {
        let k = *al.dims.last().unwrap();
        gather(a, al).chunks(k).map(<[f32]>::to_vec).collect()
    }

    /// Checks `got` (rows of `n`) against the product of the rows by the dequantised
    /// weight in f64. The bound: each activation is off by at most half its row's step
    /// `sa = max|a| / 127` (plus the f32 rounding of `127 / max`, < 1e-4 of a step),
    /// so an output is off by at most `0.5001 · sa · Σ_p |ŵ[p, j]|`; the integer sum
    /// is exact and the three f32 roundings of the scaling add `4e-7 · Σ_p |a ŵ|`.
    fn assert_within_step(got: &[f32], rows: &[Vec<f32>], w: &PackedI8) {
        let (k, n) = (w.k, w.n);
        let wd = w.dequantize().unwrap();
        for (i, row) in rows.iter().enumerate() {
            let sa = row.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64 / 127.0;
            for j in 0..n {
                let (mut want, mut abs_w, mut abs_aw) = (0.0f64, 0.0f64, 0.0f64);
                for p in 0..k {
                    let (x, y) = (row[p] as f64, wd[p * n + j] as f64);
                    want += x * y;
                    abs_w += y.abs();
                    abs_aw += (x * y).abs();
                }
                let tol = 0.5001 * sa * abs_w + 4e-7 * abs_aw + 1e-30;
                let g = got[i * n + j] as f64;
                assert!(
                    (g - want).abs() <= tol,
                    "row {i} col {j}: got {g}, want {want} (tol {tol})"
                );
            }
        }
    }

    #[test]
    fn quantize_round_trips_within_half_a_step() {
        let mut rng = Rng::new(1);
        // k = 13: one scale group in either format; k = 150: three `Narrow` groups (64,
        // 64 and 22 rows).
        for (k, n) in [(13, 37), (150, 37)] {
            let mut w: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
            // Column 5 all zero, column 6 one non-zero, column 7 zero in its second
            // group only.
            for p in 0..k {
                w[p * n + 5] = 0.0;
                w[p * n + 6] = if p == 3 { -2.5 } else { 0.0 };
                if (64..128).contains(&p) {
                    w[p * n + 7] = 0.0;
                }
            }
            let l = Layout::contiguous(&[k, n]);
            for format in formats() {
                round_trip(&w, &l, format);
            }
        }
    }

    /// Quantises `w` (`l`) in `format` and checks each scale (its group's largest
    /// magnitude / levels), each value (within half its step), the column sums and the
    /// padding.
    fn round_trip(w: &[f32], l: &Layout, format: Format) {
        let (k, n) = (l.dims[0], l.dims[1]);
        let q = PackedI8::quantize_as(format, w, l).unwrap();
        let (levels, group) = (format.levels(), q.group);
        assert_eq!((q.k, q.n), (k, n));
        assert!(q.bytes() >= k.next_multiple_of(4) * n.next_multiple_of(32));
        assert_eq!(
            q.groups(),
            if format == Format::Narrow {
                k.div_ceil(64)
            } else {
                1
            }
        );
        let d = q.dequantize().unwrap();
        for j in 0..n {
            for p0 in (0..k).step_by(group) {
                let rows = p0..(p0 + group).min(k);
                let max = rows.clone().fold(0.0f32, |m, p| m.max(w[p * n + j].abs()));
                assert_eq!(q.scale(p0, j), max / levels);
                for p in rows.clone() {
                    let e = (d[p * n + j] - w[p * n + j]).abs();
                    assert!(
                        e <= 0.5001 * max / levels,
                        "{format:?} [{p}, {j}] off by {e}"
                    );
                    assert!(q.weight(p, j).abs() as f32 <= levels);
                }
                // The column sums of a `Narrow` weight, per group.
                if format == Format::Narrow {
                    let sum: i32 = rows.map(|p| q.weight(p, j) as i32).sum();
                    let at = ((j / NR) * q.groups() + p0 / group) * NR + j % NR;
                    assert_eq!(q.sums[at], sum);
                }
            }
        }
        assert!((0..k).all(|p| d[p * n + 5] == 0.0));
        assert!((64..128.min(k)).all(|p| d[p * n + 7] == 0.0));
        assert_eq!(d[3 * n + 6], -2.5);
        // The padding (k to a multiple of 4, n to 64) holds zero weights, zero scales
        // and zero sums.
        let kp = k.next_multiple_of(4);
        assert!(q.data.len() == 2 * kp * NR);
        for p in k..kp {
            assert!((0..2 * NR).all(|j| q.weight(p, j) == 0));
        }
        let pad = |j: usize| (n..2 * NR).contains(&j);
        let per = q.groups() * NR;
        for (at, s) in q.scales.iter().enumerate() {
            let j = (at / per) * NR + at % NR;
            assert!(!pad(j) || *s == 0.0);
            assert!(!pad(j) || q.sums.get(at).is_none_or(|&s| s == 0));
        }
        assert!(
            q.sums.len()
                == if format == Format::Narrow {
                    q.scales.len()
                } else {
                    0
                }
        );
    }

    #[test]
    fn every_row_count_with_ragged_k_and_n() {
        let mut rng = Rng::new(2);
        // (k, n): k not a multiple of 4, n partial in the first or second half of a
        // panel, or several panels; every row count 1..=40 (one tile to three, and
        // both thread splits: tests split by rows above 20 rows).
        let shapes = [
            (1, 1),
            (3, 17),
            (5, 31),
            (37, 33),
            (64, 70),
            (22, 16),
            (9, 96),
        ];
        for m in 1..=40 {
            let (k, n) = shapes[m % shapes.len()];
            check_random(&mut rng, m, k, n);
        }
    }

    /// Runs `tile::<R>` on `path` and on the portable loops over the rows `a` (`R` rows
    /// of `k`, quantised as the kernel does for each) and the weight `q`'s panel `pj`, into an
    /// output whose rows are wider than the tile, and asserts the same bits and that
    /// nothing outside the tile's columns was written.
    fn check_tile<const R: usize>(path: Path, a: &[f32], q: &PackedI8, pj: usize, what: &str) {
        let (k, kp) = (q.k, q.kp);
        let per = q.groups() * NR;
        let width = NR.min(q.n - pj * NR);
        let (at, ldc) = (3, width + 5);
        let len = at + (R - 1) * ldc + width + 2;
        let run = |path: Path| {
            let mut qa = vec![0i8; R * kp];
            let mut sa = [0f32; R];
            let mut sums = [0i32; R];
            for i in 0..R {
                let row = &a[i * k..(i + 1) * k];
                let out = &mut qa[i * kp..(i + 1) * kp];
                (sa[i], sums[i]) = quantize::row(path, row, 1, k, out);
            }
            let t = Tile {
                qa: &qa,
                kp,
                sa: &sa,
                sums: &sums,
                format: q.format,
                group: q.group,
                b: &q.data[pj * kp * NR..(pj + 1) * kp * NR],
                sw: &q.scales[pj * per..(pj + 1) * per],
                cols: q.sums.get(pj * per..(pj + 1) * per).unwrap_or(&[]),
                epilogue: &[],
                row0: 0,
                j0: pj * NR,
                at,
                width,
                ldc,
            };
            let mut dst = vec![-7.0f32; len];
            tile::<R>(path, &t, Out::new(&mut dst));
            dst
        };
        let (got, want) = (run(path), run(Path::Portable));
        for (e, (g, w)) in got.iter().zip(&want).enumerate() {
            let inside = e >= at && (e - at) % ldc < width && (e - at) / ldc < R;
            assert!(
                g.to_bits() == w.to_bits() && (inside || *g == -7.0),
                "{path:?} {what}, R {R}, k {k}, width {width}: element {e} is {g}, want {w}"
            );
        }
    }

    /// [`check_tile`] for every row count 1..=MR.
    fn check_tile_rows(path: Path, a: &[f32], q: &PackedI8, pj: usize, what: &str) {
        macro_rules! call {
            ($r:literal) => {
                check_tile::<$r>(path, a, q, pj, what)
            };
        }
        for r in 1..=MR {
            by_rows!(r, call!());
        }
    }

    #[test]
    fn every_tile_gives_the_portable_bits() {
        let mut rng = Rng::new(8);
        let mut checked = Vec::new();
        let runs = PATHS[1..].iter().copied().filter(|p| p.runs());
        for (path, format) in runs.flat_map(|p| formats().map(|f| (p, f))) {
            if !path.takes(format) {
                continue;
            }
            checked.push((path, format));
            let quantize = |w: &[f32], k: usize, n: usize| {
                PackedI8::quantize_as(format, w, &Layout::contiguous(&[k, n])).unwrap()
            };
            // Random rows and weights: k not a multiple of 4, long k (the shifted sums
            // of the VNNI forms wrap i32 beyond k ≈ 66000: see the largest-k test), and
            // panels whole or ragged (n = 70: widths 32, 32 and 6; n = 9, 17, 24).
            for (k, n) in [(1, 9), (6, 17), (37, 70), (64, 24), (384, 40)] {
                let a: Vec<f32> = (0..MR * k).map(|_| rng.f32()).collect();
                let w: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
                let q = quantize(&w, k, n);
                for pj in 0..n.div_ceil(NR) {
                    check_tile_rows(path, &a, &q, pj, "random");
                }
            }
            // Every operand at its extreme (±1 quantises to ±127 in the rows, to ±127
            // or ±63 in the weights): all alike, so every pair of products is at its
            // largest (`Shifted`: 2 · 127², the sum `vpmaddubsw` would saturate on with
            // the shifted weight, 2 · 255 · 127; `Narrow`: 2 · 255 · 63 with the rows
            // shifted to u8, at -1 or +1), or in patterns of signs.
            let k = 260;
            for (sa, sw) in [(1.0, 1.0), (-1.0, -1.0), (1.0, -1.0), (-1.0, 1.0)] {
                let pattern = |s: f32, i: usize| if i % 3 == 1 { -s } else { s };
                for mixed in [false, true] {
                    let a: Vec<f32> = (0..MR * k)
                        .map(|i| if mixed { pattern(sa, i) } else { sa })
                        .collect();
                    let w: Vec<f32> = (0..k * 32)
                        .map(|i| if mixed { pattern(sw, i / 32) } else { sw })
                        .collect();
                    let q = quantize(&w, k, 32);
                    assert!((0..k).all(|p| q.weight(p, 0).abs() as f32 == format.levels()));
                    check_tile_rows(path, &a, &q, 0, "extreme");
                }
            }
            // Rows of zeros, a NaN, an infinity, among ordinary ones.
            let k = 20;
            let mut a: Vec<f32> = (0..MR * k).map(|_| rng.f32()).collect();
            a[k..2 * k].fill(0.0);
            a[3 * k + 5] = f32::NAN;
            a[6 * k] = f32::INFINITY;
            a[9 * k + 19] = f32::NEG_INFINITY;
            let w: Vec<f32> = (0..k * 33).map(|_| rng.f32()).collect();
            let q = quantize(&w, k, 33);
            check_tile_rows(path, &a, &q, 0, "non-finite");
            check_tile_rows(path, &a, &q, 1, "non-finite");
        }
        eprintln!("tiles checked against the portable one: {checked:?}");
    }

    /// Every tile that applies an epilogue (the AVX2 and aarch64 ones), run directly
    /// wherever the CPU has it (whatever tier is forced) on a weight in its format:
    /// every row count 1..=13 and more (uneven register blocks), odd column counts
    /// (ragged halves of a panel), odd counts of quads (`smmla`'s lone last quad),
    /// every epilogue kind: the bits of the portable product followed by the steps in
    /// scalar code. Through the caller, with the tier's weight, on one and two threads:
    /// the same where the tier's tile takes the epilogue, else nothing done.
    #[test]
    fn the_tiles_apply_the_epilogue_with_the_programs_bits() {
        use super::super::{matmul_packed_epilogue, Epilogue, PackedRhs, Panels};
        let mut rng = Rng::new(9);
        let shapes = [(64, 40), (150, 70), (20, 33), (9, 5)];
        let mut checked = Vec::new();
        for (m, (k, n)) in (1..=13)
            .map(|m| (m, shapes[m % shapes.len()]))
            .chain([(33, (384, 32))])
        {
            let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
            let al = Layout::contiguous(&[m, k]);
            let w: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
            let wl = Layout::contiguous(&[k, n]);
            let ops = super::super::tests::EpilogueOperands::new(&mut rng, m, n, 5);
            let epilogues = ops.epilogues();
            // The portable product by `q`, then each step in scalar code.
            let want = |q: &PackedI8, epilogue: Epilogue<'_>| -> Vec<f32> {
                super::super::tests::then(&product_on(Path::Portable, &a, &al, q), n, epilogue)
            };
            let same = |got: &[f32], want: &[f32]| {
                got.iter()
                    .zip(want)
                    .all(|(g, w)| g.to_bits() == w.to_bits())
            };
            // Each tile that takes an epilogue and runs here, with a weight it takes.
            let direct: Vec<(Path, PackedI8)> = PATHS
                .into_iter()
                .filter(|p| p.takes_epilogue() && p.runs())
                .map(|p| {
                    let format = formats().into_iter().find(|&f| p.takes(f));
                    let format = format.expect("every path takes a format");
                    (p, PackedI8::quantize_as(format, &w, &wl).unwrap())
                })
                .collect();
            // Through the caller, with the tier's weight: done where the tier's tile
            // takes it, on any thread count, else nothing written.
            let rhs = PackedRhs::pack_i8(&w, &wl).unwrap();
            let Panels::I8(q) = &rhs.panels else {
                unreachable!("pack_i8 packs int8")
            };
            for (e, epilogue) in epilogues.iter().enumerate() {
                for (path, weight) in &direct {
                    let got = product_then(*path, &a, &al, weight, epilogue);
                    let what = format!("{path:?} m {m} k {k} n {n} epilogue {e}");
                    assert!(same(&got, &want(weight, epilogue)), "{what}");
                    checked.push(*path);
                }
                let want = want(q, epilogue);
                for threads in [1, 2] {
                    let mut out = vec![f32::NAN; m * n];
                    let par = Par { threads };
                    let done =
                        matmul_packed_epilogue(&a, &al, &rhs, epilogue, &mut out, par).unwrap();
                    assert_eq!(done, takes_epilogue(q, simd()));
                    if done {
                        let what = format!("m {m} k {k} n {n} epilogue {e} threads {threads}");
                        assert!(same(&out, &want), "{what}");
                    } else {
                        assert!(
                            out.iter().all(|x| x.is_nan()),
                            "written without the epilogue"
                        );
                    }
                }
            }
        }
        checked.sort_by_key(|p| p.tier());
        checked.dedup();
        eprintln!("epilogues checked on the tiles {checked:?}");
    }

    #[test]
    fn amx_pairs_give_the_bits_of_the_other_paths() {
        // Row counts with whole pairs of 16-row tiles and rows left over, `k` a multiple
        // of 64 (the AMX tile's block) or not (then no AMX), panels whole and partial;
        // `product` holds every path and thread count to the same bits.
        let mut rng = Rng::new(7);
        for (m, k, n) in [
            (32, 64, 32),
            (33, 128, 70),
            (64, 384, 40),
            (77, 192, 96),
            (100, 100, 33),
        ] {
            check_random(&mut rng, m, k, n);
        }
    }

    #[test]
    fn strided_batched_and_transposed_operands() {
        let mut rng = Rng::new(3);
        let (a, al, w, wl) = super::super::tests::strided_operands(&mut rng);
        let (m, k, n) = (9, 21, 40);
        for format in formats() {
            let q = PackedI8::quantize_as(format, &w, &wl).unwrap();
            check(&a, &al, &q);
            // The dequantised weight is the transposed one.
            let d = q.dequantize().unwrap();
            assert!((d[n + 2] - w[2 * k + 1]).abs() <= q.scales[2]);
            // A transposed lhs (column stride m), a single row at an odd stride, and
            // random strided layouts with broadcast dims.
            let at_ = Layout::contiguous(&[k, m]).permute(&[1, 0]);
            check(&a, &at_, &q);
            let row = Layout {
                dims: vec![1, k].into(),
                strides: vec![1000, 2].into(),
                offset: 1,
            };
            check(&a, &row, &q);
            for _ in 0..4 {
                let dims = [1 + rng.below(3), 1 + rng.below(25), k];
                let (a, al) = rand_f32(&mut rng, &dims);
                check(&a, &al, &q);
            }
        }
    }

    #[test]
    fn zero_and_non_finite_rows() {
        let mut rng = Rng::new(4);
        let (m, k, n) = (6, 10, 35);
        let mut a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
        a[k..2 * k].fill(0.0); // row 1: zeros
        a[3 * k + 4] = f32::NAN; // row 3: a NaN
        a[4 * k] = f32::NEG_INFINITY; // row 4: an infinity
        a[5 * k..6 * k].fill(0.0);
        a[5 * k + 7] = f32::NAN; // row 5: zeros and a NaN
        let w: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
        for format in formats() {
            let q = PackedI8::quantize_as(format, &w, &Layout::contiguous(&[k, n])).unwrap();
            for al in [
                Layout::contiguous(&[m, k]),
                // The same rows stored transposed, which quantises them element by element.
                Layout::contiguous(&[k, m]).permute(&[1, 0]),
            ] {
                let src = if al.strides[1] == 1 {
                    a.clone()
                } else {
                    let mut t = vec![0.0; m * k];
                    for i in 0..m {
                        for p in 0..k {
                            t[p * m + i] = a[i * k + p];
                        }
                    }
                    t
                };
                let got = product(&src, &al, &q);
                assert!(got[n..2 * n].iter().all(|&x| x == 0.0));
                for r in [3, 4, 5] {
                    assert!(
                        got[r * n..(r + 1) * n].iter().all(|x| x.is_nan()),
                        "row {r}"
                    );
                }
                let fine = [0, 2];
                let rows: Vec<Vec<f32>> = fine
                    .iter()
                    .map(|&i| a[i * k..(i + 1) * k].to_vec())
                    .collect();
                let got: Vec<f32> = fine
                    .iter()
                    .flat_map(|&i| got[i * n..(i + 1) * n].to_vec())
                    .collect();
                assert_within_step(&got, &rows, &q);
            }
        }
    }

    #[test]
    fn every_scratch_size_and_the_largest_k() {
        let mut rng = Rng::new(5);
        // 40 × 500 bytes: the medium scratch; 200 rows of 1500: two chunks of the large.
        for (m, k, n) in [(40, 500, 33), (200, 1500, 20)] {
            check_random(&mut rng, m, k, n);
        }
        // k = MAX_K, every value at its extreme: 127 · 255 · k overflows i32 in the
        // accumulators of the VNNI forms, the exact sum 127² · k does not (nor 255 · 63
        // · k, the `Narrow` form's accumulators); two rows a chunk.
        let k = MAX_K;
        let a: Vec<f32> = (0..3 * k)
            .map(|p| if p % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let w = vec![1.0f32; k];
        let want: Vec<f32> = (0..3)
            .map(|i| (0..k).map(|p| a[i * k + p] as f64).sum::<f64>() as f32)
            .collect();
        for format in formats() {
            let q = PackedI8::quantize_as(format, &w, &Layout::contiguous(&[k, 1])).unwrap();
            let got = product(&a, &Layout::contiguous(&[3, k]), &q);
            assert_close(&got, &want, 1e-6);
        }
        let e = PackedI8::quantize(&vec![1.0; k + 1], &Layout::contiguous(&[k + 1, 1]));
        assert!(e.unwrap_err().0.contains("exceeds"));
    }

    #[test]
    fn refusals() {
        let (m, k, n) = (4, 6, 5);
        let w = vec![0.5f32; k * n];
        let q = PackedI8::quantize(&w, &Layout::contiguous(&[k, n])).unwrap();
        let a = vec![1.0f32; m * k];
        let mut out = vec![0.0f32; m * n];
        let run = |al: Layout, a: &[f32], out: &mut [f32]| {
            matmul_on(true, a, &al, &q, out, Par::serial())
                .unwrap_err()
                .0
        };
        let e = run(Layout::contiguous(&[m, k - 1]), &a, &mut out);
        assert!(e.contains("cannot multiply"), "{e}");
        let e = run(Layout::contiguous(&[m * k]), &a, &mut out);
        assert!(e.contains("cannot multiply"), "{e}");
        let e = run(Layout::contiguous(&[m, k]), &a, &mut out[..n]);
        assert!(e.contains("dst has"), "{e}");
        let e = run(Layout::contiguous(&[m, k]), &a[..5], &mut out);
        assert!(e.contains("reaches index"), "{e}");
        // Weights: a layout of the wrong rank or past the buffer, a non-finite value.
        let e = PackedI8::quantize(&w, &Layout::contiguous(&[k * n])).unwrap_err();
        assert!(e.0.contains("not [k, n]"), "{e}");
        let e = PackedI8::quantize(&w[..10], &Layout::contiguous(&[k, n])).unwrap_err();
        assert!(e.0.contains("reaches index"), "{e}");
        let mut bad = w.clone();
        bad[7] = f32::INFINITY;
        let e = PackedI8::quantize(&bad, &Layout::contiguous(&[k, n])).unwrap_err();
        assert!(e.0.contains("weight [1, 2] is inf"), "{e}");
        // Empty products are fine: k == 0 gives zeros, no rows gives nothing.
        let q0 = PackedI8::quantize(&[], &Layout::contiguous(&[0, n])).unwrap();
        let mut out = vec![f32::NAN; m * n];
        matmul_on(
            true,
            &[],
            &Layout::contiguous(&[m, 0]),
            &q0,
            &mut out,
            Par::serial(),
        )
        .unwrap();
        assert!(out.iter().all(|&x| x == 0.0));
        matmul_on(
            true,
            &a,
            &Layout::contiguous(&[0, k]),
            &q,
            &mut [],
            Par::serial(),
        )
        .unwrap();
    }

    /// Rows shaped like BERT's hidden states: layer-normed (mean 0, variance 1) with
    /// three channels 15× larger, or GELU outputs (the FFN's second product).
    fn bert_rows(rng: &mut Rng, m: usize, k: usize, gelu: bool) -> Vec<f32> {
        let mut a = Vec::with_capacity(m * k);
        for _ in 0..m {
            let mut row: Vec<f32> = (0..k).map(|_| rng.f32() + rng.f32() + rng.f32()).collect();
            if gelu {
                for x in &mut row {
                    *x = 0.5 * *x * (1.0 + (0.8 * *x).tanh());
                }
            } else {
                // 10 to 20 times the others' standard deviation (1).
                for c in [7, k / 3, k - 5] {
                    row[c] = (15.0 + 5.0 * rng.f32()).copysign(row[c]);
                }
            }
            a.extend(row);
        }
        a
    }

    /// The cosine of `x` and `y`.
    fn cosine(x: &[f32], y: &[f32]) -> f64 {
        let dot: f64 = x.iter().zip(y).map(|(&a, &b)| a as f64 * b as f64).sum();
        let nx: f64 = x.iter().map(|&a| a as f64 * a as f64).sum();
        let ny: f64 = y.iter().map(|&b| b as f64 * b as f64).sum();
        dot / (nx * ny).sqrt()
    }

    /// Per-row cosines of the int8 product of `a` (`[m, k]`) by the weight `wl` reads
    /// from `w`, quantised in `format`, to the f32 one (in f64), and the f32 product.
    fn cosines(
        format: Format,
        a: &[f32],
        w: &[f32],
        wl: &Layout,
        m: usize,
    ) -> (Vec<f64>, Vec<f32>) {
        let (k, n) = (wl.dims[0], wl.dims[1]);
        let q = PackedI8::quantize_as(format, w, wl).unwrap();
        let mut got = vec![0.0f32; m * n];
        matmul_on(
            true,
            a,
            &Layout::contiguous(&[m, k]),
            &q,
            &mut got,
            Par::all(),
        )
        .unwrap();
        let (rs, cs) = (wl.strides[0], wl.strides[1]);
        let mut want = vec![0.0f32; m * n];
        for (i, row) in want.chunks_mut(n).enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                *x = (0..k)
                    .map(|p| a[i * k + p] as f64 * w[wl.offset + p * rs + j * cs] as f64)
                    .sum::<f64>() as f32;
            }
        }
        let c = (0..m)
            .map(|i| cosine(&got[i * n..(i + 1) * n], &want[i * n..(i + 1) * n]))
            .collect();
        (c, want)
    }

    #[test]
    fn cosine_to_f32_on_bert_like_rows() {
        let mut rng = Rng::new(6);
        // Weights like a trained linear layer's: roughly Gaussian, a few large ones.
        let (m, k, n) = (24, 384, 96);
        for gelu in [false, true] {
            let a = bert_rows(&mut rng, m, k, gelu);
            let w: Vec<f32> = (0..k * n)
                .map(|i| {
                    let x = (rng.f32() + rng.f32() + rng.f32()) * 0.04;
                    if i % 997 == 0 {
                        x * 6.0
                    } else {
                        x
                    }
                })
                .collect();
            for format in formats() {
                let (c, _) = cosines(format, &a, &w, &Layout::contiguous(&[k, n]), m);
                let min = c.iter().cloned().fold(1.0, f64::min);
                eprintln!("{format:?} gelu {gelu}: min cosine {min}");
                // Per-row scales: the outliers cost the other channels about 4 bits,
                // and the rows still keep a cosine above 0.999.
                assert!(min >= 0.999, "{format:?} gelu {gelu}: min cosine {min}");
            }
        }
    }

    /// Accuracy on MiniLM-L6's real weights (not run by default: it needs the model).
    /// `STREAMFUSE_MINILM=<folder with model.safetensors> cargo test --lib
    /// packed::i8::tests::minilm -- --ignored --nocapture` prints, for each of the 36
    /// products of the encoder, the minimum and median cosine per row of the int8
    /// product to the f32 one (the bias left out: it is added in f32 either way).
    /// Inputs: layer 0's real embeddings of random tokens (word + position + type,
    /// layer-normed); for deeper layers, normal rows through the previous layer's
    /// LayerNorm weights (which is where BERT's outlier channels come from); the value
    /// projection's output stands for the attention context, and GELU of the first FFN
    /// product (real weights and bias) for the second's input.
    #[test]
    #[ignore]
    fn minilm_weights_cosine() {
        let Some(dir) = std::env::var_os("STREAMFUSE_MINILM") else {
            return;
        };
        let bytes = std::fs::read(std::path::Path::new(&dir).join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let get = |name: &str| -> (Vec<f32>, Vec<usize>) {
            let v = st.tensor(name).unwrap();
            let data = v
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (data, v.shape().to_vec())
        };
        let h = 384;
        let m = 64;
        let mut rng = Rng::new(7);
        let norm = |x: &mut [f32], g: &[f32], b: &[f32]| {
            for row in x.chunks_mut(h) {
                let mean = row.iter().sum::<f32>() / h as f32;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
                for ((v, g), b) in row.iter_mut().zip(g).zip(b) {
                    *v = (*v - mean) / (var + 1e-12).sqrt() * g + b;
                }
            }
        };
        // `x` [m, k] times the linear `name` ([n, k] in the file): the int8 cosines,
        // and the f32 product with its bias.
        let formats = [Format::Shifted, Format::Narrow];
        let mut all = [Vec::new(), Vec::new()];
        let mut linear = |x: &[f32], name: &str| -> Vec<f32> {
            let (w, shape) = get(&format!("{name}.weight"));
            let wl = Layout::contiguous(&[shape[0], shape[1]]).permute(&[1, 0]);
            let mut f32_out = Vec::new();
            for (format, all) in formats.into_iter().zip(&mut all) {
                let (mut c, out) = cosines(format, x, &w, &wl, m);
                c.sort_by(f64::total_cmp);
                eprintln!(
                    "{name:45} {format:?}: min {:.5} median {:.5}",
                    c[0],
                    c[c.len() / 2]
                );
                all.extend(c);
                f32_out = out;
            }
            let (bias, _) = get(&format!("{name}.bias"));
            for row in f32_out.chunks_mut(shape[0]) {
                for (v, b) in row.iter_mut().zip(&bias) {
                    *v += b;
                }
            }
            f32_out
        };
        let (words, _) = get("embeddings.word_embeddings.weight");
        let (pos, _) = get("embeddings.position_embeddings.weight");
        let (types, _) = get("embeddings.token_type_embeddings.weight");
        let mut x = vec![0.0f32; m * h];
        for (i, row) in x.chunks_mut(h).enumerate() {
            let t = 1000 + rng.below(28000);
            for c in 0..h {
                row[c] = words[t * h + c] + pos[(i % 40) * h + c] + types[c];
            }
        }
        let (g, _) = get("embeddings.LayerNorm.weight");
        let (b, _) = get("embeddings.LayerNorm.bias");
        norm(&mut x, &g, &b);
        let gaussian = |rng: &mut Rng| -> Vec<f32> {
            (0..m * h)
                .map(|_| rng.f32() + rng.f32() + rng.f32() + rng.f32())
                .collect()
        };
        for l in 0..6 {
            let p = format!("encoder.layer.{l}.");
            if l > 0 {
                x = gaussian(&mut rng);
                let (g, _) = get(&format!("encoder.layer.{}.output.LayerNorm.weight", l - 1));
                let (b, _) = get(&format!("encoder.layer.{}.output.LayerNorm.bias", l - 1));
                norm(&mut x, &g, &b);
            }
            linear(&x, &format!("{p}attention.self.query"));
            linear(&x, &format!("{p}attention.self.key"));
            let v = linear(&x, &format!("{p}attention.self.value"));
            linear(&v, &format!("{p}attention.output.dense"));
            let mut x1 = gaussian(&mut rng);
            let (g, _) = get(&format!("{p}attention.output.LayerNorm.weight"));
            let (b, _) = get(&format!("{p}attention.output.LayerNorm.bias"));
            norm(&mut x1, &g, &b);
            let mut inter = linear(&x1, &format!("{p}intermediate.dense"));
            for v in &mut inter {
                let erf = crate::kernels::math::erf(*v as f64 / std::f64::consts::SQRT_2);
                *v = 0.5 * *v * (1.0 + erf as f32);
            }
            linear(&inter, &format!("{p}output.dense"));
        }
        for (format, all) in formats.into_iter().zip(&mut all) {
            all.sort_by(f64::total_cmp);
            eprintln!(
                "{format:?}, all {} rows: min {:.5} median {:.5}",
                all.len(),
                all[0],
                all[all.len() / 2]
            );
            assert!(all[0] >= 0.99);
        }
    }
}
