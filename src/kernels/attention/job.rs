//! One job of the attention kernel: the operands and shape a split shares ([`Job`]),
//! the split of its blocks of query rows (and, for few blocks, of heads) between
//! threads, the prefetch of the next head's rows, and the run of one block on the
//! path the CPU takes ([`Path`]) with its output rows written through [`Dst`].

use pulp::Simd;

use super::{Bias, Path, Rows, Window, MAX_HEAD_DIM, QB};
use crate::kernels::par::Out;

/// Everything a block of output rows needs.
pub(super) struct Job<'a> {
    pub(super) q: &'a [f32],
    pub(super) k: &'a [f32],
    pub(super) v: &'a [f32],
    pub(super) qr: Rows,
    pub(super) kr: Rows,
    pub(super) vr: Rows,
    pub(super) bias: Option<Bias<'a>>,
    pub(super) scale: f32,
    /// The keys each query sees, by position.
    pub(super) window: Window,
    /// Query heads per kv head: head `h` reads kv head `h / group`.
    pub(super) group: usize,
    pub(super) heads: usize,
    pub(super) lq: usize,
    pub(super) lk: usize,
    pub(super) dh: usize,
    /// Query rows per block (at most [`QB`]).
    pub(super) block_rows: usize,
    /// Blocks per sequence.
    pub(super) blocks_per_seq: usize,
    /// Whether each block asks for the next head's rows ahead ([`PREFETCH_ABOVE`],
    /// [`PREFETCH_KEYS`]).
    pub(super) prefetch: bool,
}

