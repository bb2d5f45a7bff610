//! Whether the calling thread has begun tearing down its thread-locals.
//!
//! Kernels must not run inside a thread-local destructor: the `gemm` crate keeps its
//! packing buffers in thread-locals, and once those are destroyed a matmul on that
//! thread panics, which inside a destructor aborts the process. The engine therefore
//! hands work that would run during teardown to another thread (`stream::closer`).
//!
//! This module tells when that is. The flag is a `const` thread-local without a
//! destructor, so it can be read at any point of teardown. It is set by the stream's
//! own thread-local destructor, and by a guard that a thread registers right after its
//! first matmul: destructors of thread-locals run in the reverse order of their
//! registration (glibc's `__cxa_thread_atexit_impl`), so that guard runs before
//! gemm's own buffers are destroyed. Where the order differs, the kernel boundary
//! still catches the panic and reports it as an error.

use std::cell::Cell;

thread_local! {
    static TEARING_DOWN: Cell<bool> = const { Cell::new(false) };
    static GEMM_GUARD: Guard = const { Guard };
}

/// Marks the calling thread as tearing down when dropped (at thread exit).
struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        mark();
    }
}

/// Whether the calling thread has begun destroying its thread-locals (kernels must
/// then run elsewhere).
pub(crate) fn in_teardown() -> bool {
    TEARING_DOWN.try_with(Cell::get).unwrap_or(true)
}

/// Marks the calling thread as tearing down.
pub(crate) fn mark() {
    let _ = TEARING_DOWN.try_with(|t| t.set(true));
}

/// Registers the guard that marks teardown before gemm's thread-locals go: called
/// after each matmul on a thread (a no-op after the first).
pub(crate) fn after_gemm() {
    let _ = GEMM_GUARD.try_with(|_| ());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::mpsc::{channel, Sender};

    /// Reports `in_teardown()` as seen from its destructor.
    struct Probe(Sender<bool>);

    impl Drop for Probe {
        fn drop(&mut self) {
            let _ = self.0.send(in_teardown());
        }
    }

    thread_local! {
        static PROBE: RefCell<Option<Probe>> = const { RefCell::new(None) };
    }

    #[test]
    fn a_thread_local_older_than_the_first_matmul_sees_teardown() {
        let (tx, rx) = channel();
        let running = std::thread::spawn(move || {
            // The probe is registered first, the guard after it (as gemm's buffers
            // would be), so the guard goes first.
            PROBE.with(|p| *p.borrow_mut() = Some(Probe(tx)));
            after_gemm();
            in_teardown()
        })
        .join()
        .unwrap();
        assert!(!running, "not tearing down while the thread runs");
        assert!(
            rx.recv().unwrap(),
            "the probe's destructor runs after the guard's"
        );
        assert!(!in_teardown(), "other threads are not affected");
    }
}
