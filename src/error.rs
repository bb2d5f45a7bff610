//! The error type of every fallible streamfuse call.
//!
//! Errors are found in two places. Most are found when an op is recorded: shapes that do
//! not broadcast, a dim out of range, a dtype an op does not take. Those come back from
//! the op itself, and the op records nothing. A few can only be found while a kernel
//! runs (an index out of range in an index tensor that was still being computed); those
//! come back from the next `to_vec` of an affected tensor or the next
//! [`sync`](crate::sync) of the stream. Either way the message names the op and the
//! values involved, so that the user can act on it.

use std::fmt;

/// What went wrong, with a message that names the op and the values involved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// Shapes that the op cannot take (broadcasting, matmul inner dims, element counts).
    Shape {
        /// The op that was called.
        op: &'static str,
        /// What was wrong with the shapes.
        msg: String,
    },
    /// A dtype that the op cannot take, or two operands of different dtypes.
    DType {
        /// The op that was called.
        op: &'static str,
        /// What was wrong with the dtypes.
        msg: String,
    },
    /// A dimension index outside the tensor's rank.
    Dim {
        /// The op that was called.
        op: &'static str,
        /// The dim as the caller gave it (negative dims count from the end).
        dim: i64,
        /// The rank of the tensor.
        rank: usize,
    },
    /// An argument value the op cannot take (a range out of bounds, an index out of range,
    /// a permutation that is not one).
    Arg {
        /// The op that was called.
        op: &'static str,
        /// What was wrong.
        msg: String,
    },
    /// A kernel failed while running (found at run time, reported at the next read or sync).
    Kernel {
        /// The op whose kernel failed.
        op: &'static str,
        /// The kernel's message.
        msg: String,
    },
    /// Memory for a result could not be allocated (the system refused the request: the
    /// tensor is too large for this machine). Reported like a kernel error, at the next
    /// read or sync; the stream stays usable.
    OutOfMemory {
        /// The op whose memory could not be allocated.
        op: &'static str,
        /// How many bytes were requested.
        bytes: usize,
    },
    /// A bug in streamfuse: one of its own invariants did not hold (for example the
    /// plan builder met a segment it cannot have made). Reported like a kernel error,
    /// at the next read or sync, for the values the failed work would have made; the
    /// stream stays usable. Please report it with the message.
    Internal {
        /// What broke, naming the step that found it.
        msg: String,
    },
}

impl Error {
    /// The name of the op that failed ("segment" for an [`Error::Internal`]: the
    /// segment whose work failed).
    pub fn op(&self) -> &'static str {
        match self {
            Error::Shape { op, .. }
            | Error::DType { op, .. }
            | Error::Dim { op, .. }
            | Error::Arg { op, .. }
            | Error::Kernel { op, .. }
            | Error::OutOfMemory { op, .. } => op,
            Error::Internal { .. } => "segment",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Shape { op, msg } => write!(f, "{op}: {msg}"),
            Error::DType { op, msg } => write!(f, "{op}: {msg}"),
            Error::Dim { op, dim, rank } => write!(
                f,
                "{op}: dim {dim} is out of range for a tensor of rank {rank} \
                 (valid dims are {} to {})",
                -(*rank as i64),
                *rank as i64 - 1
            ),
            Error::Arg { op, msg } => write!(f, "{op}: {msg}"),
            Error::Kernel { op, msg } => write!(f, "{op} failed while running: {msg}"),
            Error::OutOfMemory { op, bytes } => write!(
                f,
                "{op}: out of memory: could not allocate {bytes} bytes ({}) for its result",
                human_bytes(*bytes)
            ),
            Error::Internal { msg } => write!(
                f,
                "internal error (a bug in streamfuse, please report it): {msg}"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// `bytes` in the largest binary unit that keeps it at 1 or more, with one decimal
/// ("4.0 TiB").
fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The result of every fallible streamfuse call.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_names_the_op_and_the_bytes() {
        let e = Error::OutOfMemory {
            op: "fill",
            bytes: 1 << 42,
        };
        assert_eq!(e.op(), "fill");
        assert_eq!(
            e.to_string(),
            "fill: out of memory: could not allocate 4398046511104 bytes (4.0 TiB) for its result"
        );
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    #[test]
    fn internal_errors_say_they_are_a_bug_and_what_broke() {
        let e = Error::Internal {
            msg: "plan builder, chains: no product".into(),
        };
        assert_eq!(e.op(), "segment");
        assert_eq!(
            e.to_string(),
            "internal error (a bug in streamfuse, please report it): \
             plan builder, chains: no product"
        );
    }
}