impl Job<'_> {
    /// The sequence, first row and row count of block `g` (head 0).
    pub(super) fn block_at(&self, g: usize) -> (usize, usize, usize) {
        let (b, i0) = (
            g / self.blocks_per_seq,
            (g % self.blocks_per_seq) * self.block_rows,
        );
        (b, i0, self.block_rows.min(self.lq - i0))
    }

    /// The offset in `dst` of block `g`'s first row (`lq` for the end of the last).
    pub(super) fn start_of(&self, g: usize) -> usize {
        let (b, i0, _) = self.block_at(g);
        (b * self.lq + i0) * self.heads * self.dh
    }

    /// Blocks `range`, whose rows are `out`, every head, cut in up to `pieces` parts
    /// run at once (`rayon::join`: no allocation).
    pub(super) fn blocks(&self, range: std::ops::Range<usize>, out: &mut [f32], pieces: usize) {
        self.split(range, 0..self.heads, Out::new(out), pieces);
    }

    /// Heads `heads` of blocks `range`, whose rows start at `out`, cut in up to
    /// `pieces` parts run at once. Fewer blocks than parts (the rows of a request or
    /// two) are cut by heads, each part writing its heads' columns of every row, so
    /// the parts stay even whatever the number of blocks: cut by blocks, a sentence
    /// of 33 to 48 tokens (three blocks) ran one block on one thread and two on the
    /// other. More blocks than parts are cut by blocks, each part all heads of whole
    /// rows.
    pub(super) fn split(
        &self,
        range: std::ops::Range<usize>,
        heads: std::ops::Range<usize>,
        out: Out,
        pieces: usize,
    ) {
        if pieces > 1 && range.len() < pieces && heads.len() > 1 {
            let mid = heads.start + heads.len() / 2;
            rayon::join(
                || self.split(range.clone(), heads.start..mid, out, pieces / 2),
                || self.split(range.clone(), mid..heads.end, out, pieces - pieces / 2),
            );
            return;
        }
        if pieces > 1 && range.len() > 1 {
            let mid = range.start + range.len() / 2;
            let left = self.start_of(mid) - self.start_of(range.start);
            rayon::join(
                || self.split(range.start..mid, heads.clone(), out, pieces / 2),
                || {
                    self.split(
                        mid..range.end,
                        heads.clone(),
                        out.skip(left),
                        pieces - pieces / 2,
                    )
                },
            );
            return;
        }
        let row = self.heads * self.dh;
        let mut at = 0;
        for g in range {
            let (b, i0, len) = self.block_at(g);
            for h in heads.clone() {
                if self.prefetch && h + 1 < heads.end {
                    self.prefetch(Block {
                        b,
                        h: h + 1,
                        i0,
                        len,
                    });
                }
                let dst = Dst {
                    out: out.skip(at + h * self.dh),
                    rows: len,
                    stride: row,
                    width: self.dh,
                };
                self.block(Block { b, h, i0, len }, dst);
            }
            at += len * row;
        }
    }

    /// Asks for the rows block `blk` reads (its queries, every key and value row of
    /// its head) to be brought into the cache, so that they arrive while the block
    /// before it runs: the rows of one head are a few cache lines each, far apart
    /// (a head's slice of a token's projection), so the hardware does not fetch them
    /// ahead by itself.
    #[inline]
    pub(super) fn prefetch(&self, blk: Block) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let lines = |data: &[f32], at: usize| {
                let row = &data[at..at + self.dh];
                for c in row.chunks(16) {
                    // SAFETY: a prefetch reads nothing and cannot fault; the address
                    // is inside `data` (`row` is a checked slice of it).
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(c.as_ptr().cast()) };
                }
            };
            for t in 0..blk.len {
                lines(self.q, self.qr.at(blk.b, blk.h, blk.i0 + t));
            }
            let (lo, hi) = self.block_keys(blk);
            for j in lo..hi {
                lines(self.k, self.kr.at(blk.b, blk.h / self.group, j));
                lines(self.v, self.vr.at(blk.b, blk.h / self.group, j));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = blk;
    }

    /// The block's context rows, to `out` (row `t` of the block is `out.row(t)`). On
    /// AVX-512 and AVX2 the vector block runs (`vector.rs`: one 16-lane vector, or two
    /// 8-lane ones, hold the block's [`QB`] queries); elsewhere the portable loops
    /// (`portable.rs`), compiled for the CPU's SIMD level.
    #[inline]
    pub(super) fn block(&self, blk: Block, out: Dst) {
        let path = Path::chosen();
        /// The block as a `pulp` op: `vectorize`/`dispatch` call `with_simd` from a
        /// function compiled for the CPU's features, and everything below is inlined
        /// into it. (A closure passed to `V4::vectorize` is not: every intrinsic then
        /// becomes a call, 40× slower.) `out` is borrowed to keep the op within the
        /// eight words `vectorize` passes in registers: with the `Dst` itself (ten
        /// words), it took its other path and 8 sequences of 128 tokens on one thread
        /// took 3.27-3.39 ms instead of 2.56-2.82.
        struct Op<'a, 'b> {
            job: &'a Job<'b>,
            path: Path,
            blk: Block,
            out: &'a Dst,
        }
        impl pulp::WithSimd for Op<'_, '_> {
            type Output = ();
            #[inline(always)]
            fn with_simd<S: Simd>(self, _: S) {
                let Op {
                    job,
                    path,
                    blk,
                    out,
                } = self;
                let out = *out;
                // Tiles sized for the head (zeroing a 256-row tile for a head of 32
                // would cost as much as the block's arithmetic). The vector block's
                // last two parameters: vectors of queries, keys at a time (as many
                // independent chains as 16 registers hold on AVX2).
                macro_rules! sized {
                    ($d:expr) => {
                        match path {
                            #[cfg(target_arch = "x86_64")]
                            Path::Avx512(simd) => job.block_vector::<_, $d, 1, 8>(simd, blk, out),
                            #[cfg(target_arch = "x86_64")]
                            Path::Avx2(simd) if blk.len <= 8 => {
                                job.block_vector::<_, $d, 1, 8>(simd, blk, out)
                            }
                            #[cfg(target_arch = "x86_64")]
                            Path::Avx2(simd) => job.block_vector::<_, $d, 2, 4>(simd, blk, out),
                            Path::Portable => job.block_portable::<$d>(blk, out),
                        }
                    };
                }
                match job.dh {
                    0..=32 => sized!(32),
                    33..=64 => sized!(64),
                    65..=128 => sized!(128),
                    _ => sized!(MAX_HEAD_DIM),
                }
            }
        }
        const {
            assert!(
                std::mem::size_of::<Op<'static, 'static>>() <= 8 * std::mem::size_of::<usize>()
            );
        }
        let op = Op {
            job: self,
            path,
            blk,
            out: &out,
        };
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512(simd) => <pulp::x86::V4 as Simd>::vectorize(simd, op),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2(simd) => <pulp::x86::V3 as Simd>::vectorize(simd, op),
            Path::Portable => crate::kernels::cpu::dispatch(op),
        }
    }

    /// The block's queries transposed and scaled: `qt[d][t]` is element `d` of query
    /// row `i0 + t` times `scale` (lanes past `len` are 0).
    #[inline(always)]
    pub(super) fn q_lanes<const D: usize>(&self, blk: Block) -> [[f32; QB]; D] {
        let mut qt = [[0f32; QB]; D];
        for t in 0..blk.len {
            let at = self.qr.at(blk.b, blk.h, blk.i0 + t);
            for (lanes, &x) in qt.iter_mut().zip(&self.q[at..at + self.dh]) {
                lanes[t] = x * self.scale;
            }
        }
        qt
    }

    /// Row `j` of key (or value) operand `rows` of the block's head's kv head.
    #[inline(always)]
    pub(super) fn row<'a>(&self, data: &'a [f32], rows: &Rows, blk: Block, j: usize) -> &'a [f32] {
        let at = rows.at(blk.b, blk.h / self.group, j);
        &data[at..at + self.dh]
    }

    /// The bias of key `j` for each of the block's query lanes, or `None` without a
    /// bias.
    #[inline(always)]
    pub(super) fn bias_lanes(&self, blk: Block, j: usize) -> Option<[f32; QB]> {
        let bias = self.bias.as_ref()?;
        let [sb, sh, si, sj] = bias.strides;
        let base = bias.offset + blk.b * sb + blk.h * sh + j * sj;
        if si == 0 {
            return Some([bias.data[base]; QB]);
        }
        let mut lanes = [0f32; QB];
        for (t, x) in lanes.iter_mut().enumerate().take(blk.len) {
            *x = bias.data[base + (blk.i0 + t) * si];
        }
        Some(lanes)
    }

    /// Writes the block's context rows: `ot[d][t] · inv[t]` for row `t`, element `d`.
    #[inline(always)]
    pub(super) fn write_rows<const D: usize>(
        &self,
        ot: &[[f32; QB]; D],
        inv: &[f32; QB],
        len: usize,
        out: Dst,
    ) {
        for t in 0..len {
            // SAFETY: this task writes the block's rows of its head (see `Dst`).
            let row = unsafe { out.row(t) };
            for (o, lanes) in row.iter_mut().zip(ot) {
                *o = lanes[t] * inv[t];
            }
        }
    }
}

/// Where one block writes its context: `rows` rows of `width` elements (one head), the
/// first at the start of `out`, each `stride` after the one before. Tasks of a split by
/// heads write other columns of the same rows (`Out`).
#[derive(Clone, Copy)]
pub(super) struct Dst {
    pub(super) out: Out,
    pub(super) rows: usize,
    pub(super) stride: usize,
    pub(super) width: usize,
}

impl Dst {
    /// Row `t`.
    ///
    /// # Safety
    ///
    /// No one else reads or writes these elements while the slice lives: in a split,
    /// they belong to the calling task (its block's rows, its head's columns).
    pub(super) unsafe fn row<'a>(self, t: usize) -> &'a mut [f32] {
        assert!(t < self.rows);
        // SAFETY: `Out::part` checks that the row lies inside the output; the caller
        // guarantees that nobody else touches it.
        unsafe { self.out.part(t * self.stride, self.width) }
    }
}

/// One unit of the kernel's work: query rows `i0..i0 + len` (`len <= QB`) of head `h`
/// of sequence `b`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    pub(super) b: usize,
    pub(super) h: usize,
    pub(super) i0: usize,
    pub(super) len: usize,
}
