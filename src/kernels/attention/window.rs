//! The key window of the attention kernel ([`Window`]: which keys each query sees, by
//! position) and what a block of queries makes of it: the keys it reads
//! ([`Job::block_keys`]), whether a key tile needs its lanes masked ([`Job::cut`]),
//! the mask itself ([`Job::mask_lanes`]) and the zeros of rows that see no key
//! ([`Job::zero_unseeing`]).

use super::{Block, Job, QB};

/// Which keys a query sees, by position: query `i` sees key `j` iff
/// `j + before >= i` (when `before` is set) and `j <= i + after` (when `after` is
/// set). The kernel's form of the public `KeyWindow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    /// How many keys before its own position a query sees at most (`None`: all).
    pub(crate) before: Option<usize>,
    /// How many keys after its own position a query sees at most (`None`: all).
    pub(crate) after: Option<usize>,
}

impl Window {
    /// Every key.
    pub(crate) const ALL: Window = Window {
        before: None,
        after: None,
    };

    /// The keys `lo..hi` (within `0..lk`) that query `i` sees; empty when `lo >= hi`.
    #[inline(always)]
    pub(crate) fn keys(&self, i: usize, lk: usize) -> (usize, usize) {
        let lo = self.before.map_or(0, |b| i.saturating_sub(b));
        let hi = self
            .after
            .map_or(lk, |a| i.saturating_add(a).saturating_add(1).min(lk));
        (lo, hi)
    }

    /// How many (query, key) pairs of `lq` queries and `lk` keys are visible.
    pub(crate) fn pairs(&self, lq: usize, lk: usize) -> usize {
        if *self == Window::ALL {
            return lq * lk;
        }
        (0..lq)
            .map(|i| {
                let (lo, hi) = self.keys(i, lk);
                hi.saturating_sub(lo)
            })
            .sum()
    }
}

impl Job<'_> {
    /// The keys `lo..hi` some query of the block sees (the first row's first key to
    /// the last row's last): the only keys the block reads. Empty when `lo >= hi`.
    #[inline(always)]
    pub(super) fn block_keys(&self, blk: Block) -> (usize, usize) {
        let (lo, _) = self.window.keys(blk.i0, self.lk);
        let (_, hi) = self.window.keys(blk.i0 + blk.len.max(1) - 1, self.lk);
        (lo, hi)
    }

    /// Whether the window hides some key of `j0..j0 + kn` from some row of the block,
    /// so that tile's scores need [`Job::mask_lanes`].
    #[inline(always)]
    pub(super) fn cut(&self, blk: Block, j0: usize, kn: usize) -> bool {
        let last = blk.i0 + blk.len.max(1) - 1;
        self.window.before.is_some_and(|b| j0 + b < last)
            || self.window.after.is_some_and(|a| j0 + kn - 1 > blk.i0 + a)
    }

    /// Sets the score of key `j` to `f32::MIN` in the lanes whose query does not see
    /// it: its weight is then `e^(MIN - max) = 0` once the row has seen a key, and any
    /// weight it had before that is scaled by `e^(MIN - max) = 0` when it does, as a
    /// `-1e9` bias would; no `-inf`, so never a NaN. (Lanes past the block's rows are
    /// masked too, harmlessly: they are not written.)
    #[inline(always)]
    pub(super) fn mask_lanes(&self, blk: Block, j: usize, lanes: &mut [f32; QB]) {
        for (t, x) in lanes.iter_mut().enumerate() {
            let (lo, hi) = self.window.keys(blk.i0 + t, self.lk);
            if j < lo || j >= hi {
                *x = f32::MIN;
            }
        }
    }

    /// `inv` with 0 for the block's rows that see no key, so that they are written as
    /// zeros (their sums are 0 or count masked keys only).
    #[inline(always)]
    pub(super) fn zero_unseeing(&self, blk: Block, inv: &mut [f32; QB]) {
        if self.window == Window::ALL {
            return;
        }
        for (t, x) in inv.iter_mut().enumerate().take(blk.len) {
            let (lo, hi) = self.window.keys(blk.i0 + t, self.lk);
            if lo >= hi {
                *x = 0.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(before: Option<usize>, after: Option<usize>) -> Window {
        Window { before, after }
    }

    /// The keys of a query and the visible pairs follow the definition: `j + before
    /// >= i` and `j <= i + after`, within `0..lk`.
    #[test]
    fn keys_and_pairs_follow_the_definition() {
        for window in [
            Window::ALL,
            w(None, Some(0)),
            w(Some(0), Some(0)),
            w(Some(1), Some(1)),
            w(Some(3), None),
            w(None, Some(2)),
            w(Some(usize::MAX), Some(usize::MAX)),
        ] {
            for (lq, lk) in [(4, 4), (7, 3), (3, 9), (0, 5), (5, 0)] {
                let mut pairs = 0;
                for i in 0..lq {
                    let (lo, hi) = window.keys(i, lk);
                    for j in 0..lk {
                        let sees = window.before.is_none_or(|b| j.saturating_add(b) >= i)
                            && window.after.is_none_or(|a| j <= i.saturating_add(a));
                        assert_eq!((lo..hi).contains(&j), sees, "{window:?} {i} {j}");
                        pairs += usize::from(sees);
                    }
                }
                assert_eq!(window.pairs(lq, lk), pairs, "{window:?} {lq} {lk}");
            }
        }
        assert_eq!(w(None, Some(0)).pairs(4, 4), 10);
        assert_eq!(w(Some(1), Some(1)).pairs(4, 4), 10);
    }
}
