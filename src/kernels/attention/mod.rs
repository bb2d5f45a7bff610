//! Scaled dot-product attention as one kernel: `softmax(q·kᵀ · scale + bias) · v` per
//! head, without the score matrix ever being stored.
//!
//! The unfused form writes a `[batch, heads, lq, lk]` score tensor, reads it back for
//! the softmax, writes the probabilities, reads them for the product with `v`, then
//! copies the context from `[batch, heads, lq, dh]` to the `[batch, lq, heads · dh]`
//! rows the output projection reads. This kernel instead walks a block of
//! [`QB`] query rows of one head at a time:
//!
//! * the block's query rows are packed transposed (`qt[d][lane]`, already multiplied by
//!   `scale`), so every vector operation below works on the [`QB`] queries at once (on
//!   AVX-512 one 16-lane vector, on AVX2 two 8-lane ones, or one for a block of at
//!   most 8 rows; whole rows loaded and turned by 16 × 16 or 8 × 8 register
//!   transposes, and the context turned back the same way);
//! * keys come in blocks of [`KB`]: a score tile `s[key][lane]` of `QB · KB` floats
//!   (on the stack, in L1) takes `dh` multiply-adds per key, each a broadcast element
//!   of the key row times `qt[d]`;
//! * the softmax is online (as in FlashAttention): a running maximum and sum per query,
//!   and the accumulator `ot[d][lane]` rescaled by `e^(old max - new max)` when the
//!   maximum grows, once per key block;
//! * `ot[d] += p[key] · v[key][d]`, again a broadcast times a vector of queries;
//! * at the end of the keys the block's context rows are divided by the sums and
//!   written to `[batch, lq, heads, dh]`, the layout a `reshape` to
//!   `[batch · lq, heads · dh]` reads for free.
//!
//! q, k and v are read through their layouts (each row's `dh` elements contiguous),
//! so views of a fused QKV projection need no copy. Work is split over blocks of up to
//! 16 query rows of one sequence, all heads; when there are fewer blocks than parts
//! (one short sequence, as for one request), over heads as well, each part writing its
//! heads' columns of the rows, so one short sequence still uses every core.
//! When the operands are larger than L2 and the sequences short, each block asks for
//! the next head's rows before it starts (they are a few lines each, far apart, which
//! the hardware does not fetch ahead by itself).
//! Scratch is the three tiles on the stack (at most 66 KiB with `dh` = 256), so the
//! kernel allocates nothing.
//!
//! [`attention_ragged`] runs the same blocks over a *packed* batch: sequences laid one
//! after another along the token axis, as FlashAttention's varlen form takes them, with
//! their boundaries given by offsets (`cu_seqlens`). Each sequence runs as a batch of
//! one whose rows start at its first token, so its queries score only its own keys and
//! the work is the sum of the squared sequence lengths, never the square of the total.
//!
//! Both forms take a key [`Window`] (`window.rs`): query `i` sees only keys near it
//! (causal, sliding-window and local attention). A block walks only the key tiles
//! some of its queries see, from the first such key, and masks lanes (to `f32::MIN`,
//! whose weight is 0 as a `-1e9` bias's would be, and never NaN) only in the tiles
//! the window cuts; so causal attention costs about half, and a window of `w` keys
//! about `(w + QB + KB) / lk`. A row that sees no key (only when `lq > lk`) is zeros.
//! k and v may have fewer heads than q (grouped-query attention): query head `h`
//! reads kv head `h / (heads / kv_heads)`.
//!
//! Accuracy: the same products and sums as the unfused path in a different order,
//! `exp` within 2 ulp; `tests/attention.rs` holds every output within 1e-6 of the
//! unfused path's, relative to the largest of them. The AVX2 and AVX-512 blocks give
//! the same bits (`vector.rs`: the same operations on every lane in the same order),
//! and are within 1e-6 per 64 elements of the head of the portable loops, relative to
//! the largest output (fused multiply-adds and the vector `exp` round differently);
//! the tests below hold both.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod job;
mod packed;
mod portable;
// Generic over pulp's `Simd`; only the x86 levels implement its `Lanes` so far.
#[cfg(target_arch = "x86_64")]
mod vector;
mod window;

