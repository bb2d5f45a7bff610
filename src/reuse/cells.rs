//! Free lists of `Arc` cells: tensor handles, slots and shared buffers.
//!
//! Every recorded op makes a tensor handle and a slot, and every escaping result gets a
//! shared buffer; each is an `Arc`. Instead of freeing an `Arc` whose last reference the
//! engine itself lets go, its owner empties it and keeps it on a free list, and the next
//! op takes it from there. Only an `Arc` that is provably unique ([`Arc::get_mut`]
//! succeeds: no other strong or weak reference) is kept ([`last_ref`] finds it, `give`
//! checks it again), so a recycled cell can never be observed by anyone else.
//!
//! Two kinds of list, each bounded by [`MAX_FREE`] cells:
//! - [`LocalCells`], the value of a `thread_local!`: no lock and no contention between
//!   streams, for cells a thread both makes and lets go of (handles and slots: a
//!   stream's thread records its ops and recycles their tasks). A thread that ends
//!   frees its list like any other thread-local, and a cell given during or after that
//!   is dropped.
//! - [`SharedCells`], one lock-free queue for the process, for cells made on one
//!   thread and let go on another (shared buffers are made on kernel threads and let
//!   go wherever their tensors die, so per-thread lists would fill on one side and run
//!   dry on the other).

use std::cell::RefCell;
use std::sync::{Arc, LazyLock};
use std::thread::LocalKey;

use crossbeam::queue::ArrayQueue;

/// The most cells one free list keeps.
pub(crate) const MAX_FREE: usize = 4096;

/// The contents of `cell` if this is its only reference (so it may be emptied and
/// kept for reuse). A plain load first: most references are not the last, and for
/// those dropping the `Arc` (one atomic decrement) is all letting go costs.
pub(crate) fn last_ref<T>(cell: &mut Arc<T>) -> Option<&mut T> {
    if Arc::strong_count(cell) != 1 {
        return None;
    }
    Arc::get_mut(cell)
}

/// A free list of one thread: declare it as
/// `thread_local! { static FREE: LocalCells<T> = const { LocalCells::new() }; }` and
/// use it through [`LocalCells::take`] and [`LocalCells::give`].
pub(crate) struct LocalCells<T> {
    free: RefCell<Vec<Arc<T>>>,
}

impl<T: 'static> LocalCells<T> {
    /// An empty list (it allocates on its first `give`).
    pub(crate) const fn new() -> LocalCells<T> {
        LocalCells {
            free: RefCell::new(Vec::new()),
        }
    }

    /// A cell from this thread's list `list` (unique: `Arc::get_mut` succeeds on it).
    pub(crate) fn take(list: &'static LocalKey<LocalCells<T>>) -> Option<Arc<T>> {
        list.try_with(|l| l.free.borrow_mut().pop()).ok().flatten()
    }

    /// Keeps `cell` on this thread's list `list` for a later `take`, if it is unique
    /// and the list has room; drops it otherwise. The caller has emptied it.
    pub(crate) fn give(list: &'static LocalKey<LocalCells<T>>, mut cell: Arc<T>) {
        if Arc::get_mut(&mut cell).is_none() {
            return;
        }
        let _ = list.try_with(|l| {
            if let Ok(mut free) = l.free.try_borrow_mut() {
                if free.len() < MAX_FREE {
                    free.push(cell);
                }
            }
        });
    }
}

/// A free list for the whole process (a lock-free queue): declare it as
/// `static FREE: SharedCells<T> = SharedCells::new();`.
pub(crate) struct SharedCells<T> {
    free: LazyLock<ArrayQueue<Arc<T>>>,
}

/// The queue behind a [`SharedCells`], made on its first use.
fn bounded_queue<T>() -> ArrayQueue<Arc<T>> {
    ArrayQueue::new(MAX_FREE)
}

impl<T> SharedCells<T> {
    /// An empty list (its queue is made on first use).
    pub(crate) const fn new() -> SharedCells<T> {
        SharedCells {
            free: LazyLock::new(bounded_queue::<T>),
        }
    }

    /// A cell from the list (unique: `Arc::get_mut` succeeds on it).
    pub(crate) fn take(&self) -> Option<Arc<T>> {
        self.free.pop()
    }

    /// Keeps `cell` for a later `take`, if it is unique and the list has room; drops
    /// it otherwise. The caller has emptied it.
    pub(crate) fn give(&self, mut cell: Arc<T>) {
        if Arc::get_mut(&mut cell).is_some() {
            let _ = self.free.push(cell);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static FREE: LocalCells<u32> = const { LocalCells::new() };
    }

    #[test]
    fn only_unique_cells_are_kept() {
        let cell = Arc::new(1u32);
        let other = cell.clone();
        LocalCells::give(&FREE, cell);
        assert!(
            LocalCells::take(&FREE).is_none(),
            "a shared cell is not kept"
        );
        let weak = Arc::downgrade(&other);
        LocalCells::give(&FREE, other);
        assert!(
            LocalCells::take(&FREE).is_none(),
            "nor one with a weak reference"
        );
        drop(weak);
        LocalCells::give(&FREE, Arc::new(2));
        let mut kept = LocalCells::take(&FREE).expect("a unique cell is kept");
        assert_eq!(Arc::get_mut(&mut kept), Some(&mut 2));

        let shared = SharedCells::new();
        let cell = Arc::new(3u32);
        shared.give(cell.clone());
        assert!(shared.take().is_none());
        shared.give(cell);
        assert_eq!(shared.take().as_deref(), Some(&3));
    }

    #[test]
    fn lists_are_bounded() {
        for i in 0..MAX_FREE as u32 + 10 {
            LocalCells::give(&FREE, Arc::new(i));
        }
        let mut n = 0;
        while LocalCells::take(&FREE).is_some() {
            n += 1;
        }
        assert_eq!(n, MAX_FREE);
        let shared = SharedCells::new();
        for i in 0..MAX_FREE as u32 + 10 {
            shared.give(Arc::new(i));
        }
        assert_eq!(shared.free.len(), MAX_FREE);
    }
}
