//! The plan cache: segment key to [`ExecutionPlan`], shared by every stream.
//!
//! The key is the segment's stable hash ([`crate::ir::relative`]), used as is as the
//! table's hash (it is hashed once, when the segment is recorded). A hit is confirmed
//! by comparing the segment op by op (kind, relative ids, dtypes, layouts) with the
//! signature stored beside the plan, so two segments that collide in the hash can never
//! share a plan. Plans are immutable and shared by `Arc`; the table is behind a
//! read-write lock taken once per flush (a read on a hit).
//!
//! The cache is bounded in bytes ([`set_plan_cache_limit`], 64 MiB by default): each
//! entry carries an estimate of the heap it takes and a stamp of the cache's clock
//! when it was last used (a relaxed store on a hit, only when the clock moved since);
//! storing a plan past the limit evicts the least recently used ones.

use std::mem::size_of;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;
use parking_lot::RwLock;

use super::{build, Chain, ExecutionPlan, Kernel};
use crate::error::Error;
use crate::ir::relative::RelativeOp;
use crate::ir::{DType, Layout, Op, OpKind};
use crate::kernels::FusedProgram;

/// One op of a stored segment, in relative form.
#[derive(Debug)]
struct SigOp {
    kind: OpKind,
    inputs: Vec<(u32, DType, Layout)>,
    output: Option<(u32, DType, Layout)>,
}

impl SigOp {
    fn new(op: &Op, rel: &RelativeOp) -> SigOp {
        SigOp {
            kind: op.kind.clone(),
            inputs: op
                .inputs
                .iter()
                .zip(&rel.inputs)
                .map(|(d, &r)| (r, d.dtype, d.layout))
                .collect(),
            output: op
                .output
                .as_ref()
                .zip(rel.output)
                .map(|(d, r)| (r, d.dtype, d.layout)),
        }
    }

    fn matches(&self, op: &Op, rel: &RelativeOp) -> bool {
        self.kind == op.kind
            && self.inputs.len() == op.inputs.len()
            && self
                .inputs
                .iter()
                .zip(op.inputs.iter().zip(&rel.inputs))
                .all(|(s, (d, &r))| s.0 == r && s.1 == d.dtype && s.2 == d.layout)
            && match (&self.output, &op.output, rel.output) {
                (None, None, None) => true,
                (Some(s), Some(d), Some(r)) => s.0 == r && s.1 == d.dtype && s.2 == d.layout,
                _ => false,
            }
    }
}

/// One stored plan with the segment it was made from.
struct Entry {
    /// The segment key (the table's hash).
    key: u64,
    signature: Vec<SigOp>,
    plan: Arc<ExecutionPlan>,
    /// Estimated heap bytes of the plan and the signature ([`entry_bytes`]).
    bytes: usize,
    /// The cache clock when the plan was last used: the least recently used go first.
    used: AtomicU64,
}

/// The stored plans, by segment key, and the bytes they take.
struct Cache {
    table: HashTable<Entry>,
    /// Sum of the entries' `bytes`.
    entry_bytes: usize,
}

impl Cache {
    const EMPTY: Cache = Cache {
        table: HashTable::new(),
        entry_bytes: 0,
    };

    /// Estimated heap bytes of the whole cache: the entries and the table itself.
    fn bytes(&self) -> usize {
        self.entry_bytes + self.table.allocation_size()
    }
}

static CACHE: RwLock<Cache> = RwLock::new(Cache::EMPTY);
static HITS: AtomicUsize = AtomicUsize::new(0);
static MISSES: AtomicUsize = AtomicUsize::new(0);
static EVICTED: AtomicUsize = AtomicUsize::new(0);
/// Moves on by one at each plan stored; a hit stamps its entry with it. Entries used
/// since the same insertion tie, which is as fine as LRU needs here: only an insertion
/// evicts.
static CLOCK: AtomicU64 = AtomicU64::new(0);

/// The default of [`set_plan_cache_limit`]: 64 MiB.
pub const DEFAULT_PLAN_CACHE_LIMIT: usize = 64 << 20;
static LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_PLAN_CACHE_LIMIT);

/// Whether `entry` was made from `segment`.
fn matches<T>(entry: &Entry, segment: &[T], parts: &impl Fn(&T) -> (&Op, &RelativeOp)) -> bool {
    entry.signature.len() == segment.len()
        && entry.signature.iter().zip(segment).all(|(s, t)| {
            let (op, rel) = parts(t);
            s.matches(op, rel)
        })
}