use job::{Block, Dst, Job};
use packed::Packed;
pub(crate) use window::Window;

use super::{check_dst, check_input, error, worth_splitting, KernelError, Par};
use crate::ir::Layout;

/// Query rows handled together (one vector of lanes on AVX-512).
pub(crate) const QB: usize = 16;
/// Keys per score tile.
pub(crate) const KB: usize = 32;
/// The largest head size the kernel takes (its tiles live on the stack).
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// Which body runs a block: the portable loops, or the vector block at one SIMD level
/// (a `pulp` token, so this is at most a byte).
#[derive(Clone, Copy, Debug)]
enum Path {
    /// `portable.rs`, compiled for the tier's SIMD level by `cpu::dispatch`.
    Portable,
    /// `vector.rs` on AVX2 (`avx2.rs`): two 8-lane vectors of queries, or one.
    #[cfg(target_arch = "x86_64")]
    Avx2(pulp::x86::V3),
    /// `vector.rs` on AVX-512 (`avx512.rs`): one 16-lane vector of queries.
    #[cfg(target_arch = "x86_64")]
    Avx512(pulp::x86::V4),
}

impl Path {
    /// The widest path the tier in use includes (`cpu::v4`, `cpu::v3`), unless a test
    /// chose one ([`tests::with_path`]).
    #[inline]
    fn chosen() -> Path {
        #[cfg(test)]
        if let Some(p) = tests::forced_path() {
            return p;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(simd) = crate::kernels::cpu::v4() {
                return Path::Avx512(simd);
            }
            if let Some(simd) = crate::kernels::cpu::v3() {
                return Path::Avx2(simd);
            }
        }
        Path::Portable
    }
}

/// One operand's geometry: the element offset of row `(b, h, i)` is
/// `offset + b·sb + h·sh + i·si`, the row's `dh` elements contiguous.
#[derive(Clone, Copy, Debug)]
struct Rows {
    offset: usize,
    sb: usize,
    sh: usize,
    si: usize,
}

impl Rows {
    fn of(kernel: &str, what: &str, l: &Layout) -> Result<Rows, KernelError> {
        if l.dims.len() != 4 {
            return Err(error(
                kernel,
                format_args!(
                    "{what} must be [batch, heads, len, head_dim], got {:?}",
                    l.dims
                ),
            ));
        }
        if l.dims[3] > 1 && l.strides[3] != 1 {
            return Err(error(
                kernel,
                format_args!(
                    "{what}'s last dim must be contiguous (stride {})",
                    l.strides[3]
                ),
            ));
        }
        Ok(Rows {
            offset: l.offset,
            sb: l.strides[0],
            sh: l.strides[1],
            si: l.strides[2],
        })
    }

    #[inline(always)]
    fn at(&self, b: usize, h: usize, i: usize) -> usize {
        self.offset + b * self.sb + h * self.sh + i * self.si
    }

    /// The same operand with row `i` as row 0.
    fn starting_at(&self, i: usize) -> Rows {
        Rows {
            offset: self.offset + i * self.si,
            ..*self
        }
    }
}

/// The additive bias's geometry: element `(b, h, i, j)` at
/// `offset + b·sb + h·sh + i·si + j·sj` (strides 0 where it is broadcast).
#[derive(Clone, Copy, Debug)]
struct Bias<'a> {
    data: &'a [f32],
    offset: usize,
    strides: [usize; 4],
}

impl<'a> Bias<'a> {
    /// The bias `data` read through `bl`, checked to be `dims`.
    fn check(
        kernel: &str,
        data: &'a [f32],
        bl: &Layout,
        dims: [usize; 4],
    ) -> Result<Bias<'a>, KernelError> {
        check_input(kernel, "bias", data.len(), bl)?;
        if bl.dims[..] != dims {
            return Err(error(
                kernel,
                format_args!("bias must be read as {dims:?}, got {:?}", bl.dims),
            ));
        }
        let s = &bl.strides;
        Ok(Bias {
            data,
            offset: bl.offset,
            strides: [s[0], s[1], s[2], s[3]],
        })
    }
}

