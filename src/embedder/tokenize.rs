//! Tokenising a request's texts before they are queued, shared out over the
//! tokenizer threads: a small rayon pool of the embedders' own, one thread per core,
//! asleep between requests.
//!
//! A request's texts are tokenised before any of them can run, while the workers
//! wait, so this is on every call's critical path: 32 texts of all-MiniLM-L6-v2's
//! corpus take about 1 ms on one Zen 5 core, a fiftieth of their forward pass. The
//! threads are kept rather than spawned per request: a scoped thread's start (its
//! stack, its allocator arena coming back into use) cost about what sharing saved
//! (32 texts: 1.04 ms on the calling thread, 1.08 ms with one scoped helper).
//! They are not the kernel pool's, which must stay free for the halves of other
//! requests' kernels while a long request is tokenised.

use std::sync::OnceLock;

use rayon::prelude::*;

/// The fewest texts a thread tokenises when a request's texts are shared out: below
/// it, waking a thread costs about what it saves.
const TOKENIZE_PART: usize = 8;

/// The tokenizer threads (`None` if the pool could not be started: then requests
/// are tokenised on the calling thread).
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("streamfuse-tokenize-{i}"))
            .build()
            .map_err(|e| log::warn!("no tokenizer threads ({e}); texts are tokenised serially"))
            .ok()
    })
    .as_ref()
}

/// `f(index, item)` for every item, in order, in up to `parts` runs of at least
/// [`TOKENIZE_PART`] items on the tokenizer threads (on the calling thread when there
/// is one run); the error of the first item that fails, as a serial loop would give
/// it. A panic in `f` reaches the caller, as in a serial loop (the Python binding and
/// the server catch it there).
pub(super) fn map_in_parts<T: Sync, R: Send, E: Send>(
    items: &[T],
    parts: usize,
    f: impl Fn(usize, &T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E> {
    let run = |first: usize, part: &[T]| -> Result<Vec<R>, E> {
        part.iter()
            .enumerate()
            .map(|(i, item)| f(first + i, item))
            .collect()
    };
    let parts = parts.min(items.len() / TOKENIZE_PART).max(1);
    let pool = match pool() {
        Some(pool) if parts > 1 => pool,
        _ => return run(0, items),
    };
    let size = items.len().div_ceil(parts);
    let results: Vec<Result<Vec<R>, E>> = pool.install(|| {
        items
            .par_chunks(size)
            .enumerate()
            .map(|(p, part)| run(p * size, part))
            .collect()
    });
    let mut out = Vec::with_capacity(items.len());
    for part in results {
        out.extend(part?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shared out or not, the results come back in order, and a failure is the one
    /// of the first item that fails, as in a serial loop.
    #[test]
    fn map_in_parts_keeps_order_and_the_first_error() {
        let items: Vec<usize> = (0..50).collect();
        let square = |i: usize, &x: &usize| -> Result<usize, usize> {
            assert_eq!(i, x);
            Ok(x * x)
        };
        let want: Vec<usize> = items.iter().map(|x| x * x).collect();
        for parts in [1, 2, 3, 8, 100] {
            assert_eq!(map_in_parts(&items, parts, square), Ok(want.clone()));
            assert_eq!(
                map_in_parts(&items[..3], parts, square),
                Ok(want[..3].to_vec())
            );
            assert_eq!(map_in_parts(&items[..0], parts, square), Ok(vec![]));
            // Items 20 and 45 fail (in different parts from 2 parts up): 20 is told.
            let failing = |_: usize, &x: &usize| if x == 20 || x == 45 { Err(x) } else { Ok(x) };
            assert_eq!(map_in_parts(&items, parts, failing), Err(20));
        }
        // Shared out, the parts run on the tokenizer threads; one part runs on the
        // caller's.
        let name = || std::thread::current().name().map(str::to_owned);
        let on = map_in_parts(&items, 2, |_, _| Ok::<_, ()>(name())).unwrap();
        assert!(
            on.iter().all(|n| n
                .as_deref()
                .is_some_and(|n| n.starts_with("streamfuse-tokenize-"))),
            "{on:?}"
        );
        let caller = name();
        let on = map_in_parts(&items[..10], 2, |_, _| Ok::<_, ()>(name())).unwrap();
        assert!(on.iter().all(|n| *n == caller));
    }

    /// A panic in one part reaches the caller, and the threads stay usable.
    #[test]
    fn a_panicking_part_reaches_the_caller() {
        let items: Vec<usize> = (0..32).collect();
        let got = std::panic::catch_unwind(|| {
            map_in_parts(&items, 2, |_, &x| {
                assert!(x != 30, "tokenizer bug");
                Ok::<_, ()>(x)
            })
        });
        assert!(got.is_err());
        assert_eq!(
            map_in_parts(&items, 2, |_, &x| Ok::<_, ()>(x)),
            Ok(items.clone())
        );
    }
}