/// The plan of the segment `segment` (each element's op and relative form given by
/// `parts`) with key `key`, built on a miss. Returns the plan and whether it was a hit;
/// a hit allocates nothing and writes nothing shared but its entry's clock stamp (only
/// when a plan was stored since its last hit). Fails with the builder's
/// [`Error::Internal`] when the plan cannot be built (a bug; nothing is stored).
pub fn get_or_build<T>(
    key: u64,
    segment: &[T],
    parts: impl Fn(&T) -> (&Op, &RelativeOp),
) -> Result<(Arc<ExecutionPlan>, bool), Error> {
    {
        let cache = CACHE.read();
        if let Some(e) = cache
            .table
            .find(key, |e| e.key == key && matches(e, segment, &parts))
        {
            let now = CLOCK.load(Ordering::Relaxed);
            if e.used.load(Ordering::Relaxed) < now {
                e.used.store(now, Ordering::Relaxed);
            }
            HITS.fetch_add(1, Ordering::Relaxed);
            return Ok((e.plan.clone(), true));
        }
    }
    MISSES.fetch_add(1, Ordering::Relaxed);
    let (ops, rels): (Vec<&Op>, Vec<&RelativeOp>) = segment.iter().map(&parts).unzip();
    let traced = crate::trace::enabled().then(crate::trace::now);
    let plan = Arc::new(build(&ops, &rels)?);
    if let Some(start) = traced {
        crate::trace::plan_built(start, key, &plan);
    }
    let signature: Vec<SigOp> = ops
        .iter()
        .zip(&rels)
        .map(|(o, r)| SigOp::new(o, r))
        .collect();
    let bytes = entry_bytes(&plan, &signature);
    let evicted = {
        let mut cache = CACHE.write();
        if let Some(e) = cache
            .table
            .find(key, |e| e.key == key && matches(e, segment, &parts))
        {
            return Ok((e.plan.clone(), false)); // another stream built it meanwhile
        }
        let used = CLOCK.fetch_add(1, Ordering::Relaxed) + 1;
        cache.table.insert_unique(
            key,
            Entry {
                key,
                signature,
                plan: plan.clone(),
                bytes,
                used: AtomicU64::new(used),
            },
            |e| e.key,
        );
        cache.entry_bytes += bytes;
        evict(&mut cache, LIMIT.load(Ordering::Relaxed))
    };
    drop(evicted); // freed outside the lock
    Ok((plan, false))
}

/// A plan stored for segment key `key`, if the cache holds one (the first found, when
/// segments that collide in the key are stored): for pictures of plans.
pub(crate) fn find(key: u64) -> Option<Arc<ExecutionPlan>> {
    let cache = CACHE.read();
    cache
        .table
        .find(key, |e| e.key == key)
        .map(|e| e.plan.clone())
}

/// When the cache takes more than `limit` bytes, takes out the least recently used
/// plans until it takes at most seven eighths of it (so that the next few insertions
/// do not evict again), and returns them to be freed outside the lock.
fn evict(cache: &mut Cache, limit: usize) -> Vec<Entry> {
    if cache.bytes() <= limit {
        return Vec::new();
    }
    let target = limit - limit / 8;
    let mut by_age: Vec<(u64, usize, *const ExecutionPlan)> = cache
        .table
        .iter()
        .map(|e| {
            (
                e.used.load(Ordering::Relaxed),
                e.bytes,
                Arc::as_ptr(&e.plan),
            )
        })
        .collect();
    by_age.sort_unstable();
    let table_bytes = cache.table.allocation_size();
    let mut left = cache.entry_bytes;
    let mut victims: Vec<*const ExecutionPlan> = Vec::new();
    for &(_, bytes, plan) in &by_age {
        if left + table_bytes <= target {
            break;
        }
        left -= bytes;
        victims.push(plan);
    }
    victims.sort_unstable();
    let evicted: Vec<Entry> = cache
        .table
        .extract_if(|e| victims.binary_search(&Arc::as_ptr(&e.plan)).is_ok())
        .collect();
    cache.entry_bytes = left;
    if cache.table.capacity() > 2 * cache.table.len() {
        cache.table.shrink_to_fit(|e| e.key);
    }
    EVICTED.fetch_add(evicted.len(), Ordering::Relaxed);
    evicted
}

/// Sets the most bytes the plan cache may take (default
/// [`DEFAULT_PLAN_CACHE_LIMIT`], 64 MiB): past it the least recently used plans are
/// evicted (down to seven eighths of the limit) and built again when their segment
/// comes back. The bytes are an estimate of the heap the stored plans and their
/// segments' signatures take (see [`CacheStats::bytes`]). A limit of 0 keeps no plan.
pub fn set_plan_cache_limit(bytes: usize) {
    LIMIT.store(bytes, Ordering::Relaxed);
    let evicted = evict(&mut CACHE.write(), bytes);
    drop(evicted);
}

