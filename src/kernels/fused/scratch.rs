//! The scratch memory of the fused kernel, kept so that running a program allocates
//! nothing after warm-up: per-thread kept step lists and register tables (taken and
//! given back by [`Schedule`](super::schedule::Schedule)), spare vectors made ahead
//! for any thread ([`MadeAhead`], from `reuse`), and per-thread spill tiles ([`with_tiles`]).

use std::cell::RefCell;

use super::schedule::{AccInstr, Reg};
use super::BLOCK;
use crate::reuse::ahead::MadeAhead;

thread_local! {
    /// Emptied step lists of finished schedules, for the next ones on this thread (a
    /// fixed array: keeping a vector never allocates).
    pub(super) static STEP_SCRATCH: RefCell<[Option<Vec<AccInstr>>; 2]> = const { RefCell::new([None, None]) };
    /// Emptied register tables of [`Schedule::build`].
    pub(super) static REG_SCRATCH: RefCell<[Option<Vec<Reg>>; 2]> = const { RefCell::new([None, None]) };
}

/// Instruction lists made ahead (a 64-op program has at most about 200 instructions).
pub(super) static STEP_SPARES: MadeAhead<AccInstr> = MadeAhead::new(256);
/// Register tables made ahead.
pub(super) static REG_SPARES: MadeAhead<Reg> = MadeAhead::new(256);

/// Floats per spare block: 8 portable tiles or 32 AVX-512 ones (the usual schedule
/// has a handful). Kept small on purpose: every new thread takes one, and 64 KiB blocks
/// made a thread's first pass 4x slower (fresh pages on each thread's first use and
/// trimmed at its exit), which cost the two-thread MLP bench 20%.
const SPARE_TILE_FLOATS: usize = 8 * BLOCK;

/// Spill-tile memory made ahead (empty vectors with room for [`SPARE_TILE_FLOATS`]):
/// a thread's first program takes one instead of allocating.
static TILE_SPARES: MadeAhead<f32> = MadeAhead::new(SPARE_TILE_FLOATS);

/// Calls `f` with `count` spill tiles of `N` floats from this thread's scratch (grown
/// when too short, never shrunk), so running a program allocates nothing after
/// warm-up. Tiles hold stale values: a schedule writes a tile before reading it.
pub(super) fn with_tiles<const N: usize, R>(
    count: usize,
    f: impl FnOnce(&mut [[f32; N]]) -> R,
) -> R {
    thread_local! {
        static TILES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }
    let len = count * N;
    let mut f = Some(f);
    let done = TILES.try_with(|t| {
        // A program never runs inside another on one thread; if one somehow did, the
        // borrow fails and that run gets tiles of its own.
        let mut t = t.try_borrow_mut().ok()?;
        if t.capacity() == 0 {
            *t = TILE_SPARES.take();
        }
        if t.len() < len {
            // Within the spare's room when it fits (no allocation), doubled beyond.
            let room = if len <= t.capacity() {
                t.capacity()
            } else {
                len.next_power_of_two()
            };
            t.resize(room, 0.0);
        }
        let (tiles, _) = t[..len].as_chunks_mut::<N>();
        Some((f.take().expect("called once"))(tiles))
    });
    match done {
        Ok(Some(r)) => r,
        _ => (f.take().expect("not called yet"))(&mut vec![[0f32; N]; count]),
    }
}
