//! The memory observer: a record, per kernel run, of the arena bytes it touched.
//!
//! Off by default (one thread-local flag check per kernel). When a thread turns it on
//! with [`start`], every planned kernel that thread runs appends a [`KernelRecord`]:
//! which arena regions it read and wrote (by value), the bytes it touched, and the
//! arena bytes live at its level according to the plan. [`take`] returns the records.
//! Tests replay them to check, from what actually happened, that no kernel read a
//! region after another value was written over it.

use std::cell::{Cell, RefCell};

use crate::fusion::{ExecutionPlan, Home};

/// A region of the arena used by one value, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// The value (relative id of the root) that owns the bytes.
    pub value: u32,
    /// First byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Region {
    /// Whether two regions share a byte.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.offset < other.offset + other.len && other.offset < self.offset + self.len
    }
}

/// What one kernel run touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRecord {
    /// Index of the kernel in its plan.
    pub kernel: usize,
    /// Its level.
    pub level: u32,
    /// Bytes of every input and output (arena or not).
    pub bytes_touched: usize,
    /// Arena regions read.
    pub reads: Vec<Region>,
    /// Arena regions written.
    pub writes: Vec<Region>,
    /// Arena bytes live at this level according to the plan (bytes shared by an
    /// in-place pair count once).
    pub arena_live_bytes: usize,
    /// The plan's arena size in bytes.
    pub arena_bytes: usize,
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static RECORDS: RefCell<Vec<KernelRecord>> = const { RefCell::new(Vec::new()) };
}

/// Starts recording on the calling thread (and clears earlier records).
pub fn start() {
    ON.with(|o| o.set(true));
    RECORDS.with(|r| r.borrow_mut().clear());
}

/// Stops recording on the calling thread and returns what was recorded.
pub fn take() -> Vec<KernelRecord> {
    ON.with(|o| o.set(false));
    RECORDS.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// Whether the calling thread records.
pub(crate) fn enabled() -> bool {
    ON.try_with(|o| o.get()).unwrap_or(false)
}

/// Runs `f`, which runs kernels for a thread that records when `on`, on the calling
/// thread (a kernel thread): records on this thread while it runs and returns the
/// records with its result, for [`keep`] on the thread that asked. Records nothing
/// extra when `on` is false or when this is the asking thread itself.
pub(crate) fn follow<R>(on: bool, f: impl FnOnce() -> R) -> (R, Vec<KernelRecord>) {
    if !on || enabled() {
        return (f(), Vec::new());
    }
    start();
    let r = f();
    (r, take())
}

/// Adds records made for the calling thread on another thread (see [`follow`]).
pub(crate) fn keep(records: Vec<KernelRecord>) {
    if !records.is_empty() {
        let _ = RECORDS.try_with(|r| r.borrow_mut().extend(records));
    }
}

fn region(plan: &ExecutionPlan, root: u32) -> Option<Region> {
    let v = &plan.values[root as usize];
    match v.home {
        Home::Arena { offset } => Some(Region {
            value: root,
            offset: offset * 4,
            len: v.layout.numel() * 4,
        }),
        _ => None,
    }
}

/// Records kernel `k` of `plan`, which reads `ins` and writes `outs`.
pub(crate) fn record(
    plan: &ExecutionPlan,
    k: usize,
    ins: &[u32],
    outs: &[u32],
    root: impl Fn(u32) -> u32,
) {
    let level = plan.levels[k];
    let bytes = |v: &u32| {
        let val = &plan.values[*v as usize];
        val.layout.numel() * val.dtype.size_in_bytes()
    };
    let reads = ins.iter().filter_map(|&v| region(plan, root(v))).collect();
    let writes = outs.iter().filter_map(|&v| region(plan, v)).collect();
    // Live at this level: arena roots made at or before it and read at or after it.
    let mut born = vec![u32::MAX; plan.values.len()];
    let mut last = vec![0u32; plan.values.len()];
    for (kernel, &lvl) in plan.kernels.iter().zip(&plan.levels) {
        let (i, o) = kernel.io();
        for &v in o {
            born[v as usize] = born[v as usize].min(lvl);
            last[v as usize] = last[v as usize].max(lvl);
        }
        for &v in i {
            let r = root(v) as usize;
            last[r] = last[r].max(lvl);
        }
    }
    // Bytes, not values: an in-place pair shares its region, which counts once.
    let mut live: Vec<Region> = (0..plan.values.len())
        .filter(|&v| born[v] <= level && level <= last[v])
        .filter_map(|v| region(plan, v as u32))
        .collect();
    live.sort_by_key(|r| r.offset);
    let (mut arena_live_bytes, mut end) = (0, 0);
    for r in live {
        let from = r.offset.max(end);
        arena_live_bytes += (r.offset + r.len).saturating_sub(from);
        end = end.max(r.offset + r.len);
    }
    let rec = KernelRecord {
        kernel: k,
        level,
        bytes_touched: ins.iter().chain(outs).map(bytes).sum(),
        reads,
        writes,
        arena_live_bytes,
        arena_bytes: plan.arena_len * 4,
    };
    // During thread teardown the records may already be gone; then nothing is kept.
    let _ = RECORDS.try_with(|r| r.borrow_mut().push(rec));
}
