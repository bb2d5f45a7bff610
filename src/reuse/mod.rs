//! Reuse of memory: free lists of cells, spare vectors, scratch, and the pool of free
//! storage, so that a repeated forward pass allocates nothing once it has run once.
//!
//! # The rule
//!
//! A *keeper* holds things their last user is done with, for the next user. It may
//! keep a thing only when nothing else can observe it, and only up to a bound:
//!
//! - an `Arc` cell only when it is provably unique ([`Arc::get_mut`] succeeds: no other
//!   strong or weak reference; [`cells::last_ref`] finds it, every `give` checks it
//!   again) and its owner has emptied it (it holds no slot, buffer, storage or error of
//!   its last use);
//! - a vector or deque only when it has been cleared (length 0: it holds no value and
//!   no borrow of its last user, only room; [`vecs::Spares::keep`] and
//!   [`retype::retype`] clear it) — except storage of plain numbers (buffer storage,
//!   arenas, spill tiles, the executor's index tables), whose stale numbers reach
//!   nothing and are written before they are read;
//! - every keeper is bounded, by count or by bytes, and a full keeper drops what it is
//!   given;
//! - a per-thread keeper is a thread-local: the thread's exit frees it, and a cell
//!   given during or after that is dropped. A per-stream keeper is freed when its
//!   stream closes. A process-wide keeper stays within its bound for the life of the
//!   process ([`crate::runtime::trim_pools`] empties the pool).
//!
//! # The parts
//!
//! - [`cells`]: free lists of `Arc` cells, per thread ([`cells::LocalCells`]) or for
//!   the process ([`cells::SharedCells`], lock-free), each at most
//!   [`cells::MAX_FREE`] cells; [`cells::last_ref`].
//! - [`vecs`]: [`vecs::Spares`], one bounded stack of emptied vectors or deques.
//! - [`retype`]: reuses an emptied vector's allocation for another element type of the
//!   same size and alignment (how the plan executor keeps vectors of borrows).
//! - [`ahead`]: vectors made ahead for every thread that may run kernels
//!   ([`ahead::MadeAhead`]) and each thread's own kept pair; the fused kernel's
//!   scratch is made of them.
//! - [`pool`]: size classes, and a pool of free storage by kind and class plus free
//!   arenas, under one byte limit, the oldest freed first.
//!
//! This module depends on nothing of the engine: it owns the types and the rule, and
//! each keeper is a static or a field of one of its types, declared next to what it
//! keeps (so the pool is generic over what it holds, and `runtime` decides its limit).
//!
//! # Every keeper
//!
//! | keeper | keeps | bound | freed |
//! | --- | --- | --- | --- |
//! | `tensor::FREE_HANDLES` ([`cells::LocalCells`]) | emptied tensor handles | 4096 per thread | at thread exit |
//! | `runtime::slot::FREE_SLOTS` ([`cells::LocalCells`]) | emptied, pending slots | 4096 per thread | at thread exit |
//! | `runtime::storage::FREE_BUFFERS` ([`cells::SharedCells`]) | buffer shells without storage | 4096 | never (bounded) |
//! | `runtime::memory::POOL` ([`pool::Pool`]) | free buffer storage by dtype and size class, free arenas | `pool_limit()` bytes | past the limit, oldest first; `trim_pools` |
//! | `stream::queue::TaskSpares`, one per stream ([`vecs::Spares`]) | emptied input, slot and relative-id vectors of executed tasks; emptied segment deques | 16384 vectors of each kind; 2 deques | when the stream closes |
//! | `Queue::scratch`, one per stream | the plan executor's `PlanScratch` (index tables; its vectors of borrows kept through [`retype::retype`]) | one, lent to one running flush (a concurrent flush makes its own) | when the stream closes, or after a run that panicked |
//! | `kernels::fused`: per-thread step lists and register tables ([`ahead::ThreadKept`]) | emptied vectors | 2 of each per thread (fixed arrays: keeping never allocates) | at thread exit |
//! | `kernels::fused`: per-thread spill tiles | one vector of plain floats, grown, never shrunk | one per thread | at thread exit |
//! | `kernels::fused`: spares made ahead of steps, registers and tiles ([`ahead::MadeAhead`]) | emptied vectors, made for the cores + 4 threads | twice that many of each | never (bounded) |
//!
//! Not keepers: the plan cache (`fusion::cache`) keeps results, not memory to reuse,
//! under its own byte limit; a live stream's queue deque and relative-form builders
//! are its working state.
//!
//! [`Arc::get_mut`]: std::sync::Arc::get_mut

pub(crate) mod ahead;
pub(crate) mod cells;
pub(crate) mod pool;
pub(crate) mod retype;
pub(crate) mod vecs;
