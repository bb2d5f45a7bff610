//! One request in the batcher's queue, seen from both ends: [`Request`] collects its
//! sequences' vectors as workers hand them back and calls its caller once the last
//! one is in; [`Ticket`] is what the caller keeps, to withdraw the request
//! ([`Ticket::cancel`]) when nobody waits for its answer any more (a client that went
//! away, a deadline passed). A withdrawn request's queued sequences leave the queue at
//! once and are never run; its caller is never called.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::batcher::{Batcher, Done};
use super::{EmbedError, Embeddings};

/// One request: its vectors as they come back, and its caller.
pub(super) struct Request {
    state: Mutex<RequestState>,
    /// Set by [`Ticket::cancel`]: its sequences are skipped wherever they are found.
    cancelled: AtomicBool,
}

struct RequestState {
    vectors: Vec<Vec<f32>>,
    /// Sequences not back yet.
    left: usize,
    tokens: usize,
    error: Option<EmbedError>,
    done: Option<Done>,
}

impl Request {
    /// A request of `texts` sequences, `tokens` in all, answered through `done`.
    pub(super) fn new(texts: usize, tokens: usize, done: Done) -> Arc<Request> {
        Arc::new(Request {
            state: Mutex::new(RequestState {
                vectors: vec![Vec::new(); texts],
                left: texts,
                tokens,
                error: None,
                done: Some(done),
            }),
            cancelled: AtomicBool::new(false),
        })
    }

    /// Whether the caller withdrew the request.
    pub(super) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Marks the request withdrawn and drops its caller's callback unanswered.
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        let done = self.state.lock().done.take();
        drop(done);
    }

    /// Records sequence `index`'s result; the last one calls the caller (outside the
    /// lock, panics caught), unless the request was withdrawn.
    pub(super) fn finish(&self, index: usize, result: Result<Vec<f32>, EmbedError>) {
        let answer = {
            let mut st = self.state.lock();
            match result {
                Ok(v) => st.vectors[index] = v,
                Err(e) => {
                    st.error.get_or_insert(e);
                }
            }
            st.left -= 1;
            if st.left > 0 {
                return;
            }
            let done = st.done.take();
            let answer = match st.error.take() {
                Some(e) => Err(e),
                None => Ok(Embeddings {
                    vectors: std::mem::take(&mut st.vectors),
                    tokens: st.tokens,
                }),
            };
            done.map(|d| (d, answer))
        };
        if let Some((done, answer)) = answer {
            if catch_unwind(AssertUnwindSafe(|| done(answer))).is_err() {
                log::error!("an embedding request's callback panicked");
            }
        }
    }
}

/// A queued request, as its caller holds it: [`Ticket::cancel`] withdraws it.
/// Dropping a ticket does **not** cancel (a caller that only wants the answer drops
/// it at once); wrap it in a guard that cancels on drop to tie the request to a
/// future's life, as the server example does.
#[derive(Debug, Default)]
pub struct Ticket {
    /// Empty when the request was answered at once (no sequences).
    request: Weak<Request>,
    batcher: Weak<Batcher>,
}

impl Ticket {
    /// The ticket of `request` queued on `batcher`.
    pub(super) fn new(request: &Arc<Request>, batcher: &Arc<Batcher>) -> Ticket {
        Ticket {
            request: Arc::downgrade(request),
            batcher: Arc::downgrade(batcher),
        }
    }

    /// Withdraws the request: its sequences still queued leave the queue now and are
    /// never run (a batch already formed skips them too), and its callback is dropped
    /// without being called. Sequences already running finish, their results thrown
    /// away. Returns how many queued sequences were removed (0 when the request was
    /// answered or withdrawn already). Safe to call from any thread, any number of
    /// times.
    pub fn cancel(&self) -> usize {
        let Some(request) = self.request.upgrade() else {
            return 0;
        };
        if request.is_cancelled() {
            return 0;
        }
        request.cancel();
        self.batcher
            .upgrade()
            .map_or(0, |b| b.remove_request(&request))
    }
}
