//! Free lists of reference-counted cells, so that a repeated forward pass allocates
//! nothing once it has run once.
//!
//! Every recorded op makes a tensor handle and a slot, and every escaping result gets a
//! shared buffer; each is an `Arc`. Instead of freeing an `Arc` whose last reference the
//! engine itself lets go, the engine empties it and keeps it on a free list of its
//! thread; the next op of that thread takes it from there. Only an `Arc` that is
//! provably unique ([`Arc::get_mut`] succeeds: no other strong or weak reference) is
//! kept, so a recycled cell can never be observed by anyone else. The lists of handles
//! and slots are per thread (no lock, no contention between streams: a stream's thread
//! both makes and, after its flushes, lets go of them) and a thread that ends frees
//! its lists like any other thread-local; the list of shared buffers is one lock-free
//! queue for the process (see [`buffers`]). All are bounded ([`MAX_FREE`]).

use std::sync::Arc;

/// The most cells of one kind a thread keeps free.
pub const MAX_FREE: usize = 4096;

/// The contents of `cell` if this is its only reference (so it may be emptied and
/// kept for reuse). A plain load first: most references are not the last, and for
/// those dropping the `Arc` (one atomic decrement) is all letting go costs.
pub(crate) fn last_ref<T>(cell: &mut Arc<T>) -> Option<&mut T> {
    if Arc::strong_count(cell) != 1 {
        return None;
    }
    Arc::get_mut(cell)
}

/// Defines a thread-local free list of `Arc<$t>` with `take` and `give` functions.
macro_rules! free_list {
    ($(#[$doc:meta])* $name:ident, $t:ty) => {
        $(#[$doc])*
        pub(crate) mod $name {
            use std::cell::RefCell;
            use std::sync::Arc;

            thread_local! {
                static FREE: RefCell<Vec<Arc<$t>>> = const { RefCell::new(Vec::new()) };
            }

            /// A cell from this thread's free list (unique: `Arc::get_mut` succeeds on it).
            pub(crate) fn take() -> Option<Arc<$t>> {
                FREE.try_with(|f| f.borrow_mut().pop()).ok().flatten()
            }

            /// Keeps `cell` for a later `take`, if it is unique and the list has room;
            /// drops it otherwise. The caller has emptied it.
            pub(crate) fn give(mut cell: Arc<$t>) {
                if Arc::get_mut(&mut cell).is_none() {
                    return;
                }
                let _ = FREE.try_with(|f| {
                    if let Ok(mut f) = f.try_borrow_mut() {
                        if f.len() < $crate::reuse::cells::MAX_FREE {
                            f.push(cell);
                        }
                    }
                });
            }
        }
    };
}

free_list!(
    /// Free slots (state `Pending`).
    slots,
    crate::runtime::Slot
);
/// Free shared buffers (no storage), in one list for the whole process: buffers are
/// made where a segment runs (a kernel thread, when the stream runs its kernels on
/// the pool) and let go where their tensors die (any thread), so per-thread lists
/// would fill on one side and run dry on the other.
pub(crate) mod buffers {
    use std::sync::{Arc, LazyLock};

    use crossbeam::queue::ArrayQueue;

    use crate::runtime::Buffer;

    static FREE: LazyLock<ArrayQueue<Arc<Buffer>>> =
        LazyLock::new(|| ArrayQueue::new(super::MAX_FREE));

    /// A cell from the free list (unique: `Arc::get_mut` succeeds on it).
    pub(crate) fn take() -> Option<Arc<Buffer>> {
        FREE.pop()
    }

    /// Keeps `cell` for a later `take`, if it is unique and the list has room; drops it
    /// otherwise. The caller has emptied it.
    pub(crate) fn give(mut cell: Arc<Buffer>) {
        if Arc::get_mut(&mut cell).is_some() {
            let _ = FREE.push(cell);
        }
    }
}

pub(crate) use free_list;
