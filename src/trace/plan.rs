//! What the timeline asks of a plan, and of a flush, when it writes them out.
//!
//! The recorder is a leaf of the crate: it must not know the execution plan's types,
//! because the modules that build and run plans record into it. So a recorded kernel
//! or flush holds its plan as a [`TracedPlan`], a reference-counted object that answers
//! the writer's few questions (its counts, what one kernel ran, its picture), and a
//! flush is recorded as plain [`FlushFacts`]. `fusion` implements [`TracedPlan`] for
//! its plan; nothing here runs while a trace records, only when it is written.

/// A plan, as the timeline's writer sees it.
pub(crate) trait TracedPlan: Send + Sync + std::fmt::Debug {
    /// The plan's counts.
    fn summary(&self) -> PlanSummary;
    /// What kernel `index` ran; `op` names the op of a single-op kernel.
    fn kernel(&self, index: usize, op: &'static str) -> KernelSummary;
    /// An SVG picture of the plan's arena over its levels, titled with segment `key`;
    /// `None` when the plan has no arena or cannot be drawn.
    fn picture(&self, key: u64) -> Option<String>;
}

/// A plan's counts, for the slice of its build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PlanSummary {
    /// Ops in the segment (Drops included).
    pub(crate) ops: usize,
    /// Ops not run because nothing reads what they make.
    pub(crate) dead_ops: usize,
    /// Kernels launched per run.
    pub(crate) kernels: usize,
    /// The arena's size in bytes (0: the plan has none, and no picture).
    pub(crate) arena_bytes: usize,
    /// The memory planner's lower bound for the arena, in bytes.
    pub(crate) arena_lower_bound: usize,
}

/// What one kernel of a plan ran, for its slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KernelSummary {
    /// The slice's name: the kind and the first few ops (`chain: matmul+add+gelu`).
    pub(crate) name: String,
    /// `op`, `fused` or `chain`.
    pub(crate) kind: &'static str,
    /// Every op the kernel ran, in order.
    pub(crate) ops: Vec<&'static str>,
    /// Bytes read (through each input's layout).
    pub(crate) bytes_read: usize,
    /// Bytes written.
    pub(crate) bytes_written: usize,
    /// The kernel's level in its plan (kernels of one level may run at once).
    pub(crate) level: Option<u32>,
}

/// What the timeline keeps of a flush: the stream's [`crate::FlushInfo`] as plain
/// numbers and words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FlushFacts {
    /// Why the flush ran, in words (`read of t12`).
    pub(crate) reason: String,
    /// The short name of the reason, for the slice's name (`read`, `drained`).
    pub(crate) reason_name: &'static str,
    /// The segment's key.
    pub(crate) key: u64,
    /// Whether the plan came from the cache.
    pub(crate) cache_hit: bool,
    /// Whether the segment ran a plan (false: op by op).
    pub(crate) planned: bool,
    /// Ops in the segment.
    pub(crate) ops: usize,
    /// Kernels run.
    pub(crate) kernels: usize,
    /// Arena bytes.
    pub(crate) arena_bytes: usize,
    /// The planner's lower bound for the arena, in bytes.
    pub(crate) arena_lower_bound: usize,
    /// The threads its kernels could use (the load cap included).
    pub(crate) kernel_threads: usize,
}
