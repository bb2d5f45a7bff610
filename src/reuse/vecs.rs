//! Bounded stacks of emptied vectors, kept for their capacity.
//!
//! A [`Spares`] keeps vectors (or deques) that their last user is done with: each is
//! cleared when it is kept, so it holds no value and no borrow of that user, only
//! room. Taking one gives a kept vector, or a new empty one when none is left. A stream
//! keeps the vectors of its executed tasks and its segment deques in `Spares`.

use std::collections::VecDeque;

/// A growable sequence that can be emptied while keeping its room: `Vec`, `VecDeque`.
pub(crate) trait Emptiable: Default {
    /// Drops every element, keeping the allocation.
    fn clear(&mut self);
    /// The elements it has room for without allocating.
    fn capacity(&self) -> usize;
}

impl<T> Emptiable for Vec<T> {
    fn clear(&mut self) {
        Vec::clear(self)
    }
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
}

impl<T> Emptiable for VecDeque<T> {
    fn clear(&mut self) {
        VecDeque::clear(self)
    }
    fn capacity(&self) -> usize {
        VecDeque::capacity(self)
    }
}

/// At most `max` emptied vectors, last kept first taken.
#[derive(Debug)]
pub(crate) struct Spares<V> {
    list: Vec<V>,
    max: usize,
}

impl<V: Emptiable> Spares<V> {
    /// An empty stack that keeps at most `max` vectors (it allocates on its first
    /// `keep`).
    pub(crate) const fn new(max: usize) -> Spares<V> {
        Spares {
            list: Vec::new(),
            max,
        }
    }

    /// A kept vector (empty), if there is one.
    pub(crate) fn pop(&mut self) -> Option<V> {
        self.list.pop()
    }

    /// A kept vector (empty), or a new empty one.
    pub(crate) fn take(&mut self) -> V {
        self.pop().unwrap_or_default()
    }

    /// Keeps `v`, emptied, if it has room to offer and the stack is not full; drops it
    /// otherwise.
    pub(crate) fn keep(&mut self, mut v: V) {
        if v.capacity() == 0 || self.list.len() >= self.max {
            return;
        }
        v.clear();
        self.list.push(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn kept_vectors_are_emptied_and_bounded() {
        let mut spares: Spares<Vec<Rc<()>>> = Spares::new(2);
        let value = Rc::new(());
        for _ in 0..3 {
            spares.keep(vec![value.clone(); 4]);
        }
        assert_eq!(Rc::strong_count(&value), 1, "kept vectors hold no value");
        spares.keep(Vec::new()); // no room to offer: not kept
        let (a, b) = (spares.take(), spares.take());
        assert!(a.is_empty() && a.capacity() >= 4 && b.capacity() >= 4);
        assert!(spares.pop().is_none(), "two kept at most");
        assert_eq!(spares.take().capacity(), 0, "a new one when none is left");
    }
}
