//! Vectors made ahead for every thread that may run kernels, and the two vectors each
//! such thread keeps for itself: how a kernel's scratch (the fused kernel's step lists,
//! register tables and spill tiles) costs no allocation, whichever thread rayon picks.
//!
//! A thread takes from its own kept pair first ([`take_scratch`]), then from the
//! process-wide [`MadeAhead`] list; it gives back (cleared) to its own pair first, then
//! to the list ([`give_scratch`]). Both are bounded: two per thread, and twice the
//! number made ahead in the list.

use std::cell::RefCell;
use std::thread::LocalKey;

use parking_lot::Mutex;

/// A thread's own kept vectors of one kind: a fixed array, so keeping one never
/// allocates.
pub(crate) type ThreadKept<T> = LocalKey<RefCell<[Option<Vec<T>>; 2]>>;

/// Vectors made ahead for the threads that may run programs at once (rayon's workers,
/// the threads that flush, a few more), each with room for the usual program: a
/// thread whose own list is empty takes one instead of allocating, so which thread
/// rayon happens to pick for a kernel after warm-up never causes an allocation.
pub(crate) struct MadeAhead<T> {
    list: Mutex<Option<Vec<Vec<T>>>>,
    capacity: usize,
}

impl<T> MadeAhead<T> {
    pub(crate) const fn new(capacity: usize) -> MadeAhead<T> {
        MadeAhead {
            list: Mutex::new(None),
            capacity,
        }
    }

    pub(crate) fn take(&self) -> Vec<T> {
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
    pub(crate) fn give(&self, v: Vec<T>) {
        let mut list = self.list.lock();
        if let Some(list) = list.as_mut() {
            if list.len() < list.capacity() {
                list.push(v);
            }
        }
    }
}

/// An empty vector from this thread's kept ones, or from the spares made ahead.
pub(crate) fn take_scratch<T>(kept: &'static ThreadKept<T>, spares: &MadeAhead<T>) -> Vec<T> {
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
pub(crate) fn give_scratch<T>(kept: &'static ThreadKept<T>, spares: &MadeAhead<T>, mut v: Vec<T>) {
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

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    thread_local! {
        static KEPT: RefCell<[Option<Vec<u64>>; 2]> = const { RefCell::new([None, None]) };
    }

    #[test]
    fn a_thread_keeps_two_cleared_vectors_and_the_list_is_bounded() {
        let ahead: MadeAhead<u64> = MadeAhead::new(16);
        // The first take makes the list ahead; every vector has the room asked for.
        let a = take_scratch(&KEPT, &ahead);
        assert!(a.is_empty() && a.capacity() >= 16);
        let made = threads_ahead();
        let mut taken: Vec<Vec<u64>> = (0..made + 3).map(|_| ahead.take()).collect();
        assert!(
            taken.iter().all(|v| v.capacity() >= 16),
            "past the list: fresh ones"
        );
        // Given back with values: kept cleared by this thread (two), the rest listed.
        let mut v = a;
        v.extend([1, 2, 3]);
        give_scratch(&KEPT, &ahead, v);
        give_scratch(&KEPT, &ahead, vec![9; 4]);
        let first = take_scratch(&KEPT, &ahead);
        assert!(first.is_empty() && first.capacity() >= 3, "kept, cleared");
        // The list holds at most twice the number made ahead.
        for v in taken.drain(..) {
            ahead.give(v);
        }
        for _ in 0..3 * made {
            ahead.give(Vec::with_capacity(1));
        }
        let listed = ahead.list.lock().as_ref().map_or(0, |l| l.len());
        assert!(listed <= 2 * made, "{listed} listed, bound {}", 2 * made);
    }
}