/// The most bytes the plan cache may take (see [`set_plan_cache_limit`]).
pub fn plan_cache_limit() -> usize {
    LIMIT.load(Ordering::Relaxed)
}

/// Bytes of one heap block holding `n` values of `T`, with the allocator's header.
fn heap<T>(n: usize) -> usize {
    /// What a heap block costs beyond its contents (header and rounding, on glibc).
    const BLOCK_OVERHEAD: usize = 16;
    match n * size_of::<T>() {
        0 => 0,
        b => b + BLOCK_OVERHEAD,
    }
}

fn vec_bytes<T>(v: &Vec<T>) -> usize {
    heap::<T>(v.capacity())
}

fn program_bytes(p: &FusedProgram) -> usize {
    vec_bytes(&p.instrs) + vec_bytes(&p.outputs)
}

/// Estimated heap bytes of a stored entry: the plan (its `Arc`, values, kernels and
/// their lists, programs and layouts, levels), the signature (ops and their input
/// lists), and the entry's own place in the table.
fn entry_bytes(plan: &ExecutionPlan, signature: &Vec<SigOp>) -> usize {
    // Every field is named, so that a new one must be counted here too.
    let ExecutionPlan {
        values,
        kernels,
        levels,
        arena_len: _,
        arena_lower_bound: _,
        ops: _,
        dead_ops: _,
        work: _,
    } = plan;
    let mut bytes = size_of::<Entry>()
        + heap::<(AtomicUsize, AtomicUsize, ExecutionPlan)>(1)
        + vec_bytes(values)
        + vec_bytes(kernels)
        + vec_bytes(levels);
    for kernel in kernels {
        bytes += match kernel {
            Kernel::Op {
                op: _,
                inputs,
                output: _,
            } => vec_bytes(inputs),
            Kernel::Fused {
                program,
                inputs,
                input_ids,
                outputs,
                dims: _,
                in_place,
            } => {
                program_bytes(program)
                    + vec_bytes(inputs)
                    + vec_bytes(input_ids)
                    + vec_bytes(outputs)
                    + vec_bytes(in_place)
            }
            Kernel::Chain(chain) => {
                let Chain {
                    matmul: _,
                    program,
                    inputs,
                    norm,
                    input_ids,
                    outputs,
                    dims: _,
                } = &**chain;
                heap::<Chain>(1)
                    + program_bytes(program)
                    + vec_bytes(inputs)
                    + norm.as_ref().map_or(0, |n| vec_bytes(&n.params))
                    + vec_bytes(input_ids)
                    + vec_bytes(outputs)
            }
        };
    }
    bytes += vec_bytes(signature);
    for s in signature {
        bytes += vec_bytes(&s.inputs);
    }
    bytes
}

/// Counters of the plan cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Flushes that found their plan.
    pub hits: usize,
    /// Flushes that had to build one.
    pub misses: usize,
    /// Plans stored.
    pub plans: usize,
    /// Kernels of all stored plans together (the plans' size).
    pub kernels: usize,
    /// Ops of the segments of all stored plans together.
    pub ops: usize,
    /// Arena bytes of all stored plans together (each plan's arena is taken from the
    /// pool only while its segment runs).
    pub arena_bytes: usize,
    /// Plans evicted so far to keep the cache within its limit
    /// ([`set_plan_cache_limit`]).
    pub evicted: usize,
    /// Estimated heap bytes the cache takes now: every stored plan (values, kernels,
    /// programs, layouts, levels) and segment signature, counted by their vectors'
    /// capacities plus a 16-byte header per heap block, and the table itself. At most
    /// the limit.
    pub bytes: usize,
}

/// A snapshot of the cache counters.
pub fn stats() -> CacheStats {
    let mut stats = CacheStats {
        hits: HITS.load(Ordering::Relaxed),
        misses: MISSES.load(Ordering::Relaxed),
        evicted: EVICTED.load(Ordering::Relaxed),
        ..CacheStats::default()
    };
    let cache = CACHE.read();
    for e in cache.table.iter() {
        stats.plans += 1;
        stats.kernels += e.plan.kernel_count();
        stats.ops += e.plan.ops;
        stats.arena_bytes += e.plan.arena_bytes();
    }
    stats.bytes = cache.bytes();
    stats
}

/// Forgets every stored plan (counters are kept; forgotten plans do not count as
/// evicted).
pub fn clear() {
    let old = std::mem::replace(&mut *CACHE.write(), Cache::EMPTY);
    drop(old);
}
