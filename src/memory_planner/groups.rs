//! From kernel steps to group steps.
//!
//! The engine runs the kernels of a segment in *groups*: all kernels of a group
//! may run at once, and the groups run one after the other. A buffer whose
//! lifetime is measured in kernels (`[first kernel that writes it, last kernel
//! that reads it + 1)`) could share bytes with a buffer of a kernel that runs at
//! the same time, if the planner saw kernel steps. [`lifetimes`] converts each
//! lifetime to group steps: a buffer lives from the earliest group of any kernel
//! in its range to the latest one, inclusive. Two buffers used by kernels of one
//! group then always overlap in time, so concurrent kernels never share bytes
//! (the rule of AITemplate's multi-stream memory planner).
//!
//! ```
//! use streamfuse::memory_planner::{groups, Buffer};
//! // Kernels 0 and 1 run at once (group 0), kernel 2 after them (group 1).
//! let group_of = [0, 0, 1];
//! let a = Buffer::new(0, 0, 1, 64); // used only by kernel 0
//! let b = Buffer::new(1, 1, 3, 64); // written by kernel 1, read by kernel 2
//! let g = groups::lifetimes(&[a, b], &group_of).unwrap();
//! assert_eq!((g[0].lower, g[0].upper), (0, 1));
//! assert_eq!((g[1].lower, g[1].upper), (0, 2)); // meets `a` in group 0
//! ```

use super::error::PlanError;
use super::problem::{Buffer, Problem};

/// Converts buffer lifetimes in kernel steps to lifetimes in group steps.
/// `group_of[k]` is the group of kernel `k`; groups need not be numbered in
/// kernel order. Errors name a buffer whose lifetime is empty or reaches past
/// the last kernel.
pub fn lifetimes(buffers: &[Buffer], group_of: &[usize]) -> Result<Vec<Buffer>, PlanError> {
    let monotone = group_of.windows(2).all(|w| w[0] <= w[1]);
    buffers
        .iter()
        .enumerate()
        .map(|(index, b)| {
            if b.upper <= b.lower {
                return Err(PlanError::EmptyLifetime {
                    index,
                    id: b.id,
                    lower: b.lower,
                    upper: b.upper,
                });
            }
            if b.upper > group_of.len() as u64 {
                return Err(PlanError::NoSuchKernel {
                    index,
                    id: b.id,
                    upper: b.upper,
                    kernels: group_of.len(),
                });
            }
            let range = &group_of[b.lower as usize..b.upper as usize];
            let (lo, hi) = if monotone {
                (range[0], range[range.len() - 1])
            } else {
                let lo = range.iter().copied().min().unwrap_or(0);
                let hi = range.iter().copied().max().unwrap_or(0);
                (lo, hi)
            };
            Ok(Buffer {
                lower: lo as u64,
                upper: hi as u64 + 1,
                ..*b
            })
        })
        .collect()
}

/// [`lifetimes`] applied to a whole problem (aliases, in-place pairs and capacity
/// are kept). In-place pairs stay valid only where the input's last group is the
/// output's first group; [`Problem::validate`] reports the others.
pub fn problem(problem: &Problem, group_of: &[usize]) -> Result<Problem, PlanError> {
    Ok(Problem {
        buffers: lifetimes(&problem.buffers, group_of)?,
        ..problem.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_kernels_never_share() {
        // Kernels 0,1 in group 0; 2,3 in group 1.
        let group_of = [0, 0, 1, 1];
        // x is read only by kernel 0; y is written by kernel 1: same group.
        let x = Buffer::new(0, 0, 1, 8);
        let y = Buffer::new(1, 1, 2, 8);
        let g = lifetimes(&[x, y], &group_of).unwrap();
        assert!(g[0].overlaps_in_time(&g[1]));
        // In kernel steps they did not overlap.
        assert!(!x.overlaps_in_time(&y));
    }

    #[test]
    fn unordered_groups_and_errors() {
        let g = lifetimes(&[Buffer::new(0, 0, 3, 8)], &[1, 0, 2]).unwrap();
        assert_eq!((g[0].lower, g[0].upper), (0, 3));
        let e = lifetimes(&[Buffer::new(5, 0, 4, 8)], &[0, 0, 1]).unwrap_err();
        assert!(e.to_string().contains("id 5"), "{e}");
    }
}
