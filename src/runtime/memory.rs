//! How much tensor memory is in use, and how much free storage the pool may keep.
//!
//! Live buffers and the arenas of running segments count as memory in use; its peak
//! since [`reset_peak_bytes`] is reported, and its peak over the last windows of
//! segments sets the default limit of the pool ([`pool_limit`]), which keeps free
//! buffer storage and arenas together (the pool itself is `crate::reuse::pool`).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::storage::{try_zeroed, AllocError, Storage};
use crate::reuse::pool::Pool;

/// Buffers alive now.
pub(super) static LIVE_BUFFERS: AtomicUsize = AtomicUsize::new(0);
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);
/// The most tensor memory in use at once in the current window of segments.
static WINDOW_PEAK: AtomicUsize = AtomicUsize::new(0);
/// The same for the window before it.
static LAST_WINDOW_PEAK: AtomicUsize = AtomicUsize::new(0);
/// Segments ended since the process started (they move the windows on).
static SEGMENTS_ENDED: AtomicUsize = AtomicUsize::new(0);

/// Segments per window of the recent peak that sets the default pool limit.
const PEAK_WINDOW: usize = 64;

/// Adds `delta` bytes to the tensor memory in use (buffers and arenas) and updates the
/// peaks.
pub(crate) fn add_live_bytes(delta: usize) {
    let now = LIVE_BYTES.fetch_add(delta, Ordering::Relaxed) + delta;
    PEAK_BYTES.fetch_max(now, Ordering::Relaxed);
    if now > WINDOW_PEAK.load(Ordering::Relaxed) {
        WINDOW_PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

/// Marks the end of a segment: every [`PEAK_WINDOW`] segments the window of the recent
/// peak moves on (the older window is forgotten), and a pool above its default limit,
/// which may have dropped, is trimmed.
pub(crate) fn segment_done() {
    if SEGMENTS_ENDED.fetch_add(1, Ordering::Relaxed) % PEAK_WINDOW != PEAK_WINDOW - 1 {
        return;
    }
    let ended = WINDOW_PEAK.swap(LIVE_BYTES.load(Ordering::Relaxed), Ordering::Relaxed);
    LAST_WINDOW_PEAK.store(ended, Ordering::Relaxed);
    POOL.trim_to(pool_limit());
}

/// Removes `delta` bytes from the tensor memory in use.
pub(crate) fn sub_live_bytes(delta: usize) {
    LIVE_BYTES.fetch_sub(delta, Ordering::Relaxed);
}

/// The most tensor memory (buffers and arenas, in bytes) in use at once since the
/// last [`reset_peak_bytes`].
pub(crate) fn peak_bytes() -> usize {
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// Starts a new peak measurement from the memory in use now.
pub(crate) fn reset_peak_bytes() {
    PEAK_BYTES.store(LIVE_BYTES.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Number of buffers alive now (held by tensors, queued ops or running kernels; pooled
/// free storage is not counted).
pub(crate) fn live_buffers() -> usize {
    LIVE_BUFFERS.load(Ordering::Relaxed)
}

/// Bytes of tensor memory in use: live buffers (with their size-class slack) and
/// arenas of running segments.
pub(crate) fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Bytes of free buffer storage the pool keeps for reuse (arenas not included: see
/// [`pooled_arena_bytes`]).
pub(crate) fn pooled_bytes() -> usize {
    POOL.class_bytes()
}

/// Bytes of free arenas the pool keeps for the plan executor.
pub(crate) fn pooled_arena_bytes() -> usize {
    POOL.arena_bytes()
}

/// The least the default pool limit allows: below this, small programs would free and
/// allocate again for nothing.
pub(super) const POOL_LIMIT_FLOOR: usize = 64 << 20;

/// The limit set by [`set_pool_limit`]; `usize::MAX` for the default.
static FIXED_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The most bytes of free storage the pool keeps, buffers and arenas together.
///
/// By default it is the larger of 64 MiB and twice the most
/// tensor memory (live buffers and running arenas) in use at once during the last 64
/// to 128 segments. A program that repeats the same passes thus keeps everything its
/// next pass will ask for (a pass never needs more free storage than it had in use),
/// with room for the size classes' slack and for arenas of other sizes; a program whose
/// segments get smaller gives the difference back within 128 segments; and no
/// program keeps more than twice what it recently used. [`set_pool_limit`] replaces
/// the default with a fixed limit.
pub fn pool_limit() -> usize {
    match FIXED_LIMIT.load(Ordering::Relaxed) {
        usize::MAX => {
            let recent = WINDOW_PEAK
                .load(Ordering::Relaxed)
                .max(LAST_WINDOW_PEAK.load(Ordering::Relaxed));
            POOL_LIMIT_FLOOR.max(recent.saturating_mul(2))
        }
        fixed => fixed,
    }
}

/// Fixes the most bytes of free storage the buffer and arena pools keep together
/// (`usize::MAX` goes back to the default of [`pool_limit`]); what the pool keeps
/// beyond it now is freed at once, the storage given back longest ago first. A limit
/// of 0 pools nothing: every buffer and arena is allocated afresh.
pub fn set_pool_limit(bytes: usize) {
    FIXED_LIMIT.store(bytes, Ordering::Relaxed);
    POOL.trim_to(pool_limit());
}

/// Frees every buffer and arena the pool keeps now (tensors in use are not touched).
pub fn trim_pools() {
    POOL.trim_to(0);
}

/// Free buffer storage and arenas (see [`pool_limit`]).
pub(super) static POOL: Pool<Storage, f32> = Pool::new();

/// Where a segment's arena starts: a multiple of this many bytes (a cache line, and
/// one AVX-512 vector). The memory plan puts every buffer at a multiple of 64 bytes
/// from the arena's start, so with the start aligned each buffer's rows are aligned
/// too. The allocator gives a large vector 16 bytes past a page boundary, and with
/// the arena starting there every vector load and store of it straddled two cache
/// lines: MiniLM, batches of 32, the two starts alternated batch by batch in one
/// process: two kernel threads 518 -> 531 and 552 -> 563 sentences/s, one 276 -> 277
/// and 263 -> 267.
pub(crate) const ARENA_ALIGN: usize = 64;

/// Elements taken beyond a segment's need, so that an aligned start fits.
const ALIGN_SLACK: usize = ARENA_ALIGN / 4 - 1;

/// A segment's arena: pooled memory whose [`elements`](Arena::elements) start at an
/// [`ARENA_ALIGN`] boundary.
#[derive(Default)]
pub(crate) struct Arena {
    buf: Vec<f32>,
    start: usize,
    len: usize,
}

impl Arena {
    /// The segment's `len` elements, starting at an [`ARENA_ALIGN`] boundary (none
    /// for an arena that could not be allocated).
    pub(crate) fn elements(&mut self) -> &mut [f32] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// An arena of `len` f32 elements for one segment, from the smallest free one that
/// fits, or a fresh one in place of the largest free one (after freeing what the pool
/// keeps and trying once more, if the system refuses). Counted as memory in use until
/// [`give_back_arena`].
pub(crate) fn take_arena(len: usize) -> Result<Arena, AllocError> {
    if len == 0 {
        return Ok(Arena::default());
    }
    let need = len.saturating_add(ALIGN_SLACK);
    let buf = match POOL.take_arena(need) {
        Ok(a) => a,
        Err(smaller) => {
            drop(smaller);
            try_zeroed(need)
                .or_else(|_| {
                    trim_pools();
                    try_zeroed(need)
                })
                // The segment's need, which the plan states, not the slack.
                .map_err(|_| AllocError {
                    bytes: len.saturating_mul(4),
                })?
        }
    };
    add_live_bytes(buf.len() * 4);
    // An f32 vector starts at a multiple of 4 bytes, so the boundary is at most
    // ALIGN_SLACK elements on.
    let start = buf.as_ptr().align_offset(ARENA_ALIGN).min(ALIGN_SLACK);
    Ok(Arena { buf, start, len })
}

/// Gives a segment's arena back to the pool (within the pool limit).
pub(crate) fn give_back_arena(arena: Arena) {
    if arena.buf.is_empty() {
        return;
    }
    sub_live_bytes(arena.buf.len() * 4);
    POOL.give_back_arena(arena.buf, pool_limit());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arena_starts_at_a_cache_line_whatever_the_pool_gives() {
        let mut arenas = Vec::new();
        // Fresh arenas, then the same lengths again from the pool (whose vectors start
        // wherever the allocator put them), then a smaller one from a larger free one.
        for len in [1, 5, 16, 17, 1000, 100_000, 1000, 1, 3] {
            let mut arena = take_arena(len).unwrap();
            let elements = arena.elements();
            assert_eq!(elements.len(), len);
            assert_eq!(elements.as_ptr() as usize % ARENA_ALIGN, 0, "len {len}");
            elements.fill(1.0);
            arenas.push(arena);
            if arenas.len() % 3 == 0 {
                arenas.drain(..).for_each(give_back_arena);
            }
        }
        arenas.into_iter().for_each(give_back_arena);
        assert!(take_arena(0).unwrap().elements().is_empty());
    }
}
