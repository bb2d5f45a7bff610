//! The pool of free storage: storage by kind and size class, and free arenas, under
//! one byte limit; past it, the storage given back longest ago is freed first.
//!
//! A request for `n` elements is rounded up to its size class ([`size_class`]: powers
//! of two split in quarters, so at most 25% is wasted), and storage given back goes to
//! the list of its kind and class, so a repeated pass finds every buffer it needs.
//! Arenas are kept apart and taken by best fit. Every give-back gets a stamp from one
//! clock, and trimming frees the lowest stamps first (of either sort). The pool is
//! generic over what it keeps ([`Pooled`]), so that it depends on nothing of the
//! engine: the runtime keeps its buffer storage and f32 arenas in one, and decides
//! the limit (`runtime::pool_limit`), which it passes to each give-back.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use parking_lot::Mutex;

/// The size class of a request for `len` elements: `len` rounded up to a power of two
/// or to one of the three quarter steps below the next one.
pub(crate) fn size_class(len: usize) -> usize {
    if len <= 16 {
        return len.max(1);
    }
    let high = usize::BITS - 1 - (len - 1).leading_zeros(); // floor(log2(len - 1))
    let base = 1usize << high;
    let step = base / 4;
    len.div_ceil(step) * step
}

/// Storage that a [`Pool`] keeps by kind and size class.
pub(crate) trait Pooled {
    /// What a request must match besides the length (for buffers, the element type).
    type Kind: Copy + Eq + Hash;
    /// Its kind.
    fn kind(&self) -> Self::Kind;
    /// The elements it holds room for.
    fn elements(&self) -> usize;
    /// The bytes it holds.
    fn bytes(&self) -> usize;
}

/// Free storage `S` by kind and size class, and free arenas of `T`, under one lock.
pub(crate) struct Pool<S: Pooled, T> {
    inner: Mutex<Inner<S, T>>,
}

/// Free storage by kind and size class, oldest first, each with its stamp.
type Classes<S> = HashMap<(<S as Pooled>::Kind, usize), VecDeque<(u64, S)>>;

struct Inner<S: Pooled, T> {
    /// Free storage (`None` until the first give-back: a map cannot be made in a
    /// constant).
    classes: Option<Classes<S>>,
    /// Free arenas (any order), each with its stamp.
    arenas: Vec<(u64, Vec<T>)>,
    /// Bytes in `classes`.
    class_bytes: usize,
    /// Bytes in `arenas`.
    arena_bytes: usize,
    /// Give-backs so far: the stamp of the next one.
    clock: u64,
}

/// The bytes of an arena.
fn arena_bytes<T>(arena: &[T]) -> usize {
    std::mem::size_of_val(arena)
}

impl<S: Pooled, T> Inner<S, T> {
    fn bytes(&self) -> usize {
        self.class_bytes + self.arena_bytes
    }