/// `softmax(q·kᵀ · scale + bias) · v`, written as `[batch, lq, heads, dh]` rows.
///
/// `q` is `[batch, heads, lq, dh]`, `k` and `v` are `[batch, kv_heads, lk, dh]` with
/// `heads` a multiple of `kv_heads` (query head `h` reads kv head
/// `h / (heads / kv_heads)`), each read through its layout with its last dim
/// contiguous; `bias`, when given, is read through a layout of dims
/// `[batch, heads, lq, lk]` (broadcast dims have stride 0), and is added to the scaled
/// scores (0 keeps a key, a large negative number masks it). Query `i` sees only the
/// keys `window` gives it: the key tiles outside a block's window are never read, and
/// a row that sees no key is zeros. `dst` must have `batch · lq · heads · dh`
/// elements. `dh` is at most [`MAX_HEAD_DIM`].
#[allow(clippy::too_many_arguments)] // three operands with their layouts, as every kernel
pub(crate) fn attention(
    q: &[f32],
    ql: &Layout,
    k: &[f32],
    kl: &Layout,
    v: &[f32],
    vl: &Layout,
    bias: Option<(&[f32], &Layout)>,
    scale: f32,
    window: Window,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "attention";
    let ops = Operands::check(kernel, [(q, ql), (k, kl), (v, vl)])?;
    let [batch, heads, lq, dh] = ops.dims;
    let lk = kl.dims[2];
    let bias = match bias {
        None => None,
        Some((data, bl)) => Some(Bias::check(kernel, data, bl, [batch, heads, lq, lk])?),
    };
    check_dst(kernel, dst.len(), batch * lq * heads * dh)?;
    if dst.is_empty() {
        return Ok(());
    }
    if lk == 0 {
        // No keys: the softmax of nothing; the unfused path gives NaN rows too. A
        // window's rows that see no key are zeros instead, as in the kernel.
        dst.fill(if window == Window::ALL { f32::NAN } else { 0.0 });
        return Ok(());
    }
    let job = ops.job(bias, scale, window, lq, lk);
    let work = batch * heads * window.pairs(lq, lk) * dh * 4;
    job.blocks(0..batch * job.blocks_per_seq, dst, pieces(par, work));
    Ok(())
}

/// How many parts to cut `work` (element operations) into: a few per thread, so an
/// uneven split still keeps every core busy; 1 when it is not worth splitting.
fn pieces(par: Par, work: usize) -> usize {
    if par.threads > 1 && worth_splitting(work) {
        4 * par.threads
    } else {
        1
    }
}

