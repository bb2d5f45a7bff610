//! Packed forms of weights, kept beside their buffers.
//!
//! A matrix product by a tensor that was made before the segment (a model's weight)
//! can read the weight in the microkernel's own layout instead of having `gemm` pack it
//! on every call (`kernels::PackedRhs`). The packed copy lives in the weight's
//! [`TensorBuffer`](super::TensorBuffer), in a [`PackSlot`]: made once, read by every
//! thread that multiplies by the weight, freed with the buffer. A buffer is packed the
//! second time it is the right operand of a product (one-off operands are never
//! copied), or at once when a model asks for it (`Tensor::prepack`). Its bytes
//! count as live tensor memory.
//!
//! A model can also keep a weight *only* packed (`Tensor::weight`): the buffer then
//! holds no row-major elements at all, so the weight costs its size once, not twice;
//! a read that needs the elements (`to_vec`, an op other than a product by it)
//! unpacks them once, beside it ([`PackSlot::elements`]).
//!
//! A tensor's elements never change while it is alive, so a packed copy stays true;
//! the buffer's storage going back to the pool drops it (`PackSlot::clear`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use super::memory::{add_live_bytes, sub_live_bytes};
use crate::ir::Layout;
use crate::kernels::{packable, PackedRhs};

/// The packed form of a buffer's matrix, made on demand (see the module docs).
#[derive(Debug, Default)]
pub(super) struct PackSlot {
    /// Times the buffer was a right operand before it was packed.
    uses: AtomicU32,
    /// `Some(None)`: packing was tried and is not possible here (no AVX-512, a layout
    /// it cannot take, no memory): the products use `gemm`.
    packed: OnceLock<Option<PackedRhs>>,
    /// Whether the buffer keeps its elements only here, packed (`Tensor::weight`).
    only: bool,
    /// The elements of such a buffer, unpacked at the first read that needs them.
    unpacked: OnceLock<Vec<f32>>,
}

impl PackSlot {
    /// The packed form of the matrix `layout` reads from `data` (the buffer's elements),
    /// packing it now if this is its second use as a right operand, or its first when
    /// `eager`. `None` when it is not packed (yet), or packed for another layout.
    pub(super) fn get(&self, data: &[f32], layout: &Layout, eager: bool) -> Option<&PackedRhs> {
        if let Some(p) = self.packed.get() {
            return p.as_ref().filter(|p| p.packs(layout));
        }
        if !packable(layout) {
            return None;
        }
        let r = layout.dims.len();
        if !eager && self.uses.fetch_add(1, Ordering::Relaxed) == 0 {
            return None;
        }
        let matrix = Layout {
            dims: layout.dims[r - 2..].into(),
            strides: layout.strides[r - 2..].into(),
            offset: layout.offset,
        };
        self.packed
            .get_or_init(|| {
                let p = PackedRhs::pack(data, &matrix);
                if let Some(p) = &p {
                    add_live_bytes(p.bytes());
                }
                p
            })
            .as_ref()
            .filter(|p| p.packs(layout))
    }

    /// A slot that holds a buffer's only copy of its elements, packed (counted as live
    /// memory until [`PackSlot::clear`]).
    pub(super) fn only(packed: PackedRhs) -> PackSlot {
        add_live_bytes(packed.bytes());
        PackSlot {
            uses: AtomicU32::new(0),
            packed: OnceLock::from(Some(packed)),
            only: true,
            unpacked: OnceLock::new(),
        }
    }

    /// Whether the buffer's elements live only here.
    pub(super) fn is_only(&self) -> bool {
        self.only
    }

    /// The elements of a buffer kept only packed, row-major: unpacked once, at the
    /// first call, and kept (counted as live memory). Empty when the system has no
    /// memory for them (every kernel then refuses the buffer as too short) or when the
    /// buffer is not kept packed.
    pub(super) fn elements(&self) -> &[f32] {
        self.unpacked.get_or_init(|| {
            let v = match self.packed.get() {
                Some(Some(p)) if self.only => p.unpack().unwrap_or_default(),
                _ => Vec::new(),
            };
            add_live_bytes(v.capacity() * std::mem::size_of::<f32>());
            v
        })
    }

    /// Drops the packed form (the buffer's storage is going back to the pool), and the
    /// unpacked elements of a buffer kept only packed.
    pub(super) fn clear(&mut self) {
        if let Some(Some(p)) = self.packed.take() {
            sub_live_bytes(p.bytes());
        }
        if let Some(v) = self.unpacked.take() {
            sub_live_bytes(v.capacity() * std::mem::size_of::<f32>());
        }
        *self.uses.get_mut() = 0;
        self.only = false;
    }

    /// Whether a packed form is held.
    #[cfg(test)]
    pub(super) fn is_packed(&self) -> bool {
        matches!(self.packed.get(), Some(Some(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_at_the_second_use_and_frees_on_clear() {
        let (k, n) = (32, 48);
        let data: Vec<f32> = (0..k * n).map(|x| x as f32).collect();
        let l = Layout::contiguous(&[k, n]);
        let mut slot = PackSlot::default();
        assert!(
            slot.get(&data, &l, false).is_none(),
            "first use: not packed"
        );
        let second = slot.get(&data, &l, false).is_some();
        assert_eq!(second, PackedRhs::packs_f32());
        assert_eq!(slot.is_packed(), second);
        // Another view of the same buffer does not use it.
        let t = Layout::contiguous(&[n, k]).permute(&[1, 0]);
        assert!(slot.get(&data, &t, false).is_none());
        slot.clear();
        assert!(!slot.is_packed());
        // Eager: packed at once; small or batched operands never.
        let slot = PackSlot::default();
        assert_eq!(slot.get(&data, &l, true).is_some(), second);
        let small = PackSlot::default();
        let l8 = Layout::contiguous(&[8, 8]);
        assert!(small.get(&data, &l8, true).is_none());
        let batched = PackSlot::default();
        let lb = Layout::contiguous(&[2, 16, 24]);
        assert!(batched.get(&data, &lb, true).is_none());
    }
}