    fn stamp(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Takes out the storage or the arena given back longest ago (to be freed outside
    /// the lock); `(None, None)` when the pool is empty.
    fn pop_oldest(&mut self) -> (Option<S>, Option<Vec<T>>) {
        let oldest_class = self.classes.as_ref().and_then(|classes| {
            classes
                .iter()
                .filter_map(|(&class, q)| q.front().map(|(stamp, _)| (*stamp, class)))
                .min_by_key(|(stamp, _)| *stamp)
        });
        let oldest_arena = self
            .arenas
            .iter()
            .enumerate()
            .min_by_key(|(_, (stamp, _))| *stamp)
            .map(|(i, (stamp, _))| (*stamp, i));
        match (oldest_class, oldest_arena) {
            (Some((b, class)), arena) if arena.is_none_or(|(a, _)| b < a) => {
                (self.pop_class_front(class), None)
            }
            (_, Some((_, i))) => {
                let (_, arena) = self.arenas.swap_remove(i);
                self.arena_bytes -= arena_bytes(&arena);
                (None, Some(arena))
            }
            _ => (None, None),
        }
    }

    /// The oldest storage of `class` (whose list is dropped when it empties).
    fn pop_class_front(&mut self, class: (S::Kind, usize)) -> Option<S> {
        let classes = self.classes.as_mut()?;
        let queue = classes.get_mut(&class)?;
        let (_, storage) = queue.pop_front()?;
        if queue.is_empty() {
            classes.remove(&class);
        }
        self.class_bytes -= storage.bytes();
        Some(storage)
    }
}

impl<S: Pooled, T> Pool<S, T> {
    /// An empty pool.
    pub(crate) const fn new() -> Pool<S, T> {
        Pool {
            inner: Mutex::new(Inner {
                classes: None,
                arenas: Vec::new(),
                class_bytes: 0,
                arena_bytes: 0,
                clock: 0,
            }),
        }
    }

    /// Bytes of free storage kept (arenas not included).
    pub(crate) fn class_bytes(&self) -> usize {
        self.inner.lock().class_bytes
    }

    /// Bytes of free arenas kept.
    pub(crate) fn arena_bytes(&self) -> usize {
        self.inner.lock().arena_bytes
    }

    /// The storage of `kind` given back last with room for exactly `class` elements (a
    /// size class), if there is one.
    pub(crate) fn take(&self, kind: S::Kind, class: usize) -> Option<S> {
        let mut inner = self.inner.lock();
        let (_, storage) = inner
            .classes
            .as_mut()?
            .get_mut(&(kind, class))?
            .pop_back()?;
        inner.class_bytes -= storage.bytes();
        Some(storage)
    }

    /// Keeps `storage` for a later [`take`](Self::take) of its kind and class, then
    /// frees the oldest storage while the pool holds more than `limit` bytes. Storage
    /// whose length is not a size class, or larger than `limit` by itself, is dropped.
    pub(crate) fn give_back(&self, storage: S, limit: usize) {
        let len = storage.elements();
        if len == 0 || size_class(len) != len {
            return;
        }
        let bytes = storage.bytes();
        if bytes > limit {
            return;
        }
        let mut inner = self.inner.lock();
        let stamp = inner.stamp();
        inner.class_bytes += bytes;
        inner
            .classes
            .get_or_insert_with(HashMap::new)
            .entry((storage.kind(), len))
            .or_default()
            .push_back((stamp, storage));
        if inner.bytes() > limit {
            drop(inner);
            self.trim_to(limit);
        }
    }

    /// The smallest free arena of at least `len` elements (`Ok`), or else the largest
    /// smaller one, to be freed (`Err`): the arena it is about to be replaced by is
    /// larger and serves every segment it served, so shapes that keep growing keep one
    /// arena in the pool, not one per size.
    pub(crate) fn take_arena(&self, len: usize) -> Result<Vec<T>, Option<Vec<T>>> {
        let mut inner = self.inner.lock();
        let by_len = |(_, (_, a)): &(usize, &(u64, Vec<T>))| a.len();
        let arenas = inner.arenas.iter().enumerate();
        let (best, fits) = match arenas
            .clone()
            .filter(|p| by_len(p) >= len)
            .min_by_key(by_len)
        {
            Some((i, _)) => (i, true),
            None => match arenas.max_by_key(by_len) {
                Some((i, _)) => (i, false),
                None => return Err(None),
            },
        };
        let (_, arena) = inner.arenas.swap_remove(best);
        inner.arena_bytes -= arena_bytes(&arena);
        if fits {
            Ok(arena)
        } else {
            Err(Some(arena))
        }
    }

    /// Keeps `arena` for a later [`take_arena`](Self::take_arena), then frees the
    /// oldest storage while the pool holds more than `limit` bytes. An empty arena, or
    /// one larger than `limit` by itself, is dropped.
    pub(crate) fn give_back_arena(&self, arena: Vec<T>, limit: usize) {
        let bytes = arena_bytes(&arena);
        if bytes == 0 || bytes > limit {
            return;
        }
        let mut inner = self.inner.lock();
        let stamp = inner.stamp();
        inner.arena_bytes += bytes;
        inner.arenas.push((stamp, arena));
        if inner.bytes() > limit {
            drop(inner);
            self.trim_to(limit);
        }
    }

    /// Frees the oldest storage until the pool keeps at most `limit` bytes; each piece
    /// is freed outside the lock.
    pub(crate) fn trim_to(&self, limit: usize) {
        loop {
            let victim = {
                let mut inner = self.inner.lock();
                if inner.bytes() <= limit {
                    return;
                }
                inner.pop_oldest()
            };
            if let (None, None) = victim {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_waste_at_most_a_quarter() {
        for len in 1..5000 {
            let c = size_class(len);
            assert!(c >= len, "{len} -> {c}");
            assert!(len <= 16 || (c - len) * 4 <= len, "{len} -> {c}");
            assert_eq!(size_class(c), c, "classes are fixed points");
        }
    }

    /// Storage of one byte per element, of kind `0` or `1`.
    #[derive(Debug, PartialEq)]
    struct Bytes(u8, Vec<u8>);

    impl Pooled for Bytes {
        type Kind = u8;
        fn kind(&self) -> u8 {
            self.0
        }
        fn elements(&self) -> usize {
            self.1.len()
        }
        fn bytes(&self) -> usize {
            self.1.len()
        }
    }

    #[test]
    fn storage_is_taken_by_kind_and_class_and_only_class_lengths_are_kept() {
        let pool: Pool<Bytes, u8> = Pool::new();
        pool.give_back(Bytes(0, vec![0; 20]), 1000);
        pool.give_back(Bytes(0, vec![0; 17]), 1000); // not a class: dropped
        assert_eq!(pool.class_bytes(), 20);
        assert!(pool.take(1, 20).is_none(), "another kind");
        assert!(pool.take(0, 24).is_none(), "another class");
        assert_eq!(pool.take(0, 20), Some(Bytes(0, vec![0; 20])));
        assert_eq!(pool.class_bytes(), 0);
    }

    #[test]
    fn past_the_limit_the_oldest_goes_first() {
        let pool: Pool<Bytes, u8> = Pool::new();
        pool.give_back(Bytes(0, vec![0; 16]), 100);
        pool.give_back_arena(vec![0; 40], 100);
        pool.give_back(Bytes(1, vec![0; 16]), 100);
        assert_eq!((pool.class_bytes(), pool.arena_bytes()), (32, 40));
        pool.give_back(Bytes(0, vec![1; 32]), 100); // 104 bytes: the first goes
        assert!(pool.take(0, 16).is_none());
        assert_eq!((pool.class_bytes(), pool.arena_bytes()), (48, 40));
        pool.trim_to(50); // then the arena, the oldest left
        assert_eq!((pool.class_bytes(), pool.arena_bytes()), (48, 0));
        pool.give_back(Bytes(0, vec![0; 128]), 100); // larger than the limit
        assert_eq!(pool.class_bytes(), 48);
        pool.trim_to(0);
        assert_eq!((pool.class_bytes(), pool.arena_bytes()), (0, 0));
    }

    #[test]
    fn arenas_are_taken_by_best_fit_or_replace_the_largest_smaller_one() {
        let pool: Pool<Bytes, u8> = Pool::new();
        for len in [10, 30, 20] {
            pool.give_back_arena(vec![0; len], 1000);
        }
        assert_eq!(pool.take_arena(15).map(|a| a.len()), Ok(20));
        assert_eq!(
            pool.take_arena(40).map_err(|a| a.map(|a| a.len())),
            Err(Some(30))
        );
        assert_eq!(pool.arena_bytes(), 10);
        pool.take_arena(1).unwrap();
        assert_eq!(pool.take_arena(1), Err(None));
    }
}
