//! The closer: an engine thread that runs work a thread cannot run itself.
//!
//! A thread that ends hands its stream's pending segment over instead of running it
//! in its thread-local destructor, where kernels must not run (see
//! [`crate::kernels::teardown`]). So does any flush asked for during teardown (a
//! user's thread-local destructor that reads a tensor). The closer runs such work on
//! its own thread, which never ends, and the dying thread waits for it: when
//! `join()` on that thread returns, its work is done and its buffers have come back.
//! A job that panics is caught here; the stream's executor has already turned a
//! panicking kernel into errors on the tensors it was making.
//!
//! The queue is a plain mutex and condition variable: unlike a channel, waiting on it
//! allocates nothing, so the closer's idle thread never shows up in a measurement.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// Jobs handed over, and the closer thread's wake-up.
struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

static CLOSER: OnceLock<Option<Arc<Queue>>> = OnceLock::new();

/// The closer's queue, starting the thread on first use (`None` if it could not be
/// started).
fn queue() -> Option<&'static Arc<Queue>> {
    CLOSER
        .get_or_init(|| {
            let queue = Arc::new(Queue {
                jobs: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
            });
            let q = queue.clone();
            let spawned = std::thread::Builder::new()
                .name("streamfuse-closer".into())
                .spawn(move || loop {
                    let job = {
                        let mut jobs = q.jobs.lock();
                        loop {
                            match jobs.pop_front() {
                                Some(job) => break job,
                                None => q.ready.wait(&mut jobs),
                            }
                        }
                    };
                    let _ = catch_unwind(AssertUnwindSafe(job));
                });
            match spawned {
                Ok(_) => Some(queue),
                Err(e) => {
                    log::error!("could not start the closer thread ({e}); work runs in place");
                    None
                }
            }
        })
        .as_ref()
}

/// Starts the closer thread if it is not running yet (called when a stream opens, so
/// that no thread is spawned from inside a thread-local destructor).
pub(crate) fn start() {
    if CLOSER.get().is_none() {
        // The first start waits for one job to run: the thread is up and its queue
        // has room before any work is measured.
        run_and_wait(|| ());
    }
}

/// A job's completion, signalled by the closer and waited for by the caller.
#[derive(Default)]
struct Done {
    done: Mutex<bool>,
    signal: Condvar,
}

/// Runs `job` on the closer thread and waits until it has finished (or panicked).
/// Without a closer (its thread could not be started) the job runs here, as the last
/// resort.
pub(crate) fn run_and_wait(job: impl FnOnce() + Send + 'static) {
    let Some(queue) = queue() else {
        job();
        return;
    };
    let done = Arc::new(Done::default());
    let signal = done.clone();
    /// Signals completion when dropped, so a job that panics still releases its caller.
    struct OnDrop(Arc<Done>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            *self.0.done.lock() = true;
            self.0.signal.notify_all();
        }
    }
    queue.jobs.lock().push_back(Box::new(move || {
        let _signal = OnDrop(signal);
        job();
    }));
    queue.ready.notify_one();
    let mut finished = done.done.lock();
    while !*finished {
        done.signal.wait(&mut finished);
    }
}
