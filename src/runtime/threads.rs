//! The engine's kernel threads: a rayon pool of its own.
//!
//! A segment whose stream may use several threads runs inside this pool
//! ([`run_in_pool`]), so its parallel kernels (rayon joins, gemm's rayon splits) never
//! share workers with the user's rayon jobs. That is what keeps the engine free of
//! deadlocks with rayon: the pool's workers run only engine kernels, which never wait
//! for a tensor or a stream, so a job injected here always finds a worker that will
//! finish it, whatever the user's own pools are blocked on. A thread that waits on
//! this pool (the flushing thread) holds no stream lock while it waits.

use std::sync::OnceLock;

static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();

fn pool() -> Option<&'static rayon::ThreadPool> {
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("streamfuse-kernel-{i}"))
            .build()
            .map_err(|e| log::warn!("no kernel thread pool ({e}); kernels run serially"))
            .ok()
            .inspect(|p| {
                // Every worker has started (and allocated what it allocates at start)
                // before the first kernel runs.
                p.broadcast(|_| ());
            })
    })
    .as_ref()
}

/// The number of kernel threads (1 when the pool could not be started).
pub fn kernel_threads() -> usize {
    pool().map_or(1, |p| p.current_num_threads())
}

/// Runs `f` on a kernel thread, where rayon's parallel calls use the kernel pool;
/// the calling thread blocks until it returns. Runs `f` on the calling thread when the
/// pool could not be started.
pub fn run_in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(p) => p.install(f),
        None => f(),
    }
}
