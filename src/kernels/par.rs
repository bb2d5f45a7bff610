//! Splitting a kernel's output into rayon tasks.
//!
//! All kernels write a contiguous `dst`, so parallelism is always the same shape: cut
//! `dst` into chunks of whole *units* (an element, a row, a matrix), hand each chunk and
//! the index of its first unit to a task, and let the task compute its part. The helper
//! here decides whether to split at all and how big the chunks are:
//!
//! * with [`Par::threads`] `== 1`, or less than two tasks' worth of work, the whole
//!   output is one chunk run on the calling thread (no rayon involvement);
//! * otherwise each chunk carries at least [`MIN_TASK_WORK`] units of work (so the
//!   scheduling cost is amortised and a chunk is about cache-sized), and when the kernel
//!   may use fewer threads than the pool has, chunks are made large enough that at most
//!   `threads` of them exist.

use rayon::prelude::*;

use super::Par;

/// The least work (roughly: element operations) one rayon task should get. Tests use a
/// tiny value so that small tensors exercise the chunked code paths.
pub(crate) const MIN_TASK_WORK: usize = if cfg!(test) { 24 } else { 1 << 16 };

/// The most rows of a product split by columns ([`Split::of`]): the tokens of a request
/// or two, whose rows are too few to share out. Tests use fewer rows, so that both
/// splits run on small matrices.
pub(crate) const SHORT_M: usize = if cfg!(test) { 20 } else { 128 };

/// Below this many multiply-adds per matrix a product runs on one thread
/// ([`Split::of`]).
pub(crate) const PRODUCT_PAR_WORK: usize = if cfg!(test) { 1 << 9 } else { 64 * 64 * 64 };

/// How a matrix product's work is shared between threads: the one split policy,
/// whichever kernel runs the product. The plan builder decides it once per product
/// ([`Split::of`], stored in its `ProductPlan`); the kernels follow it with the threads
/// the run is given (with one thread every split runs serially).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Split {
    /// On one thread: fewer than [`PRODUCT_PAR_WORK`] multiply-adds per matrix, one
    /// matrix.
    Serial,
    /// The matrices of a batch of small products shared out whole between threads.
    Batch,
    /// Each matrix cut into blocks of rows, each thread computing all columns of its
    /// rows.
    Rows,
    /// Each matrix cut into blocks of columns, each thread reading only its part of
    /// the right operand (a weight, from DRAM when it is larger than the cache).
    Columns,
}

impl Split {
    /// The split of `batch` products `[m, k] x [k, n]`: below [`PRODUCT_PAR_WORK`]
    /// multiply-adds per matrix, whole matrices between threads (or none for one);
    /// above, by columns when the product has at most [`SHORT_M`] rows (the tokens of a
    /// request or two) and two blocks of [`SPLIT_COLUMNS`] columns to share, else by
    /// rows.
    pub(crate) fn of(batch: usize, m: usize, n: usize, k: usize) -> Split {
        if m.saturating_mul(n).saturating_mul(k) < PRODUCT_PAR_WORK {
            if batch > 1 {
                Split::Batch
            } else {
                Split::Serial
            }
        } else if m <= SHORT_M && n >= 2 * SPLIT_COLUMNS {
            Split::Columns
        } else {
            Split::Rows
        }
    }

    /// Its name, for plan listings.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Split::Serial => "serial",
            Split::Batch => "by matrices",
            Split::Rows => "by rows",
            Split::Columns => "by columns",
        }
    }
}

/// A short product is split by columns only when it has at least two blocks of this
/// many columns (one AVX-512 vector: `gemm_columns` cuts at multiples of it; the packed
/// tiles cut at whole panels of 32, so below 64 columns they run one part). With fewer
/// it is split by rows. Attention's context product when unfused, `p · v` with 32
/// columns a head, splits by columns so: at two blocks of 32 instead, it went to gemm's
/// row split and `benches/fusion.rs`'s BERT layer ran 3.2% slower (medians of 8
/// alternated runs, 10.91 -> 11.27 ms, slower in all 8; Zen 5).
pub(crate) const SPLIT_COLUMNS: usize = 16;

/// Whether `work` element operations are worth more than one thread (at least two
/// tasks' worth; below that every kernel would run on one thread anyway).
pub(crate) fn worth_splitting(work: usize) -> bool {
    work >= 2 * MIN_TASK_WORK
}

