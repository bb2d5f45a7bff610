//! What the tests need to run under user-mode emulation (`scripts/test-aarch64.sh`:
//! the aarch64 suite under `qemu-aarch64`, where code runs 10–50× slower and the
//! kernel may not start an aarch64 program by itself).
//!
//! - The size of the heavy tests: `STREAMFUSE_TEST_SCALE`, a fraction in `(0, 1]` of
//!   their full size (1 when unset; `scripts/test-aarch64.sh` sets 0.05). A heavy test takes its counts
//!   (sentences, rounds, elements) through [`scaled`] and says in its doc what it
//!   scales; what it asserts does not change. The tests of a real model take the
//!   shortest of their texts ([`fewest`]), since their cost grows with the tokens.
//! - Time limits on work that is not scaled: [`patience`] stretches them by the same
//!   factor.
//! - Starting a program (the `streamfuse-plan` CLI, the test binary itself):
//!   [`command`] prefixes `STREAMFUSE_TEST_RUNNER` (the emulator's command line) when
//!   it is set.
//!
//! Included as `mod emulated;` by the tests that use it; not every one uses every item.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::process::Command;
use std::time::Duration;

/// The fraction of their full size the heavy tests run at: `STREAMFUSE_TEST_SCALE`, or
/// 1. A value that is not a number in `(0, 1]` fails the test that asks, naming it.
pub fn fraction() -> f64 {
    match std::env::var("STREAMFUSE_TEST_SCALE") {
        Err(_) => 1.0,
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => f,
            _ => panic!("STREAMFUSE_TEST_SCALE={v:?}: expected a number in (0, 1]"),
        },
    }
}

/// `full` times [`fraction`], rounded up, and at least `least` (never more than
/// `full`).
pub fn scaled(full: usize, least: usize) -> usize {
    let n = (full as f64 * fraction()).ceil() as usize;
    n.max(least).min(full)
}

/// Whether the heavy tests run reduced (`STREAMFUSE_TEST_SCALE` below 1).
pub fn reduced() -> bool {
    fraction() < 1.0
}

/// `items` whole, or, when the heavy tests run reduced, the [`scaled`]`(items.len(),
/// least)` of them whose `len` is smallest, in their order: for the tests of a real
/// model, whose cost grows with the tokens they embed.
pub fn fewest<T>(items: Vec<T>, least: usize, len: impl Fn(&T) -> usize) -> Vec<T> {
    let keep = scaled(items.len(), least);
    if keep >= items.len() {
        return items;
    }
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (len(&items[i]), i));
    let mut chosen = order[..keep].to_vec();
    chosen.sort_unstable();
    let mut items: Vec<Option<T>> = items.into_iter().map(Some).collect();
    chosen
        .iter()
        .map(|&i| items[i].take().expect("chosen once"))
        .collect()
}

/// `limit` divided by [`fraction`]: a time limit a test sets on work it does not scale
/// (a search given a time budget), as much longer as the run is slower.
pub fn patience(limit: Duration) -> Duration {
    limit.div_f64(fraction())
}

/// A command that runs `program`: through `STREAMFUSE_TEST_RUNNER` (a command line,
/// split at spaces, whose last word is followed by the program) when it is set.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let runner = std::env::var("STREAMFUSE_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        None => Command::new(program),
        Some(first) => {
            let mut c = Command::new(first);
            c.args(words).arg(program);
            c
        }
    }
}