/// Attention within each sequence of a packed (ragged) batch: `q`, `k` and `v` are
/// `[1, heads, total, dh]` (read through their layouts, last dim contiguous), holding
/// the tokens of every sequence one after another; sequence `s` is rows
/// `offsets[s]..offsets[s + 1]` and its queries see only its own keys
/// (`softmax(q·kᵀ · scale) · v` per sequence and head). `offsets` starts at 0, never
/// decreases and ends at `total` (an empty sequence is allowed and writes nothing).
/// `bias`, when given, is read through a layout of dims `[1, heads, len, len]` with
/// `len` at least the longest sequence: query `i` and key `j` of a sequence (counted
/// from its first token) get element `(0, h, i, j)` added to their scaled score.
/// k and v may have fewer heads than q, as in [`attention`]; `window` applies by
/// position within each sequence. The result is `[1, total, heads, dh]` rows in
/// `dst`. Work is `Σ len²` (the visible pairs of each sequence), not `total²`.
#[allow(clippy::too_many_arguments)] // three operands with their layouts, as every kernel
pub(crate) fn attention_ragged(
    q: &[f32],
    ql: &Layout,
    k: &[f32],
    kl: &Layout,
    v: &[f32],
    vl: &Layout,
    offsets: &[u32],
    bias: Option<(&[f32], &Layout)>,
    scale: f32,
    window: Window,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "attention_ragged";
    let ops = Operands::check(kernel, [(q, ql), (k, kl), (v, vl)])?;
    let [batch, heads, total, dh] = ops.dims;
    if batch != 1 || kl.dims[2] != total {
        return Err(error(
            kernel,
            format_args!(
                "a packed batch is q, k and v of [1, heads, total, head size] with as many \
                 keys as queries, got q {:?} and k {:?}",
                ql.dims, kl.dims
            ),
        ));
    }
    if offsets.first() != Some(&0) || offsets.last().map(|&x| x as usize) != Some(total) {
        return Err(error(
            kernel,
            format_args!(
                "sequence offsets must run from 0 to the {total} tokens, got {} offsets \
                 starting at {:?} and ending at {:?}",
                offsets.len(),
                offsets.first(),
                offsets.last()
            ),
        ));
    }
    let mut work = 0usize;
    for (s, w) in offsets.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(error(
                kernel,
                format_args!(
                    "sequence offsets decrease at sequence {s}: {} then {}",
                    w[0], w[1]
                ),
            ));
        }
        let len = (w[1] - w[0]) as usize;
        work += window.pairs(len, len);
    }
    let bias = match bias {
        None => None,
        Some((data, bl)) => {
            let len = bl.dims.get(2).copied().unwrap_or(0);
            let bias = Bias::check(kernel, data, bl, [1, heads, len, len])?;
            let longest = offsets.windows(2).map(|w| (w[1] - w[0]) as usize).max();
            if longest.unwrap_or(0) > len {
                return Err(error(
                    kernel,
                    format_args!(
                        "the bias covers sequences of up to {len} tokens, but one has {}",
                        longest.unwrap_or(0)
                    ),
                ));
            }
            Some(bias)
        }
    };
    check_dst(kernel, dst.len(), total * heads * dh)?;
    let packed = Packed {
        ops,
        offsets,
        bias,
        scale,
        window,
    };
    packed.seqs(
        0..offsets.len() - 1,
        dst,
        pieces(par, work * heads * dh * 4),
    );
    Ok(())
}

/// The three checked operands of either form.
struct Operands<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    qr: Rows,
    kr: Rows,
    vr: Rows,
    /// q's dims: `[batch, heads, lq, dh]`.
    dims: [usize; 4],
    /// Query heads per kv head.
    group: usize,
}

