//! Errors of the memory planner.
//!
//! Every way a planning request can fail is one variant of [`PlanError`]. Input
//! errors name the CSV line or the buffer (by its position in
//! [`Problem::buffers`](super::Problem::buffers) and by the caller's id) so a user
//! can find and fix it. Two variants are not about the input:
//! [`PlanError::CapacityExceeded`] says that no plan within the requested capacity
//! was found in the time limit (the CLI maps it to exit code 3), and
//! [`PlanError::InvalidPlan`] says that a plan failed validation, which is always a
//! bug in a strategy (or in a plan handed to [`validate`](super::validate)).

use std::fmt;

/// Why a planning request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// A row of a CSV input could not be read.
    Csv {
        /// 1-based line number in the input (the header is line 1).
        line: usize,
        /// What was wrong with it.
        message: String,
    },
    /// Reading or writing a file failed.
    Io {
        /// The file.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// A buffer's lifetime is empty or reversed (`upper <= lower`).
    EmptyLifetime {
        /// Position of the buffer in the problem.
        index: usize,
        /// The caller's id of the buffer.
        id: usize,
        /// Its first step.
        lower: u64,
        /// Its end step (exclusive).
        upper: u64,
    },
    /// A buffer that needs bytes of its own has size zero.
    ZeroSize {
        /// Position of the buffer in the problem.
        index: usize,
        /// The caller's id of the buffer.
        id: usize,
    },
    /// A buffer's alignment is zero.
    ZeroAlignment {
        /// Position of the buffer in the problem.
        index: usize,
        /// The caller's id of the buffer.
        id: usize,
    },
    /// An alias or in-place pair refers to a buffer position that does not exist.
    NoSuchBuffer {
        /// Which relation held the reference (`"alias"` or `"in-place pair"`).
        relation: &'static str,
        /// Position of the relation in its list.
        entry: usize,
        /// The missing buffer position.
        index: usize,
    },
    /// Aliases form a cycle (a view that is, through other views, its own source).
    AliasCycle {
        /// Position of one buffer on the cycle.
        index: usize,
        /// The caller's id of that buffer.
        id: usize,
    },
    /// An alias is not a valid view of its source (declared twice, out of bounds,
    /// misaligned).
    BadAlias {
        /// Position of the alias in [`Problem::aliases`](super::Problem::aliases).
        entry: usize,
        /// What is wrong.
        message: String,
    },
    /// An in-place pair cannot share bytes.
    BadInPlace {
        /// Position of the pair in [`Problem::in_place`](super::Problem::in_place).
        entry: usize,
        /// What is wrong.
        message: String,
    },
    /// A buffer's lifetime (in kernels) reaches past the kernel→group map given to
    /// [`groups::lifetimes`](super::groups::lifetimes).
    NoSuchKernel {
        /// Position of the buffer.
        index: usize,
        /// The caller's id of the buffer.
        id: usize,
        /// Its end (exclusive) in kernels.
        upper: u64,
        /// How many kernels the map has.
        kernels: usize,
    },
    /// A sum or product of sizes, offsets or steps does not fit in `u64`.
    Overflow {
        /// What was being computed, naming the buffer where one is known.
        context: String,
    },
    /// The strategy name is not one of the known ones.
    UnknownStrategy {
        /// The name given.
        name: String,
    },
    /// No plan within the capacity was found before the time limit.
    CapacityExceeded {
        /// The capacity asked for.
        capacity: u64,
        /// The smallest arena found (above the capacity).
        best_arena: u64,
        /// The lower bound of the problem.
        lower_bound: u64,
    },
    /// A symbolic problem was given values for another number of symbols than its
    /// sizes use.
    Symbols {
        /// Symbols the problem has.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A plan failed validation: two live buffers share a byte, an offset is
    /// misaligned, or the plan does not match the problem. From a strategy of this
    /// module this is always a bug.
    InvalidPlan {
        /// What the validator found.
        message: String,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Csv { line, message } => write!(f, "line {line}: {message}"),
            PlanError::Io { path, message } => write!(f, "{path}: {message}"),
            PlanError::EmptyLifetime {
                index,
                id,
                lower,
                upper,
            } => write!(
                f,
                "buffer {index} (id {id}): lifetime [{lower}, {upper}) is empty (upper must be greater than lower)"
            ),
            PlanError::ZeroSize { index, id } => {
                write!(f, "buffer {index} (id {id}): size is zero")
            }
            PlanError::ZeroAlignment { index, id } => {
                write!(f, "buffer {index} (id {id}): alignment is zero")
            }
            PlanError::NoSuchBuffer {
                relation,
                entry,
                index,
            } => write!(f, "{relation} {entry}: there is no buffer {index}"),
            PlanError::AliasCycle { index, id } => {
                write!(f, "buffer {index} (id {id}): aliases form a cycle through it")
            }
            PlanError::BadAlias { entry, message } => write!(f, "alias {entry}: {message}"),
            PlanError::BadInPlace { entry, message } => {
                write!(f, "in-place pair {entry}: {message}")
            }
            PlanError::NoSuchKernel {
                index,
                id,
                upper,
                kernels,
            } => write!(
                f,
                "buffer {index} (id {id}): lives until kernel {upper} but only {kernels} kernels have a group"
            ),
            PlanError::Overflow { context } => write!(f, "u64 overflow: {context}"),
            PlanError::UnknownStrategy { name } => write!(
                f,
                "unknown strategy {name:?}; valid strategies: {}",
                super::Strategy::NAMES.join(", ")
            ),
            PlanError::CapacityExceeded {
                capacity,
                best_arena,
                lower_bound,
            } => write!(
                f,
                "no plan within capacity {capacity} found in the time limit (best arena {best_arena}, lower bound {lower_bound})"
            ),
            PlanError::Symbols { expected, got } => write!(
                f,
                "the problem has {expected} symbols but {got} values were given"
            ),
            PlanError::InvalidPlan { message } => write!(f, "invalid plan: {message}"),
        }
    }
}

impl std::error::Error for PlanError {}