/// Runs `f(first_unit, chunk)` over `dst` cut into chunks of whole units of `unit`
/// elements, where one unit costs about `cost_per_unit` element operations.
///
/// `dst.len()` must be a multiple of `unit` (callers guarantee it); a `unit` of 0 or an
/// empty `dst` does nothing.
pub(crate) fn for_each_chunk<T, F>(dst: &mut [T], unit: usize, cost_per_unit: usize, par: Par, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync + Send,
{
    if unit == 0 || dst.is_empty() {
        return;
    }
    let units = dst.len() / unit;
    let per_task = units_per_task(units, cost_per_unit, par);
    if per_task >= units {
        f(0, dst);
        return;
    }
    dst.par_chunks_mut(per_task * unit)
        .enumerate()
        .for_each(|(i, chunk)| f(i * per_task, chunk));
}

/// Cuts every slice of `outs` at `mid` and runs `left` on the first parts and `right`
/// on the rest at once (`rayon::join`, which needs no allocation), returning both
/// results. The pieces are kept on the stack for up to 8 outputs.
pub(crate) fn join_split<RA, RB>(
    outs: &mut [&mut [f32]],
    mid: usize,
    left: impl FnOnce(&mut [&mut [f32]]) -> RA + Send,
    right: impl FnOnce(&mut [&mut [f32]]) -> RB + Send,
) -> (RA, RB)
where
    RA: Send,
    RB: Send,
{
    const INLINE: usize = 8;
    let n = outs.len();
    if n > INLINE {
        let (mut a, mut b): (Vec<&mut [f32]>, Vec<&mut [f32]>) =
            outs.iter_mut().map(|o| o.split_at_mut(mid)).unzip();
        return rayon::join(|| left(&mut a), || right(&mut b));
    }
    let mut a: [&mut [f32]; INLINE] = Default::default();
    let mut b: [&mut [f32]; INLINE] = Default::default();
    for ((o, x), y) in outs.iter_mut().zip(&mut a).zip(&mut b) {
        (*x, *y) = o.split_at_mut(mid);
    }
    rayon::join(|| left(&mut a[..n]), || right(&mut b[..n]))
}

/// An output written through a raw pointer by the tasks of a split, each its own
/// elements, where those elements interleave so that no task can hold a `&mut` slice
/// of its part: a product split by columns (each task's panels, in every row), or
/// attention split by heads (each task's heads' columns, in every row). Tasks take
/// their elements as short-lived slices ([`Out::part`]).
#[derive(Clone, Copy)]
pub(crate) struct Out {
    /// The first element.
    pub(crate) ptr: *mut f32,
    /// The number of elements.
    pub(crate) len: usize,
}

impl Out {
    /// The output `dst`: the `Out` must not be used after this borrow of `dst` ends.
    pub(crate) fn new(dst: &mut [f32]) -> Out {
        Out {
            ptr: dst.as_mut_ptr(),
            len: dst.len(),
        }
    }

    /// The output from element `start` on.
    pub(crate) fn skip(self, start: usize) -> Out {
        assert!(start <= self.len);
        Out {
            // SAFETY: `start <= len`, so the pointer stays inside (or one past the end
            // of) the output's allocation.
            ptr: unsafe { self.ptr.add(start) },
            len: self.len - start,
        }
    }

    /// Elements `start..start + len` as a slice.
    ///
    /// # Safety
    ///
    /// No one else reads or writes these elements while the slice lives (in a split,
    /// they belong to the calling task).
    pub(crate) unsafe fn part<'a>(self, start: usize, len: usize) -> &'a mut [f32] {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: the range is inside the output (asserted), and the caller
        // guarantees nobody else touches it while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

// SAFETY: an `Out` is shared only by the tasks of one split (the packed product's
// `split_rows` and `split_columns`, `gemm_columns`, attention's `Job::split`), which write disjoint
// elements (disjoint rows, or disjoint columns of the same rows); nobody reads the
// output until the split returns (rayon::join waits for both halves), and the `&mut`
// borrow it was made from outlives the split.
unsafe impl Sync for Out {}
// SAFETY: as for `Sync` just above: moving an `Out` to a task of the split moves only
// the pointer, and the split's tasks write disjoint elements.
unsafe impl Send for Out {}

/// How many units one task gets; `>= units` means "run serially".
pub(crate) fn units_per_task(units: usize, cost_per_unit: usize, par: Par) -> usize {
    let cost = cost_per_unit.max(1);
    if par.threads <= 1 || units.saturating_mul(cost) < 2 * MIN_TASK_WORK {
        return units.max(1);
    }
    let mut per_task = MIN_TASK_WORK.div_ceil(cost).max(1);
    if par.threads < rayon::current_num_threads() {
        per_task = per_task.max(units.div_ceil(par.threads));
    }
    per_task
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_runs_one_chunk() {
        let mut v = vec![0u32; 1000];
        for_each_chunk(&mut v, 10, 1000, Par::serial(), |first, chunk| {
            assert_eq!(first, 0);
            assert_eq!(chunk.len(), 1000);
        });
    }

    #[test]
    fn chunks_cover_whole_units() {
        let mut v = vec![0usize; 10 * 37];
        for_each_chunk(&mut v, 10, 5, Par { threads: 4 }, |first, chunk| {
            assert_eq!(chunk.len() % 10, 0);
            for (i, row) in chunk.chunks_mut(10).enumerate() {
                row.fill(first + i);
            }
        });
        for (i, row) in v.chunks(10).enumerate() {
            assert!(row.iter().all(|&x| x == i));
        }
        assert!(units_per_task(37, 5, Par { threads: 4 }) < 37);
    }
}