impl<'a> Operands<'a> {
    fn check(kernel: &str, ops: [(&'a [f32], &Layout); 3]) -> Result<Operands<'a>, KernelError> {
        let [(q, ql), (k, kl), (v, vl)] = ops;
        check_input(kernel, "q", q.len(), ql)?;
        check_input(kernel, "k", k.len(), kl)?;
        check_input(kernel, "v", v.len(), vl)?;
        let (qr, kr, vr) = (
            Rows::of(kernel, "q", ql)?,
            Rows::of(kernel, "k", kl)?,
            Rows::of(kernel, "v", vl)?,
        );
        let dh = ql.dims[3];
        let (heads, kv_heads) = (ql.dims[1], kl.dims[1]);
        let grouped = heads.is_multiple_of(kv_heads);
        if kl.dims[0] != ql.dims[0] || !grouped || kl.dims[3] != dh || vl.dims[..] != kl.dims[..] {
            return Err(error(
                kernel,
                format_args!(
                    "q {:?}, k {:?} and v {:?} must agree on batch and head size, q's heads \
                     must be a multiple of k's, and k must equal v",
                    ql.dims, kl.dims, vl.dims
                ),
            ));
        }
        if dh > MAX_HEAD_DIM {
            return Err(error(
                kernel,
                format_args!("head size {dh} is above the largest supported, {MAX_HEAD_DIM}"),
            ));
        }
        Ok(Operands {
            q,
            k,
            v,
            qr,
            kr,
            vr,
            dims: [ql.dims[0], ql.dims[1], ql.dims[2], dh],
            group: heads.checked_div(kv_heads).unwrap_or(1),
        })
    }

    /// The blocks of `lq` query rows against `lk` keys per batch entry. Work is cut
    /// into blocks of query rows of one sequence, all heads (a block's output rows are
    /// contiguous in `dst`); the rows of a sequence are shared evenly between its
    /// blocks, so 20 rows make two blocks of 10, not 16 and 4.
    fn job(
        &self,
        bias: Option<Bias<'a>>,
        scale: f32,
        window: Window,
        lq: usize,
        lk: usize,
    ) -> Job<'a> {
        let blocks_per_seq = lq.div_ceil(QB);
        Job {
            q: self.q,
            k: self.k,
            v: self.v,
            qr: self.qr,
            kr: self.kr,
            vr: self.vr,
            bias,
            scale,
            window,
            group: self.group,
            heads: self.dims[1],
            lq,
            lk,
            dh: self.dims[3],
            block_rows: lq.div_ceil(blocks_per_seq.max(1)),
            blocks_per_seq,
            prefetch: lk <= PREFETCH_KEYS
                && self.q.len().max(self.k.len()).max(self.v.len()) * 4 > PREFETCH_ABOVE,
        }
    }
}

/// Operands larger than this many bytes are not in L2 when the kernel starts, so each
/// block asks for the next head's rows ([`Job::prefetch`]) when they are few (see
/// [`PREFETCH_KEYS`]); smaller operands are in L2, and the requests would only cost
/// time. Measured (alternating in one process, 12 heads of 32, one core): batch 32 of
/// 28 tokens (4 MiB of projections) 1991 → 1943 and 1845 → 1744 µs on a quiet machine
/// (2007 → 1734 under load); one sentence of 28 tokens (129 KiB) 42.2 µs without,
/// 45.8 µs with.
/// (Unit tests use a small bound, so that their operands take the prefetching path.)
const PREFETCH_ABOVE: usize = if cfg!(test) { 1 << 12 } else { 1 << 20 };

/// At most this many keys for [`Job::prefetch`]: the next head's k and v rows are then
/// at most 16 KiB, ahead of a block's work. With 128 keys (32 KiB a block, fetched
/// again by each of a sequence's 8 query blocks) it measured from 5% slower to 1%
/// faster (batch 8 of 128: 5068 → 5237, 5314 → 5565, 4359 → 4316 µs).
const PREFETCH_KEYS: usize = 64;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::Mutex;

    use super::*;
    use crate::kernels::cpu::{cpu_runs, Tier};
    use crate::kernels::testutil::{same_bits, Rng};

    /// A path a test may choose for every block ([`with_path`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Kind {
        Portable = 1,
        Avx2 = 2,
        Avx512 = 3,
    }

    /// The chosen [`Kind`] as a number, 0 while no test chose one.
    static FORCED: AtomicU8 = AtomicU8::new(0);

    /// Held by the tests that choose a path ([`with_path`]) or need the tier's path
    /// throughout.
    static PATH: Mutex<()> = Mutex::new(());

