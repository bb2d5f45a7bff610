//! Dimension arguments: plain integers, negative ones counting from the end.
//!
//! Ops that take a dim are generic over [`Dim`], implemented for the integer types a
//! caller is likely to have at hand, so `t.sum(1)`, `t.sum(-1)` and `t.sum(d)` with
//! `d: usize` all work. The dim is checked against the tensor's rank when the op is
//! recorded.

use crate::error::{Error, Result};

/// An integer that names a dimension; negative values count from the end (`-1` is
/// the last dim).
pub trait Dim: Copy {
    /// The dim as a signed value, as the caller wrote it.
    fn as_i64(self) -> i64;

    /// The dim as an index in `0..rank`, or an error naming `op`.
    fn resolve(self, rank: usize, op: &'static str) -> Result<usize> {
        resolve_in(self.as_i64(), rank, rank, op)
    }

    /// The dim as an insertion point in `0..=rank` (for `unsqueeze`), or an error.
    fn resolve_insert(self, rank: usize, op: &'static str) -> Result<usize> {
        resolve_in(self.as_i64(), rank + 1, rank, op)
    }
}

fn resolve_in(d: i64, bound: usize, rank: usize, op: &'static str) -> Result<usize> {
    let b = bound as i64;
    let i = if d < 0 { d + b } else { d };
    if (0..b).contains(&i) {
        Ok(i as usize)
    } else {
        Err(Error::Dim { op, dim: d, rank })
    }
}

macro_rules! dim_impl {
    ($($t:ty),*) => {$(
        impl Dim for $t {
            fn as_i64(self) -> i64 {
                i64::try_from(self).unwrap_or(i64::MAX)
            }
        }
    )*};
}

dim_impl!(usize, u32, u64, i32, i64, isize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_dims_count_from_the_end() {
        assert_eq!((-1).resolve(3, "x").unwrap(), 2);
        assert_eq!(0usize.resolve(3, "x").unwrap(), 0);
        assert!(3.resolve(3, "x").is_err());
        assert!((-4).resolve(3, "x").is_err());
        assert_eq!((-1).resolve_insert(3, "x").unwrap(), 3);
        assert_eq!(3.resolve_insert(3, "x").unwrap(), 3);
        let msg = 5.resolve(2, "sum").unwrap_err().to_string();
        assert!(msg.contains("sum") && msg.contains('5'), "{msg}");
    }
}
