//! The input of the planner: buffers, aliases, in-place pairs.
//!
//! A [`Problem`] is what a caller knows about the memory of one program segment:
//! each [`Buffer`] has a size, an alignment and a half-open lifetime
//! `[lower, upper)` in steps. Two buffers whose lifetimes intersect must not share
//! a byte; two that never live at the same step may.
//!
//! Two relations refine this:
//!
//! * An [`Alias`] says a buffer is a *view* of another: it has no bytes of its own,
//!   it lives at a fixed byte offset inside its source, and it keeps the source
//!   alive for as long as the view lives. Views of views are allowed; a cycle is an
//!   error.
//! * An [`InPlace`] pair says an operation may write its output over an input that
//!   dies at that very step (the element-wise `y = f(x)` where `x` is never read
//!   again). The planner then may (not must) give both the same offset, even
//!   though they are both live at that step.
//!
//! [`Problem::validate`] checks all of it and names the buffer, alias or pair that
//! is wrong. [`solve`](super::solve) validates before it plans, so callers need not.

use super::error::PlanError;
use super::instance::Instance;

/// One buffer to place: `size` bytes at an offset that is a multiple of
/// `alignment`, live over the steps `lower..upper`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buffer {
    /// The caller's id. The planner never interprets it; it only shows it in
    /// errors. Plans refer to buffers by position in [`Problem::buffers`].
    pub id: usize,
    /// First step at which the buffer is live.
    pub lower: u64,
    /// First step at which it is no longer live (exclusive end).
    pub upper: u64,
    /// Size in bytes. Zero is allowed only for views (see [`Alias`]).
    pub size: u64,
    /// Required alignment of its offset in bytes (1 for none). Any positive value
    /// is accepted; powers of two are the common case.
    pub alignment: u64,
}

impl Buffer {
    /// A buffer with alignment 1.
    pub fn new(id: usize, lower: u64, upper: u64, size: u64) -> Buffer {
        Buffer {
            id,
            lower,
            upper,
            size,
            alignment: 1,
        }
    }

    /// True when the lifetimes of `self` and `other` share a step.
    pub fn overlaps_in_time(&self, other: &Buffer) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }
}

/// Buffer `view` lives inside buffer `source`, starting `offset` bytes into it.
///
/// Both are positions in [`Problem::buffers`]. The view gets no bytes of its own;
/// its offset in the plan is its source's offset plus `offset`, and the source is
/// kept alive for the whole life of the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Alias {
    /// Position of the view buffer.
    pub view: usize,
    /// Position of the buffer it views (which may itself be a view).
    pub source: usize,
    /// Byte offset of the view inside the source.
    pub offset: u64,
}

/// Buffer `output` may take the bytes of buffer `input`.
///
/// Both are positions in [`Problem::buffers`]. This is allowed when `input` dies at
/// the step at which `output` is born: `input.upper == output.lower + 1` (they
/// share exactly that step) or `input.upper == output.lower` (they never overlap,
/// and the pair changes nothing). Each buffer may be the input of at most one pair
/// and the output of at most one pair; views may not take part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InPlace {
    /// Position of the input that dies at the step.
    pub input: usize,
    /// Position of the output that is born at the step.
    pub output: usize,
}

/// Everything the planner needs to know about one arena.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Problem {
    /// The buffers; a plan gives one offset per buffer, in this order.
    pub buffers: Vec<Buffer>,
    /// Views: buffers that live inside other buffers.
    pub aliases: Vec<Alias>,
    /// Outputs that may be written over dying inputs.
    pub in_place: Vec<InPlace>,
    /// The largest arena the caller can afford, if any.
    /// [`Options::capacity`](super::Options::capacity), when set, takes precedence.
    pub capacity: Option<u64>,
}

impl Problem {
    /// A problem of plain buffers (no aliases, no in-place pairs, no capacity).
    pub fn new(buffers: Vec<Buffer>) -> Problem {
        Problem {
            buffers,
            ..Problem::default()
        }
    }

    /// Checks the problem: non-empty lifetimes, non-zero sizes and alignments,
    /// aliases that point at existing buffers, stay inside their source and form
    /// no cycle, in-place pairs whose input dies where the output is born, and
    /// sums that fit in `u64`. The error names the first offending buffer, alias
    /// or pair.
    pub fn validate(&self) -> Result<(), PlanError> {
        Instance::new(self).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_half_open() {
        let a = Buffer::new(0, 0, 2, 8);
        let b = Buffer::new(1, 2, 4, 8);
        let c = Buffer::new(2, 1, 3, 8);
        assert!(!a.overlaps_in_time(&b));
        assert!(a.overlaps_in_time(&c));
        assert!(c.overlaps_in_time(&b));
    }

    #[test]
    fn errors_name_the_buffer() {
        let p = Problem::new(vec![Buffer::new(7, 0, 2, 8), Buffer::new(9, 3, 3, 8)]);
        let e = p.validate().unwrap_err();
        assert!(e.to_string().contains("buffer 1 (id 9)"), "{e}");
        let p = Problem::new(vec![Buffer::new(4, 0, 2, 0)]);
        assert_eq!(
            p.validate().unwrap_err(),
            PlanError::ZeroSize { index: 0, id: 4 }
        );
        let mut b = Buffer::new(5, 0, 2, 8);
        b.alignment = 0;
        assert_eq!(
            Problem::new(vec![b]).validate().unwrap_err(),
            PlanError::ZeroAlignment { index: 0, id: 5 }
        );
    }

    #[test]
    fn alias_cycles_and_bounds_are_errors() {
        let mut p = Problem::new(vec![
            Buffer::new(0, 0, 2, 8),
            Buffer::new(1, 0, 2, 8),
            Buffer::new(2, 0, 2, 8),
        ]);
        p.aliases = vec![
            Alias {
                view: 0,
                source: 1,
                offset: 0,
            },
            Alias {
                view: 1,
                source: 0,
                offset: 0,
            },
        ];
        assert!(matches!(p.validate(), Err(PlanError::AliasCycle { .. })));
        p.aliases = vec![Alias {
            view: 0,
            source: 2,
            offset: 4,
        }];
        assert!(matches!(
            p.validate(),
            Err(PlanError::BadAlias { entry: 0, .. })
        ));
        p.aliases = vec![Alias {
            view: 0,
            source: 5,
            offset: 0,
        }];
        assert!(matches!(
            p.validate(),
            Err(PlanError::NoSuchBuffer { index: 5, .. })
        ));
        p.aliases = vec![Alias {
            view: 0,
            source: 2,
            offset: 0,
        }];
        assert!(p.validate().is_ok());
    }

    #[test]
    fn overflow_is_an_error() {
        let p = Problem::new(vec![
            Buffer::new(0, 0, 2, u64::MAX / 2),
            Buffer::new(1, 0, 2, u64::MAX / 2 + 10),
        ]);
        assert!(matches!(p.validate(), Err(PlanError::Overflow { .. })));
    }

    #[test]
    fn in_place_needs_the_input_to_die_where_the_output_is_born() {
        let mut p = Problem::new(vec![Buffer::new(0, 0, 3, 8), Buffer::new(1, 2, 5, 8)]);
        p.in_place = vec![InPlace {
            input: 0,
            output: 1,
        }];
        assert!(p.validate().is_ok());
        p.buffers[1].lower = 1;
        assert!(matches!(
            p.validate(),
            Err(PlanError::BadInPlace { entry: 0, .. })
        ));
    }
}
