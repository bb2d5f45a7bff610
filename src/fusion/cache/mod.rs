//! The plan cache: segment structure to a symbolic plan, and symbol values to the
//! concrete [`ExecutionPlan`]s made from it, shared by every stream.
//!
//! The key is the segment's stable hash ([`crate::ir::relative`]): its ops and the
//! equality pattern of its layout numbers, not their values, which are the segment's
//! *symbols*. The table holds two kinds of entries:
//!
//! - a **structure** (at hash = key): the segment's signature in codes (kind, relative
//!   ids, dtypes, [`SymLayout`]s) and its [`Template`], the symbolic memory plan;
//! - an **instance** (at hash = the key mixed with the symbol values): the plan for one
//!   set of values, beside the same signature (shared) and those values.
//!
//! A flush first looks for its instance: a **hit** (the same structure and values as a
//! flush before it) allocates nothing and writes nothing shared but the entry's clock
//! stamp. Failing that, it looks for its structure and **instantiates** it for its
//! values (`fusion::symbolic`: the builder's steps on the segment's own ops, the
//! arena's offsets evaluated from the stored order, no planning), storing the new
//! instance. Failing that too, it is a **miss**: a full build, which stores the
//! structure and its first instance. Either lookup is confirmed by comparing the
//! segment op by op with the signature at the segment's symbol values, so two segments
//! that collide in a hash can never share a plan. Plans are immutable and shared by
//! `Arc`; the table is behind a read-write lock taken once per flush (a read on a hit).
//!
//! The cache is bounded in bytes ([`set_plan_cache_limit`], 64 MiB by default): each
//! entry carries an estimate of the heap it takes and a stamp of the cache's clock
//! when it was last used (a relaxed store on a hit, only when the clock moved since);
//! storing a plan past the limit evicts the least recently used ones. A structure
//! counts its signature and symbolic plan once, whatever its instances; an instance
//! counts its own concrete plan and values. A structure is as recent as its most
//! recent instance, and evicting it evicts its instances.

use std::mem::size_of;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::{HashMap, HashTable};
use parking_lot::RwLock;

mod bytes;
mod signature;

use bytes::{heap, plan_bytes, vec_bytes};
use signature::SigOp;

use super::symbolic::{build_template, instantiate, Template};
use super::ExecutionPlan;
use crate::error::Error;
use crate::ir::relative::{RelativeOp, StableHasher};
use crate::ir::Op;

/// What an entry stores.
enum Stored {
    /// A segment structure: its symbolic plan, and the plan built first (for
    /// pictures and statistics; also the first instance's plan).
    Structure {
        template: Arc<Template>,
        first: Arc<ExecutionPlan>,
    },
    /// The plan of one set of symbol values.
    Instance {
        values: Box<[usize]>,
        plan: Arc<ExecutionPlan>,
    },
}

/// One stored structure or instance.
struct Entry {
    /// The table's hash: the key for a structure, the key mixed with the values for
    /// an instance.
    hash: u64,
    /// The segment key.
    key: u64,
    signature: Arc<Vec<SigOp>>,
    stored: Stored,
    /// Estimated heap bytes of what this entry alone holds (summed into
    /// [`Cache::entry_bytes`]).
    bytes: usize,
    /// The cache clock when it was last used: the least recently used go first.
    used: AtomicU64,
}

/// The stored plans and the bytes they take.
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

    /// Stores `entry` unless an equal one is there (another stream stored it
    /// meanwhile); returns the plan now stored for it, if it is an instance.
    fn store(&mut self, entry: Entry) {
        self.entry_bytes += entry.bytes;
        self.table.insert_unique(entry.hash, entry, |e| e.hash);
    }
}

static CACHE: RwLock<Cache> = RwLock::new(Cache::EMPTY);
static HITS: AtomicUsize = AtomicUsize::new(0);
static INSTANTIATED: AtomicUsize = AtomicUsize::new(0);
static MISSES: AtomicUsize = AtomicUsize::new(0);
static EVICTED: AtomicUsize = AtomicUsize::new(0);
/// Moves on by one at each plan stored; a hit stamps its entry with it. Entries used
/// since the same insertion tie, which is as fine as LRU needs here: only an insertion
/// evicts.
static CLOCK: AtomicU64 = AtomicU64::new(0);

/// The default of [`set_plan_cache_limit`]: 64 MiB.
pub const DEFAULT_PLAN_CACHE_LIMIT: usize = 64 << 20;
static LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_PLAN_CACHE_LIMIT);

