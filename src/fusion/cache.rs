//! The plan cache: segment key to [`ExecutionPlan`], shared by every stream.
//!
//! The key is the segment's stable hash ([`crate::ir::relative`]). A hit is confirmed
//! by comparing the segment op by op (kind, relative ids, dtypes, layouts) with the
//! signature stored beside the plan, so two segments that collide in the hash can never
//! share a plan. Plans are immutable and shared by `Arc`; the map is behind a
//! read-write lock taken once per flush (a read on a hit).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use super::{build, ExecutionPlan};
use crate::ir::relative::RelativeOp;
use crate::ir::{DType, Layout, Op, OpKind};

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

struct Entry {
    signature: Vec<SigOp>,
    plan: Arc<ExecutionPlan>,
}

static CACHE: RwLock<Option<HashMap<u64, Vec<Entry>>>> = RwLock::new(None);
static HITS: AtomicUsize = AtomicUsize::new(0);
static MISSES: AtomicUsize = AtomicUsize::new(0);

fn find<T>(
    entries: &[Entry],
    segment: &[T],
    parts: &impl Fn(&T) -> (&Op, &RelativeOp),
) -> Option<Arc<ExecutionPlan>> {
    entries
        .iter()
        .find(|e| {
            e.signature.len() == segment.len()
                && e.signature.iter().zip(segment).all(|(s, t)| {
                    let (op, rel) = parts(t);
                    s.matches(op, rel)
                })
        })
        .map(|e| e.plan.clone())
}

/// The plan of the segment `segment` (each element's op and relative form given by
/// `parts`) with key `key`, built on a miss. Returns the plan and whether it was a hit;
/// a hit allocates nothing.
pub fn get_or_build<T>(
    key: u64,
    segment: &[T],
    parts: impl Fn(&T) -> (&Op, &RelativeOp),
) -> (Arc<ExecutionPlan>, bool) {
    if let Some(plan) = CACHE
        .read()
        .as_ref()
        .and_then(|m| m.get(&key))
        .and_then(|entries| find(entries, segment, &parts))
    {
        HITS.fetch_add(1, Ordering::Relaxed);
        return (plan, true);
    }
    MISSES.fetch_add(1, Ordering::Relaxed);
    let (ops, rels): (Vec<&Op>, Vec<&RelativeOp>) = segment.iter().map(&parts).unzip();
    let plan = Arc::new(build(&ops, &rels));
    let signature = ops
        .iter()
        .zip(&rels)
        .map(|(o, r)| SigOp::new(o, r))
        .collect();
    let mut map = CACHE.write();
    let entries = map.get_or_insert_with(HashMap::new).entry(key).or_default();
    if let Some(existing) = find(entries, segment, &parts) {
        return (existing, false); // another stream built it meanwhile
    }
    entries.push(Entry {
        signature,
        plan: plan.clone(),
    });
    (plan, false)
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
}

/// A snapshot of the cache counters.
pub fn stats() -> CacheStats {
    let mut stats = CacheStats {
        hits: HITS.load(Ordering::Relaxed),
        misses: MISSES.load(Ordering::Relaxed),
        ..CacheStats::default()
    };
    if let Some(m) = CACHE.read().as_ref() {
        for e in m.values().flatten() {
            stats.plans += 1;
            stats.kernels += e.plan.kernel_count();
            stats.ops += e.plan.ops;
            stats.arena_bytes += e.plan.arena_bytes();
        }
    }
    stats
}

/// Forgets every stored plan (counters are kept).
pub fn clear() {
    *CACHE.write() = None;
}