    /// The path a test chose, if any (read by [`Path::chosen`]).
    pub(super) fn forced_path() -> Option<Path> {
        match FORCED.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(Path::Portable),
            #[cfg(target_arch = "x86_64")]
            2 => crate::kernels::cpu::v3_of_cpu().map(Path::Avx2),
            #[cfg(target_arch = "x86_64")]
            3 => crate::kernels::cpu::v4_of_cpu().map(Path::Avx512),
            _ => None,
        }
    }

    /// `f()` with every block taking `kind`'s path, when this CPU runs it (whatever
    /// tier the environment forces: `cpu_runs`); `None` when it does not.
    pub(super) fn with_path<R>(kind: Kind, f: impl FnOnce() -> R) -> Option<R> {
        let _turn = PATH.lock().unwrap_or_else(|e| e.into_inner());
        let runs = match kind {
            Kind::Portable => true,
            Kind::Avx2 => cfg!(target_arch = "x86_64") && cpu_runs(Tier::Avx2),
            Kind::Avx512 => cfg!(target_arch = "x86_64") && cpu_runs(Tier::Avx512),
        };
        if !runs {
            return None;
        }
        /// Puts the tier's path back, also when `f` panics.
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                FORCED.store(0, Ordering::Relaxed);
            }
        }
        FORCED.store(kind as u8, Ordering::Relaxed);
        let _reset = Reset;
        Some(f())
    }

    fn ramp(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| rng.f32() - 0.5).collect()
    }

    /// Runs the kernel over `[b, heads, l, dh]` operands with a padding bias.
    fn run(b: usize, heads: usize, l: usize, dh: usize, par: Par) -> Vec<f32> {
        run_biased(b, heads, l, dh, par, false, Window::ALL, heads)
    }

    /// Runs the kernel over `[b, heads, l, dh]` operands with a padding bias (`[b, 1, 1,
    /// l]` broadcast; at least as many rows as batch entries), or with `per_query` a
    /// bias of every element (`[b, heads, l, l]`: -1e9 for a few keys, else in
    /// [-2, 2]); k and v have `kv_heads` heads, and queries see the keys of `window`.
    #[allow(clippy::too_many_arguments)]
    fn run_biased(
        b: usize,
        heads: usize,
        l: usize,
        dh: usize,
        par: Par,
        per_query: bool,
        window: Window,
        kv_heads: usize,
    ) -> Vec<f32> {
        let n = b * heads * l * dh;
        let (q, k, v) = (ramp(n, 1), ramp(n, 2), ramp(n, 3));
        let lay = Layout::contiguous(&[b, heads, l, dh]);
        let kv = Layout::contiguous(&[b, kv_heads, l, dh]);
        let (bias, bl) = if per_query {
            let bias: Vec<f32> = ramp(b * heads * l * l, 4)
                .into_iter()
                .enumerate()
                .map(|(i, x)| if i % 7 == 3 { -1e9 } else { 4.0 * x })
                .collect();
            (bias, Layout::contiguous(&[b, heads, l, l]))
        } else {
            let bias: Vec<f32> = (0..b * l)
                .map(|x| if x % l < l - x / l { 0.0 } else { -1e9 })
                .collect();
            let bl = Layout::contiguous(&[b, 1, 1, l])
                .broadcast_as(&[b, heads, l, l])
                .unwrap();
            (bias, bl)
        };
        let mut out = vec![0.0; n];
        attention(
            &q,
            &lay,
            &k,
            &kv,
            &v,
            &kv,
            Some((&bias, &bl)),
            0.3,
            window,
            &mut out,
            par,
        )
        .unwrap();
        out
    }

    /// The windows and kv head counts the path tests run each edge case with: every
    /// key, causal on one kv head, a band of 5 around the diagonal, 20 keys before.
    fn windows(heads: usize) -> [(Window, usize); 4] {
        let w = |before, after| Window { before, after };
        [
            (Window::ALL, heads),
            (w(None, Some(0)), 1),
            (w(Some(5), Some(5)), heads),
            (w(Some(20), None), 1),
        ]
    }

    /// Shapes `[b, heads, l, dh]` around the edges of the vector block: rows per block
    /// of at most 8 (one AVX2 vector) and more, key blocks ([`KB`]) whole and cut,
    /// groups of keys whole and padded, heads that are not a multiple of the lanes
    /// (the untransposed loads), and both biases.
    fn edge_cases() -> Vec<(usize, usize, usize, usize, bool)> {
        let mut cases = Vec::new();
        for (dh, ls) in [
            (32, &[1, 3, 8, 9, 16, 21, 28, 33, 40][..]),
            (64, &[12, 64][..]),
            (7, &[5, 17][..]),
            (16, &[8, 30][..]),
            (48, &[13][..]),
            (130, &[70][..]),
            (256, &[20][..]),
        ] {
            for &l in ls {
                for per_query in [false, true] {
                    cases.push((1 + l % 2, 1 + dh % 3, l, dh, per_query));
                }
            }
        }
        cases
    }

    /// The vector block on every level this CPU runs (whatever tier is forced) is
    /// within 1e-6 of the portable loops per 64 elements of the head (at least 1e-6),
    /// relative to the largest output: the same products and sums, rounded
    /// differently (fused multiply-adds, the vector exp), and a score's rounding grows
    /// with the length of its dot product (a head of 256 differed by 1.9e-6).
    #[test]
    fn every_vector_path_is_within_1e_6_per_64_of_the_head_of_the_portable_one() {
        for ((b, heads, l, dh, per_query), (window, kv)) in edge_cases()
            .into_iter()
            .flat_map(|c| windows(c.1).map(|w| (c, w)))
        {
            let par = Par { threads: 1 + l % 2 };
            let case = || run_biased(b, heads, l, dh, par, per_query, window, kv);
            let portable = with_path(Kind::Portable, case).unwrap();
            let scale = portable.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let bound = 1e-6 * dh.div_ceil(64) as f32 * scale;
            for kind in [Kind::Avx2, Kind::Avx512] {
                let Some(fast) = with_path(kind, case) else {
                    continue;
                };
                for (i, (p, f)) in portable.iter().zip(&fast).enumerate() {
                    assert!(
                        (p - f).abs() <= bound,
                        "{kind:?} [{b}, {heads}, {l}, {dh}] {window:?} kv {kv} element {i}: \
                         portable {p}, vector {f}"
                    );
                }
            }
        }
    }

    /// The AVX2 block (two 8-lane vectors of queries, or one, keys 4 or 8 at a time)
    /// gives the bits of the AVX-512 block (one 16-lane vector, keys 8 at a time):
    /// every lane goes through the same operations in the same order (`vector.rs`).
    #[test]
    fn avx2_gives_the_bits_of_avx512() {
        for ((b, heads, l, dh, per_query), (window, kv)) in edge_cases()
            .into_iter()
            .flat_map(|c| windows(c.1).map(|w| (c, w)))
        {
            let case = || run_biased(b, heads, l, dh, Par::serial(), per_query, window, kv);
            let (Some(avx2), Some(avx512)) =
                (with_path(Kind::Avx2, case), with_path(Kind::Avx512, case))
            else {
                return;
            };
            assert!(
                same_bits(&avx2, &avx512),
                "[{b}, {heads}, {l}, {dh}] per-query bias {per_query} {window:?} kv {kv}"
            );
        }
    }

    /// Every way of sharing the work between tasks (by blocks of rows, by heads, both)
    /// computes each element the same way: the same bits as one thread, for padded
    /// batches and for packed ones of one or several sequences, every head count to
    /// 13 and lengths around the 16-row blocks. A task writing another head's columns
    /// or rows (`Out`, `Dst`) would change some element.
    #[test]
    fn splits_by_heads_and_blocks_give_the_bits_of_one_thread() {
        let _path = PATH.lock().unwrap_or_else(|e| e.into_inner());
        for heads in 1..=13 {
            for l in [1, 15, 17, 40] {
                // (`run`'s padding bias needs at least as many rows as batch entries.)
                for b in [1, 3].into_iter().filter(|&b| b <= l) {
                    let one = run(b, heads, l, 32, Par::serial());
                    for threads in [2, 3, 4] {
                        let split = run(b, heads, l, 32, Par { threads });
                        let same = same_bits(&one, &split);
                        assert!(same, "[{b}, {heads}, {l}, 32] threads {threads}");
                    }
                }
                // Packed: one sequence, then three.
                let dh = 16;
                for lens in [vec![l], vec![l, 3, l + 1]] {
                    let total: usize = lens.iter().sum();
                    let n = heads * total * dh;
                    let (q, k, v) = (ramp(n, 1), ramp(n, 2), ramp(n, 3));
                    let lay = Layout::contiguous(&[1, heads, total, dh]);
                    let mut offsets = vec![0u32];
                    for &x in &lens {
                        offsets.push(offsets.last().unwrap() + x as u32);
                    }
                    let packed = |par| {
                        let mut out = vec![f32::NAN; n];
                        attention_ragged(
                            &q,
                            &lay,
                            &k,
                            &lay,
                            &v,
                            &lay,
                            &offsets,
                            None,
                            0.3,
                            Window::ALL,
                            &mut out,
                            par,
                        )
                        .unwrap();
                        out
                    };
                    let one = packed(Par::serial());
                    assert!(one.iter().all(|x| x.is_finite()));
                    for threads in [2, 3, 4] {
                        let split = packed(Par { threads });
                        let same = same_bits(&one, &split);
                        assert!(same, "packed {lens:?} heads {heads} threads {threads}");
                    }
                }
            }
        }
    }

    /// Rows that see no key (a window over fewer keys than queries) are zeros on every
    /// path, never NaN; the rows that see keys equal a -1e9 bias of the window.
    #[test]
    fn rows_that_see_no_key_are_zeros() {
        let (lq, lk, dh) = (40, 9, 32);
        let (q, k, v) = (ramp(lq * dh, 1), ramp(lk * dh, 2), ramp(lk * dh, 3));
        let (ql, kl) = (
            Layout::contiguous(&[1, 1, lq, dh]),
            Layout::contiguous(&[1, 1, lk, dh]),
        );
        let window = Window {
            before: Some(2),
            after: Some(1),
        };
        let bias: Vec<f32> = (0..lq * lk)
            .map(|x| {
                let (lo, hi) = window.keys(x / lk, lk);
                if (lo..hi).contains(&(x % lk)) {
                    0.0
                } else {
                    -1e9
                }
            })
            .collect();
        let bl = Layout::contiguous(&[1, 1, lq, lk]);
        for kind in [Kind::Portable, Kind::Avx2, Kind::Avx512] {
            let run = |w: Window, b: Option<(&[f32], &Layout)>| {
                let mut out = vec![f32::NAN; lq * dh];
                attention(
                    &q,
                    &ql,
                    &k,
                    &kl,
                    &v,
                    &kl,
                    b,
                    0.5,
                    w,
                    &mut out,
                    Par::serial(),
                )
                .unwrap();
                out
            };
            let Some((got, want)) = with_path(kind, || {
                (run(window, None), run(Window::ALL, Some((&bias, &bl))))
            }) else {
                continue;
            };
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let row = i / dh;
                let (lo, hi) = window.keys(row, lk);
                if lo >= hi {
                    assert_eq!(*g, 0.0, "{kind:?} row {row}");
                } else {
                    assert!((g - w).abs() <= 1e-6, "{kind:?} element {i}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn shape_errors_name_the_operand() {
        let lay = Layout::contiguous(&[1, 1, 2, 4]);
        let x = [0.0f32; 8];
        let mut out = [0.0f32; 8];
        let short = attention(
            &x[..7],
            &lay,
            &x,
            &lay,
            &x,
            &lay,
            None,
            1.0,
            Window::ALL,
            &mut out,
            Par::serial(),
        );
        assert!(short.unwrap_err().0.contains("q"));
        let rank3 = Layout::contiguous(&[1, 2, 4]);
        let e = attention(
            &x,
            &lay,
            &x,
            &rank3,
            &x,
            &lay,
            None,
            1.0,
            Window::ALL,
            &mut out,
            Par::serial(),
        );
        assert!(e.unwrap_err().0.contains("k must be"));
        let e = attention(
            &x,
            &lay,
            &x,
            &lay,
            &x,
            &lay,
            None,
            1.0,
            Window::ALL,
            &mut out[..4],
            Par::serial(),
        );
        assert!(e.is_err());
    }
}
