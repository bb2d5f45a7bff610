//! Reusing an emptied vector's allocation for elements of another type.
//!
//! The plan executor carves each level's arena into vectors of borrowed slices, which
//! cannot outlive the level; between levels and segments it keeps their allocations
//! as vectors of plain numbers of the same size and alignment, and [`retype`] turns
//! one into the other. The standard library promises no such reuse (collecting a
//! mapped iterator reuses the allocation today, but that is an optimisation, not a
//! contract), so it is done here, once, with the conditions checked.

use std::mem::{align_of, size_of, ManuallyDrop};

/// An empty `Vec<U>` that owns the allocation of `v` (emptied first: its elements are
/// dropped), so its capacity is reused without allocating. That needs `T` and `U` to
/// have the same size and alignment (then `v`'s allocation has exactly the layout of a
/// `Vec<U>` of the same capacity); when they differ, or are zero-sized, `v` is dropped
/// and a new, unallocated vector is returned instead.
pub(crate) fn retype<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    let same_layout = size_of::<T>() == size_of::<U>() && align_of::<T>() == align_of::<U>();
    if !same_layout || size_of::<T>() == 0 || v.capacity() == 0 {
        return Vec::new();
    }
    let mut v = ManuallyDrop::new(v);
    let (ptr, capacity) = (v.as_mut_ptr(), v.capacity());
    // SAFETY: `ptr` was allocated by the global allocator for `capacity` elements of
    // `T` (a non-zero capacity of a non-zero size), i.e. with the layout of `[T;
    // capacity]`, which is the layout of `[U; capacity]` because `T` and `U` have the
    // same size and alignment (checked above); the length is 0, so no `U` needs to be
    // initialised; and `v` is never dropped (`ManuallyDrop`), so the new vector is the
    // allocation's only owner.
    unsafe { Vec::from_raw_parts(ptr.cast::<U>(), 0, capacity) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn the_allocation_is_reused_when_layouts_match() {
        let mut v: Vec<(usize, usize)> = Vec::with_capacity(10);
        v.push((1, 2));
        let (ptr, cap) = (v.as_ptr() as usize, v.capacity());
        let mut slices: Vec<Option<&mut [f32]>> = retype(v);
        assert_eq!((slices.len(), slices.capacity()), (0, cap));
        assert_eq!(slices.as_ptr() as usize, ptr, "same allocation");
        let mut data = [1.0f32; 4];
        slices.push(Some(&mut data[..2]));
        slices.extend((1..cap).map(|_| None));
        assert_eq!(slices.as_ptr() as usize, ptr, "filled to capacity in place");
        let back: Vec<(usize, usize)> = retype(slices);
        assert_eq!((back.len(), back.capacity()), (0, cap));
        assert_eq!(back.as_ptr() as usize, ptr);
    }

    #[test]
    fn elements_are_dropped_first() {
        let value = Rc::new(());
        let v = vec![value.clone(), value.clone()];
        let w: Vec<usize> = retype(v);
        assert_eq!(Rc::strong_count(&value), 1);
        assert!(w.is_empty() && w.capacity() >= 2);
    }

    #[test]
    fn mismatched_layouts_are_refused() {
        let smaller: Vec<u32> = retype(Vec::<u64>::with_capacity(8));
        assert_eq!(smaller.capacity(), 0, "another size: a new vector");
        let less_aligned: Vec<[u8; 8]> = retype(Vec::<u64>::with_capacity(8));
        assert_eq!(
            less_aligned.capacity(),
            0,
            "another alignment: a new vector"
        );
        let more_aligned: Vec<u64> = retype(Vec::<[u32; 2]>::with_capacity(8));
        assert_eq!(more_aligned.capacity(), 0);
        let unit: Vec<()> = retype(Vec::<()>::with_capacity(8));
        assert!(unit.is_empty());
    }
}