/// How a flush found its plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Stored for the same structure and symbol values.
    Hit,
    /// Made from the stored structure for new symbol values, without planning.
    Instantiated,
    /// Built in full.
    Miss,
}

/// The hash of the instance of structure `key` at `symbols`.
fn instance_hash(key: u64, symbols: &[usize]) -> u64 {
    use std::hash::Hasher;
    let mut h = StableHasher::default();
    h.write_u64(key);
    for &s in symbols {
        h.write_usize(s);
    }
    h.finish() ^ 0x5bd1_e995
}

/// Whether `entry`'s signature is `segment`'s at `symbols`.
fn matches<T>(
    entry: &Entry,
    segment: &[T],
    symbols: &[usize],
    parts: &impl Fn(&T) -> (&Op, &RelativeOp),
) -> bool {
    entry.signature.len() == segment.len()
        && entry.signature.iter().zip(segment).all(|(s, t)| {
            let (op, rel) = parts(t);
            s.matches(op, rel, symbols)
        })
}

/// Stamps `e` as used now (a store only when the clock moved since).
fn touch(e: &Entry) {
    let now = CLOCK.load(Ordering::Relaxed);
    if e.used.load(Ordering::Relaxed) < now {
        e.used.store(now, Ordering::Relaxed);
    }
}

/// The plan of the segment `segment` (each element's op and relative form given by
/// `parts`) with key `key` and symbol values `symbols`: stored (a hit, which allocates
/// nothing and writes nothing shared but its entry's clock stamp), instantiated from
/// the stored structure, or built. Fails with the builder's [`Error::Internal`] when
/// the plan cannot be built (a bug; nothing is stored).
pub(crate) fn get_or_build<T>(
    key: u64,
    symbols: &[usize],
    segment: &[T],
    parts: impl Fn(&T) -> (&Op, &RelativeOp),
) -> Result<(Arc<ExecutionPlan>, Lookup), Error> {
    let hash = instance_hash(key, symbols);
    let is_instance = |e: &Entry| {
        e.hash == hash
            && e.key == key
            && matches!(&e.stored, Stored::Instance { values, .. } if **values == *symbols)
            && matches(e, segment, symbols, &parts)
    };
    let is_structure = |e: &Entry| {
        e.hash == key
            && matches!(e.stored, Stored::Structure { .. })
            && matches(e, segment, symbols, &parts)
    };
    let structure = {
        let cache = CACHE.read();
        if let Some(e) = cache.table.find(hash, is_instance) {
            touch(e);
            let Stored::Instance { plan, .. } = &e.stored else {
                unreachable!("is_instance checked the kind")
            };
            HITS.fetch_add(1, Ordering::Relaxed);
            return Ok((plan.clone(), Lookup::Hit));
        }
        cache
            .table
            .find(key, is_structure)
            .map(|e| match &e.stored {
                Stored::Structure { template, .. } => (template.clone(), e.signature.clone()),
                Stored::Instance { .. } => unreachable!("is_structure checked the kind"),
            })
    };
    let (ops, rels): (Vec<&Op>, Vec<&RelativeOp>) = segment.iter().map(&parts).unzip();
    let traced = crate::trace::enabled().then(crate::trace::now);
    let (plan, lookup, new_structure) = match structure {
        Some((template, signature)) => {
            let (plan, symbolic) = instantiate(&template, &ops, &rels, symbols)?;
            let lookup = if symbolic {
                Lookup::Instantiated
            } else {
                Lookup::Miss
            };
            (Arc::new(plan), lookup, Err(signature))
        }
        None => {
            let (plan, template) = build_template(&ops, &rels, symbols)?;
            let signature = ops
                .iter()
                .zip(&rels)
                .map(|(o, r)| SigOp::new(o, r, symbols))
                .collect::<Option<Vec<SigOp>>>()
                .ok_or_else(|| Error::Internal {
                    msg: "plan cache: a layout number of the segment is not one of its symbols"
                        .into(),
                })?;
            (Arc::new(plan), Lookup::Miss, Ok((template, signature)))
        }
    };
    match lookup {
        Lookup::Instantiated => INSTANTIATED.fetch_add(1, Ordering::Relaxed),
        _ => MISSES.fetch_add(1, Ordering::Relaxed),
    };
    if let (Some(start), Lookup::Miss) = (traced, lookup) {
        crate::trace::plan_built(start, key, plan.clone());
    }
    let evicted = {
        let mut cache = CACHE.write();
        let signature = match new_structure {
            Err(signature) => {
                // The symbolic plan may have kept another order: count it.
                if let Some(e) = cache.table.find_mut(key, is_structure) {
                    if let Stored::Structure { template, .. } = &e.stored {
                        let bytes = structure_bytes(&e.signature, template);
                        let old = std::mem::replace(&mut e.bytes, bytes);
                        cache.entry_bytes = cache.entry_bytes - old + bytes;
                    }
                }
                signature
            }
            Ok((template, signature)) => match cache.table.find(key, is_structure) {
                Some(e) => e.signature.clone(), // another stream stored it meanwhile
                None => {
                    let signature = Arc::new(signature);
                    let template = Arc::new(template);
                    let bytes = structure_bytes(&signature, &template);
                    cache.store(Entry {
                        hash: key,
                        key,
                        signature: signature.clone(),
                        stored: Stored::Structure {
                            template,
                            first: plan.clone(),
                        },
                        bytes,
                        used: AtomicU64::new(CLOCK.load(Ordering::Relaxed)),
                    });
                    signature
                }
            },
        };
        if let Some(e) = cache.table.find(hash, is_instance) {
            let Stored::Instance { plan, .. } = &e.stored else {
                unreachable!("is_instance checked the kind")
            };
            return Ok((plan.clone(), lookup)); // another stream made it meanwhile
        }
        let used = CLOCK.fetch_add(1, Ordering::Relaxed) + 1;
        let values: Box<[usize]> = symbols.into();
        let bytes = plan_bytes(&plan) + size_of::<Entry>() + heap::<usize>(values.len());
        cache.store(Entry {
            hash,
            key,
            signature,
            stored: Stored::Instance {
                values,
                plan: plan.clone(),
            },
            bytes,
            used: AtomicU64::new(used),
        });
        evict(&mut cache, LIMIT.load(Ordering::Relaxed))
    };
    drop(evicted); // freed outside the lock
    Ok((plan, lookup))
}

