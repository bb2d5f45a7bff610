//! [`Dims`]: a short list of sizes or strides kept inline, without a heap allocation.
//!
//! Every tensor description carries its dims and strides, and recording an op copies
//! several of them. Keeping them inline (up to [`MAX_RANK`] entries) makes those copies
//! plain memory moves, which is most of what keeps recording an op cheap. The user API
//! checks ranks against [`MAX_RANK`] before building a `Dims`.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};

/// The largest rank a tensor may have.
pub const MAX_RANK: usize = 8;

/// Up to [`MAX_RANK`] `usize`s stored inline; derefs to a slice. Entries past `len`
/// are always zero; `Eq` and `Hash` read only the used entries.
#[derive(Clone, Copy, Default)]
pub struct Dims {
    len: u8,
    v: [usize; MAX_RANK],
}

impl Dims {
    /// An empty list (the dims of a scalar).
    pub const fn new() -> Dims {
        Dims {
            len: 0,
            v: [0; MAX_RANK],
        }
    }

    /// A list of `n` zeros. Panics if `n > MAX_RANK` (callers check ranks first).
    pub fn zeros(n: usize) -> Dims {
        assert!(n <= MAX_RANK, "rank {n} is above the maximum of {MAX_RANK}");
        Dims {
            len: n as u8,
            v: [0; MAX_RANK],
        }
    }

    /// A copy of `s`. Panics if `s` is longer than `MAX_RANK` (callers check ranks first).
    pub fn from_slice(s: &[usize]) -> Dims {
        let mut d = Dims::zeros(s.len());
        d.v[..s.len()].copy_from_slice(s);
        d
    }

    /// Appends `x`. Panics when full (callers check ranks first).
    pub fn push(&mut self, x: usize) {
        assert!((self.len as usize) < MAX_RANK, "rank above {MAX_RANK}");
        self.v[self.len as usize] = x;
        self.len += 1;
    }

    /// Inserts `x` at `i`, shifting later entries right.
    pub fn insert(&mut self, i: usize, x: usize) {
        let n = self.len as usize;
        assert!(n < MAX_RANK && i <= n, "insert at {i} into rank {n}");
        self.v.copy_within(i..n, i + 1);
        self.v[i] = x;
        self.len += 1;
    }

    /// Removes and returns the entry at `i`.
    pub fn remove(&mut self, i: usize) -> usize {
        let n = self.len as usize;
        assert!(i < n, "remove {i} from rank {n}");
        let x = self.v[i];
        self.v.copy_within(i + 1..n, i);
        self.v[n - 1] = 0;
        self.len -= 1;
        x
    }
}

// Compares only the used entries (the others are 0 anyway): a short memcmp.
impl PartialEq for Dims {
    fn eq(&self, other: &Dims) -> bool {
        **self == **other
    }
}

impl Eq for Dims {}

// Entries past `len` are always 0 (every method keeps them so), so hashing only the
// used ones agrees with the derived `Eq`.
impl Hash for Dims {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u8(self.len);
        for &x in self.iter() {
            state.write_usize(x);
        }
    }
}

impl Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.v[..self.len as usize]
    }
}

impl DerefMut for Dims {
    fn deref_mut(&mut self) -> &mut [usize] {
        &mut self.v[..self.len as usize]
    }
}

impl<'a> IntoIterator for &'a Dims {
    type Item = &'a usize;
    type IntoIter = std::slice::Iter<'a, usize>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl fmt::Debug for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl From<&[usize]> for Dims {
    fn from(s: &[usize]) -> Dims {
        Dims::from_slice(s)
    }
}

impl From<Vec<usize>> for Dims {
    fn from(s: Vec<usize>) -> Dims {
        Dims::from_slice(&s)
    }
}

impl<const N: usize> From<[usize; N]> for Dims {
    fn from(s: [usize; N]) -> Dims {
        Dims::from_slice(&s)
    }
}

impl FromIterator<usize> for Dims {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Dims {
        let mut d = Dims::new();
        for x in iter {
            d.push(x);
        }
        d
    }
}

impl PartialEq<Vec<usize>> for Dims {
    fn eq(&self, other: &Vec<usize>) -> bool {
        **self == **other
    }
}

impl PartialEq<[usize]> for Dims {
    fn eq(&self, other: &[usize]) -> bool {
        **self == *other
    }
}

impl<const N: usize> PartialEq<[usize; N]> for Dims {
    fn eq(&self, other: &[usize; N]) -> bool {
        **self == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_like_a_short_vec() {
        let mut d = Dims::from_slice(&[2, 3, 4]);
        d.insert(1, 7);
        assert_eq!(d, vec![2, 7, 3, 4]);
        assert_eq!(d.remove(0), 2);
        assert_eq!(d, [7, 3, 4]);
        // Removed entries are cleared, so equal lists hash and compare equal.
        assert_eq!(d, Dims::from_slice(&[7, 3, 4]));
        assert_eq!(format!("{d:?}"), "[7, 3, 4]");
        let e: Dims = (0..3).collect();
        assert_eq!(&e[..], &[0, 1, 2]);
    }
}
