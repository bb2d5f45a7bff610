//! The pool of free storage: buffer storage by size class and free arenas, under one
//! byte limit, the storage given back longest ago freed first.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;

use crate::ir::DType;
use crate::runtime::{pool_limit, Storage};

/// The size class of a request for `len` elements: `len` rounded up to a power of two
/// or to one of the three quarter steps below the next one.
pub fn size_class(len: usize) -> usize {
    if len <= 16 {
        return len.max(1);
    }
    let high = usize::BITS - 1 - (len - 1).leading_zeros(); // floor(log2(len - 1))
    let base = 1usize << high;
    let step = base / 4;
    len.div_ceil(step) * step
}

/// Free storage of both kinds, each with the stamp of its give-back.
pub(crate) struct Pool {
    inner: Mutex<PoolInner>,
}

/// Free buffer storage by dtype and size class, oldest first, each with its stamp.
type FreeLists = HashMap<(DType, usize), VecDeque<(u64, Storage)>>;

#[derive(Default)]
struct PoolInner {
    /// Free buffer storage.
    free: Option<FreeLists>,
    /// Free arenas (any order).
    arenas: Vec<(u64, Vec<f32>)>,
    /// Bytes in `free`.
    buffer_bytes: usize,
    /// Bytes in `arenas`.
    arena_bytes: usize,
    /// Give-backs so far: the stamp of the next one.
    clock: u64,
}

impl PoolInner {
    fn bytes(&self) -> usize {
        self.buffer_bytes + self.arena_bytes
    }

    fn stamp(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Takes out the storage given back longest ago (an arena as f32 storage).
    fn pop_oldest(&mut self) -> Option<Storage> {
        let oldest_buffer = self.free.as_ref().and_then(|free| {
            free.iter()
                .filter_map(|(&class, q)| q.front().map(|(stamp, _)| (*stamp, class)))
                .min_by_key(|(stamp, _)| *stamp)
        });
        let oldest_arena = self
            .arenas
            .iter()
            .enumerate()
            .min_by_key(|(_, (stamp, _))| *stamp)
            .map(|(i, (stamp, _))| (*stamp, i));
        match (oldest_buffer, oldest_arena) {
            (Some((b, class)), arena) if arena.is_none_or(|(a, _)| b < a) => {
                let free = self.free.as_mut()?;
                let queue = free.get_mut(&class)?;
                let (_, storage) = queue.pop_front()?;
                if queue.is_empty() {
                    free.remove(&class);
                }
                self.buffer_bytes -= storage.bytes();
                Some(storage)
            }
            (_, Some((_, i))) => {
                let (_, arena) = self.arenas.swap_remove(i);
                self.arena_bytes -= arena.len() * 4;
                Some(Storage::F32(arena))
            }
            _ => None,
        }
    }
}

impl Pool {
    /// An empty pool.
    pub(crate) const fn new() -> Pool {
        Pool {
            inner: Mutex::new(PoolInner {
                free: None,
                arenas: Vec::new(),
                buffer_bytes: 0,
                arena_bytes: 0,
                clock: 0,
            }),
        }
    }

    /// Bytes of free buffer storage kept.
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.inner.lock().buffer_bytes
    }

    /// Bytes of free arenas kept.
    pub(crate) fn arena_bytes(&self) -> usize {
        self.inner.lock().arena_bytes
    }

    pub(crate) fn take(&self, dtype: DType, class: usize) -> Option<Storage> {
        let mut inner = self.inner.lock();
        let (_, storage) = inner.free.as_mut()?.get_mut(&(dtype, class))?.pop_back()?;
        inner.buffer_bytes -= storage.bytes();
        Some(storage)
    }

    pub(crate) fn give_back(&self, storage: Storage) {
        let len = storage.capacity_len();
        if len == 0 || size_class(len) != len {
            return;
        }
        let bytes = storage.bytes();
        let limit = pool_limit();
        if bytes > limit {
            return;
        }
        let mut inner = self.inner.lock();
        let stamp = inner.stamp();
        inner.buffer_bytes += bytes;
        inner
            .free
            .get_or_insert_with(HashMap::new)
            .entry((storage.dtype(), len))
            .or_default()
            .push_back((stamp, storage));
        if inner.bytes() > limit {
            drop(inner);
            self.trim_to(limit);
        }
    }

    /// The smallest free arena of at least `len` elements.
    /// The smallest free arena of at least `len` elements (`Ok`), or else the largest
    /// smaller one, to be freed (`Err`): the arena it is about to be replaced by is
    /// larger and serves every segment it served, so shapes that keep growing keep one
    /// arena in the pool, not one per size.
    pub(crate) fn take_arena(&self, len: usize) -> Result<Vec<f32>, Option<Vec<f32>>> {
        let mut inner = self.inner.lock();
        let by_len = |(_, (_, a)): &(usize, &(u64, Vec<f32>))| a.len();
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
        inner.arena_bytes -= arena.len() * 4;
        if fits {
            Ok(arena)
        } else {
            Err(Some(arena))
        }
    }

    pub(crate) fn give_back_arena(&self, arena: Vec<f32>) {
        let bytes = arena.len() * 4;
        let limit = pool_limit();
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
            if victim.is_none() {
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
}