/// The plan first built for segment key `key`, if the cache holds its structure (the
/// first found, when segments that collide in the key are stored): for pictures of
/// plans.
pub(crate) fn find(key: u64) -> Option<Arc<ExecutionPlan>> {
    let cache = CACHE.read();
    cache
        .table
        .find(key, |e| e.key == key && e.hash == key)
        .and_then(|e| match &e.stored {
            Stored::Structure { first, .. } => Some(first.clone()),
            Stored::Instance { .. } => None,
        })
}

/// When the cache takes more than `limit` bytes, takes out the least recently used
/// entries until it takes at most seven eighths of it (so that the next few
/// insertions do not evict again), and returns them to be freed outside the lock. A
/// structure is as recent as its most recent instance; evicting it evicts its
/// instances.
fn evict(cache: &mut Cache, limit: usize) -> Vec<Entry> {
    if cache.bytes() <= limit {
        return Vec::new();
    }
    let target = limit - limit / 8;
    let mut latest: HashMap<u64, u64> = HashMap::new();
    for e in cache.table.iter() {
        let t = latest.entry(e.key).or_insert(0);
        *t = (*t).max(e.used.load(Ordering::Relaxed));
    }
    let age = |e: &Entry| match e.stored {
        Stored::Structure { .. } => latest.get(&e.key).copied().unwrap_or(0),
        Stored::Instance { .. } => e.used.load(Ordering::Relaxed),
    };
    // (age, bytes, entry, the key it takes with it when a structure)
    let mut by_age: Vec<(u64, usize, *const Entry, Option<u64>)> = cache
        .table
        .iter()
        .map(|e| {
            let structure = matches!(e.stored, Stored::Structure { .. }).then_some(e.key);
            (age(e), e.bytes, e as *const Entry, structure)
        })
        .collect();
    by_age.sort_unstable();
    let table_bytes = cache.table.allocation_size();
    let mut left = cache.entry_bytes;
    let mut victims: Vec<*const Entry> = Vec::new();
    let mut dead_keys: Vec<u64> = Vec::new();
    for &(_, bytes, e, structure) in &by_age {
        if left + table_bytes <= target {
            break;
        }
        left -= bytes;
        victims.push(e);
        dead_keys.extend(structure);
    }
    victims.sort_unstable();
    dead_keys.sort_unstable();
    let evicted: Vec<Entry> = cache
        .table
        .extract_if(|e| {
            victims.binary_search(&(e as *const Entry)).is_ok()
                || dead_keys.binary_search(&e.key).is_ok()
        })
        .collect();
    cache.entry_bytes = cache.table.iter().map(|e| e.bytes).sum();
    if cache.table.capacity() > 2 * cache.table.len() {
        cache.table.shrink_to_fit(|e| e.hash);
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

/// Estimated heap bytes of a structure entry: the signature (ops and their input
/// lists, once for all its instances), the symbolic plan, and the entry's own place in
/// the table. (The first plan it keeps is counted by the first instance, which shares
/// it.)
fn structure_bytes(signature: &Arc<Vec<SigOp>>, template: &Template) -> usize {
    let mut bytes = size_of::<Entry>()
        + heap::<(AtomicUsize, AtomicUsize, Vec<SigOp>)>(1)
        + heap::<(AtomicUsize, AtomicUsize, Template)>(1)
        + template.bytes()
        + vec_bytes(signature);
    for s in signature.iter() {
        bytes += vec_bytes(&s.inputs);
    }
    bytes
}

/// Counters of the plan cache.
///
/// Every planned flush counts in exactly one of `hits`, `instantiated` and `misses`
/// (they partition the flushes): a **hit** found a plan stored for the same segment
/// structure *and* the same symbol values (a repeat of an earlier flush's shapes); an
/// **instantiation** found the structure stored and made the plan for new symbol
/// values from it without planning (a new sequence length, say); a **miss** built the
/// plan in full (a structure never seen, or evicted, or one whose new values met
/// another arena structure than the stored one and were planned in full).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Flushes that found the plan of their structure and symbol values stored.
    pub hits: usize,
    /// Flushes that reused a stored structure's symbolic plan for new symbol values
    /// (no fusion decisions or memory planning of their own beyond re-running the
    /// builder's cheap steps and evaluating the stored memory order).
    pub instantiated: usize,
    /// Flushes that built their plan in full.
    pub misses: usize,
    /// Segment structures stored (symbolic plans).
    pub plans: usize,
    /// Instances stored: concrete plans, one per structure and symbol values.
    pub instances: usize,
    /// Kernels of the stored structures' first plans together.
    pub kernels: usize,
    /// Ops of the stored structures' segments together.
    pub ops: usize,
    /// Arena bytes of all stored instances together (each plan's arena is taken from
    /// the pool only while its segment runs).
    pub arena_bytes: usize,
    /// Entries (structures and instances) evicted so far to keep the cache within its
    /// limit ([`set_plan_cache_limit`]).
    pub evicted: usize,
    /// Estimated heap bytes the cache takes now: every structure's signature and
    /// symbolic plan (once, whatever its instances) and every instance's plan (values,
    /// kernels, programs, layouts, levels), counted by their vectors' capacities plus a
    /// 16-byte header per heap block, and the table itself. At most the limit.
    pub bytes: usize,
}

/// A snapshot of the cache counters.
pub(crate) fn stats() -> CacheStats {
    let mut stats = CacheStats {
        hits: HITS.load(Ordering::Relaxed),
        instantiated: INSTANTIATED.load(Ordering::Relaxed),
        misses: MISSES.load(Ordering::Relaxed),
        evicted: EVICTED.load(Ordering::Relaxed),
        ..CacheStats::default()
    };
    let cache = CACHE.read();
    for e in cache.table.iter() {
        match &e.stored {
            Stored::Structure { first, .. } => {
                stats.plans += 1;
                stats.kernels += first.kernel_count();
                stats.ops += first.ops;
            }
            Stored::Instance { plan, .. } => {
                stats.instances += 1;
                stats.arena_bytes += plan.arena_bytes();
            }
        }
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

/// Forgets every stored instance but keeps the structures, so that the next flush of
/// each structure is an instantiation (for benchmarks of instantiation against full
/// builds; counters are kept).
#[cfg(feature = "internals")]
pub fn forget_instances() {
    let mut cache = CACHE.write();
    let old: Vec<Entry> = cache
        .table
        .extract_if(|e| matches!(e.stored, Stored::Instance { .. }))
        .collect();
    cache.entry_bytes = cache.table.iter().map(|e| e.bytes).sum();
    drop(cache);
    drop(old);
}
