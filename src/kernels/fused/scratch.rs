//! The scratch memory of the fused kernel, kept so that running a program allocates
//! nothing after warm-up: per-thread kept step lists and register tables (taken and
//! given back by [`Schedule`](super::schedule::Schedule)), spare vectors made ahead
//! for any thread (`Spares`), and per-thread spill tiles ([`with_tiles`]).

use std::cell::RefCell;
use std::thread::LocalKey;

use parking_lot::Mutex;

use super::schedule::{Reg, Step};
use super::BLOCK;

thread_local! {
    /// Emptied step lists of finished schedules, for the next ones on this thread (a
    /// fixed array: keeping a vector never allocates).
    pub(super) static STEP_SCRATCH: RefCell<[Option<Vec<Step>>; 2]> = const { RefCell::new([None, None]) };
    /// Emptied register tables of [`Schedule::build`].
    pub(super) static REG_SCRATCH: RefCell<[Option<Vec<Reg>>; 2]> = const { RefCell::new([None, None]) };
}

/// Vectors made ahead for the threads that may run programs at once (rayon's workers,
/// the threads that flush, a few more), each with room for the usual program: a
/// thread whose own list is empty takes one instead of allocating, so which thread
/// rayon happens to pick for a kernel after warm-up never causes an allocation.
pub(super) struct Spares<T> {
    list: Mutex<Option<Vec<Vec<T>>>>,
    capacity: usize,
}

impl<T> Spares<T> {
    const fn new(capacity: usize) -> Spares<T> {
        Spares {
            list: Mutex::new(None),
            capacity,
        }
    }

    fn take(&self) -> Vec<T> {
        let mut list = self.list.lock();
        let list = list.get_or_insert_with(|| {
            let n = threads_ahead();
            let mut list = Vec::with_capacity(2 * n);
            list.extend((0..n).map(|_| Vec::with_capacity(self.capacity)));
            list
        });
        list.pop()
            .unwrap_or_else(|| Vec::with_capacity(self.capacity))
    }

    /// Keeps an emptied vector for any thread (up to twice the number made ahead).
    fn give(&self, v: Vec<T>) {
        let mut list = self.list.lock();
        if let Some(list) = list.as_mut() {
            if list.len() < list.capacity() {
                list.push(v);
            }
        }
    }
}

/// Step lists made ahead (a 64-op program has at most about 200 steps).
pub(super) static STEP_SPARES: Spares<Step> = Spares::new(256);
/// Register tables made ahead.
pub(super) static REG_SPARES: Spares<Reg> = Spares::new(256);

/// An empty vector from this thread's kept ones, or from the spares made ahead.
pub(super) fn take_scratch<T>(
    kept: &'static LocalKey<RefCell<[Option<Vec<T>>; 2]>>,
    spares: &Spares<T>,
) -> Vec<T> {
    kept.try_with(|k| {
        k.try_borrow_mut()
            .ok()
            .and_then(|mut k| k.iter_mut().find_map(Option::take))
    })
    .ok()
    .flatten()
    .unwrap_or_else(|| spares.take())
}

/// Keeps `v` (emptied) for this thread, or gives it back to the spares.
pub(super) fn give_scratch<T>(
    kept: &'static LocalKey<RefCell<[Option<Vec<T>>; 2]>>,
    spares: &Spares<T>,
    mut v: Vec<T>,
) {
    v.clear();
    if v.capacity() == 0 {
        return;
    }
    let mut v = Some(v);
    let _ = kept.try_with(|k| {
        if let Ok(mut k) = k.try_borrow_mut() {
            if let Some(free) = k.iter_mut().find(|x| x.is_none()) {
                *free = v.take();
            }
        }
    });
    if let Some(v) = v {
        spares.give(v);
    }
}

/// How many threads may run programs at once, for the spares made ahead: the cores
/// (rayon's default pool size) and a few more. Asking rayon itself would start its
/// pool, whose idle workers then cost streams that never use it.
fn threads_ahead() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) + 4
}

/// Floats per spare block: 8 portable tiles or 32 AVX-512 ones (the usual schedule
/// has a handful). Kept small on purpose: every new thread takes one, and 64 KiB blocks
/// made a thread's first pass 4x slower (fresh pages on each thread's first use and
/// trimmed at its exit), which cost the two-thread MLP bench 20%.
const SPARE_TILE_FLOATS: usize = 8 * BLOCK;

/// Spill-tile memory made ahead (empty vectors with room for [`SPARE_TILE_FLOATS`]):
/// a thread's first program takes one instead of allocating.
static TILE_SPARES: Spares<f32> = Spares::new(SPARE_TILE_FLOATS);

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
