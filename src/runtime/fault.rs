//! Fault injection for tests: makes the next kernel run on this thread panic, so the
//! tests can check that a panicking kernel becomes an error on what it was making.

use std::cell::Cell;

thread_local! {
    static PANIC_NEXT: Cell<bool> = const { Cell::new(false) };
}

/// The next kernel run on this thread panics.
pub(crate) fn panic_next_kernel() {
    PANIC_NEXT.with(|p| p.set(true));
}

/// Panics if a panic was asked for (called at the start of every kernel).
pub(crate) fn check() {
    if PANIC_NEXT.with(|p| p.replace(false)) {
        panic!("injected kernel panic");
    }
}
