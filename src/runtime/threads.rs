//! The engine's kernel threads: a rayon pool of its own.
//!
//! A segment whose stream may use several threads runs inside this pool
//! ([`run_in_pool`]), so its parallel kernels (rayon joins, gemm's rayon splits) never
//! share workers with the user's rayon jobs. That is what keeps the engine free of
//! deadlocks with rayon: the pool's workers run only engine kernels, which never wait
//! for a tensor or a stream, so a job injected here always finds a worker that will
//! finish it, whatever the user's own pools are blocked on. A thread that waits on
//! this pool (the flushing thread) holds no stream lock while it waits.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
pub(crate) fn kernel_threads() -> usize {
    pool().map_or(1, |p| p.current_num_threads())
}

/// [`kernel_threads`] without starting the pool: before it starts, the threads it
/// will have (one per core).
pub(crate) fn kernel_threads_unstarted() -> usize {
    match POOL.get() {
        Some(p) => p.as_ref().map_or(1, |p| p.current_num_threads()),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// Runs `f` on a kernel thread, where rayon's parallel calls use the kernel pool;
/// the calling thread blocks until it returns. `f`'s kernels use at most `threads`
/// threads (their `Par`), and only that many workers are kept awake for them. Runs
/// `f` on the calling thread when the pool could not be started.
pub(crate) fn run_in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(p) if p.current_num_threads() > 1 && threads > 1 && kernel_spin() => {
            let active = Active::enter();
            if active.alone {
                let spinners = threads.min(p.current_num_threads()) - 1;
                p.install(|| with_workers_awake(spinners, f))
            } else {
                p.install(f)
            }
        }
        Some(p) => p.install(f),
        None => f(),
    }
}

/// One flush counted in [`ACTIVE`] from before it enters the pool until it leaves.
struct Active {
    /// Whether no other flush was in the pool when this one came.
    alone: bool,
}

impl Active {
    fn enter() -> Active {
        Active {
            alone: ACTIVE.fetch_add(1, Ordering::AcqRel) == 0,
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a flush keeps the kernel pool's other workers awake ([`set_kernel_spin`]).
static SPIN: AtomicBool = AtomicBool::new(true);

/// Flushes in the pool now (or about to enter it): the workers spin only for a flush
/// that is alone there.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Sets whether a flush keeps the kernel pool's other workers spinning, ready to take
/// their half of each parallel kernel, while it runs (on by default).
///
/// A rayon worker with nothing to do soon sleeps, and waking it costs tens of
/// microseconds (more under a hypervisor): about what a product of one sentence's rows
/// takes. Without the spin, the half a product hands to another worker is often taken
/// back and run by the thread that split it, and one request runs on one core.
/// all-MiniLM-L6-v2, one sentence a call, one stream, bf16x3 weights: p50 3.0 ms
/// without, 2.4 ms with (2-core Xeon with AMX, alternated runs). The cost: while a
/// flush runs, the other workers use their cores even between parallel kernels, as
/// ONNX Runtime's and OpenMP's spinning thread pools do. Only the first of the flushes
/// running at once gets the spinning workers; the others run as before.
pub fn set_kernel_spin(on: bool) {
    SPIN.store(on, Ordering::Relaxed);
}

/// Whether flushes keep the kernel workers spinning ([`set_kernel_spin`]).
pub fn kernel_spin() -> bool {
    SPIN.load(Ordering::Relaxed)
}

/// Runs `f` (on a kernel thread) while `spinners` other workers spin, taking any job
/// the pool has (the halves of `f`'s parallel kernels), until `f` returns or unwinds,
/// or until another flush comes to the pool (then they go back to rayon, and one of
/// them takes it: a spinner that ran the other flush inside itself would make this one
/// wait for it).
fn with_workers_awake<R: Send>(spinners: usize, f: impl FnOnce() -> R + Send) -> R {
    /// Sets `done` when `f` returns or unwinds, so the spinning workers stop.
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let done = AtomicBool::new(false);
    let (r, ()) = rayon::join(
        || {
            let _done = Done(&done);
            f()
        },
        || spin(spinners, &done),
    );
    r
}

/// Keeps `workers` workers (the one running this among them) taking the pool's jobs
/// until `done`. Spinners are handed out by joins, not spawns, so a flush allocates
/// nothing; a spinner no other worker took before `done` returns at once. After a look
/// that found nothing, a spinner waits 64 `spin_loop` hints before the next: looking
/// touches the working thread's deque, and polling without the pause made one
/// sentence's forward slower (p50 2.48 against 2.38 ms, binaries alternated 8 times,
/// bf16x3 on the 2-core Xeon; 256 hints measured between the two).
fn spin(workers: usize, done: &AtomicBool) {
    let one = || {
        while !done.load(Ordering::Acquire) && ACTIVE.load(Ordering::Acquire) == 1 {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
            }
        }
    };
    match workers {
        0 => {}
        1 => one(),
        n => {
            rayon::join(one, || spin(n - 1, done));
        }
    }
}
