//! Buffers: the typed memory a tensor's elements live in, and the pool they come from.
//!
//! A [`TensorBuffer`] owns one `Vec` of a single element type. Buffers are handed out by a
//! size-class pool: a request for `n` elements is rounded up to the next class (powers
//! of two split in quarters, so at most 25% is wasted), and a dropped buffer goes back
//! to its class for the next request of that size. After warm-up, a repeated forward
//! pass therefore finds every buffer it needs in the pool. TensorBuffer contents are not
//! cleared between uses: every kernel writes all of its output. The pool's mechanism
//! is `crate::reuse::pool`; the pool itself, its limit ([`pool_limit`]) and the
//! counters of memory in use are in `runtime::memory`.
//!
//! Every allocation here is fallible: a size the system cannot give comes back as an
//! [`AllocError`] (the caller turns it into [`Error::OutOfMemory`] naming its op)
//! instead of aborting the process.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::memory::{add_live_bytes, pool_limit, sub_live_bytes, trim_pools, LIVE_BUFFERS, POOL};
use crate::reuse::cells::{last_ref, SharedCells};
pub(crate) use crate::reuse::pool::size_class;
use crate::reuse::pool::Pooled;

use super::prepack::PackSlot;
use crate::error::Error;
use crate::ir::{DType, Layout};
use crate::kernels::PackedRhs;
pub(crate) use crate::ops::{Data, DataElement, DataMut};

/// A request for memory that the system refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AllocError {
    /// The bytes requested.
    pub bytes: usize,
}

impl AllocError {
    /// The engine error for op `op`, which needed this memory.
    pub(crate) fn error(self, op: &'static str) -> Error {
        Error::OutOfMemory {
            op,
            bytes: self.bytes,
        }
    }
}

mod sealed {
    /// Element types whose all-zero bit pattern is the value zero.
    pub(crate) trait ZeroBits: Copy {}
    impl ZeroBits for f32 {}
    impl ZeroBits for u32 {}
    impl ZeroBits for i64 {}
}

/// `len` zeros in a vector of exactly `len` elements, or an error if the system cannot
/// give the memory. Like `vec![0; len]`, it asks the allocator for zeroed memory, so
/// fresh pages are zero without being written here (a large buffer costs no pass over
/// its memory before the kernel writes it).
pub(crate) fn try_zeroed<T: sealed::ZeroBits>(len: usize) -> Result<Vec<T>, AllocError> {
    let bytes = len.saturating_mul(std::mem::size_of::<T>());
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| AllocError { bytes })?;
    // SAFETY: `layout` has a non-zero size (`len > 0`, and every `ZeroBits` type has a
    // non-zero size). A safe `try_reserve` + `resize` would write every element first;
    // the allocator's zeroed memory costs nothing for fresh pages (measured in the
    // commit that added this).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(AllocError { bytes });
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `len`
    // elements of `T` (so capacity `len`), and all `len` of them are initialised: the
    // memory is zeroed, and all-zero bits are the value 0 for every `ZeroBits` type
    // (f32, u32, i64).
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// The elements of one buffer, typed.
#[derive(Debug)]
pub enum Storage {
    /// f32 elements.
    F32(Vec<f32>),
    /// u32 elements.
    U32(Vec<u32>),
    /// i64 elements.
    I64(Vec<i64>),
}

impl Storage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::U32(_) => DType::U32,
            Storage::I64(_) => DType::I64,
        }
    }

    fn capacity_len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::U32(v) => v.len(),
            Storage::I64(v) => v.len(),
        }
    }

    fn try_zeroed(dtype: DType, len: usize) -> Result<Storage, AllocError> {
        Ok(match dtype {
            // Weights kept in reduced precision hold their elements packed; what the
            // buffer itself holds, when anything, is their values in f32.
            DType::F32 | DType::BF16 | DType::I8 | DType::BF16X3 => Storage::F32(try_zeroed(len)?),
            DType::U32 => Storage::U32(try_zeroed(len)?),
            DType::I64 => Storage::I64(try_zeroed(len)?),
        })
    }

    fn bytes(&self) -> usize {
        self.capacity_len() * self.dtype().size_in_bytes()
    }
}

impl Pooled for Storage {
    type Kind = DType;
    fn kind(&self) -> DType {
        self.dtype()
    }
    fn elements(&self) -> usize {
        self.capacity_len()
    }
    fn bytes(&self) -> usize {
        Storage::bytes(self)
    }
}

/// Memory outside the engine that a tensor reads in place, without a copy
/// ([`Tensor::from_external`](crate::Tensor::from_external)): a NumPy array's buffer, a
/// memory-mapped file. The engine holds the value for as long as any tensor or pending
/// op reads the elements, and drops it after.
///
/// The contract: `elements` gives the same elements, unchanged, every time it is called
/// while the value lives. Safe code cannot break memory safety by failing it (a
/// shorter slice is an error of the kernels that read it, other contents give other
/// results), but results are then unspecified.
pub trait External<T>: Send + Sync + 'static {
    /// The elements, row-major.
    fn elements(&self) -> &[T];
}

/// A buffer's elements borrowed from outside the engine, typed (named only by
/// [`StorageElement`]'s signature: nothing outside the crate can use it).
pub enum Foreign {
    /// f32 elements.
    F32(Box<dyn External<f32>>),
    /// u32 elements.
    U32(Box<dyn External<u32>>),
    /// i64 elements.
    I64(Box<dyn External<i64>>),
}

impl Foreign {
    /// The first `n` elements (none when the outside memory is shorter than it was:
    /// every kernel then refuses the buffer as too short).
    fn data(&self, n: usize) -> Data<'_> {
        fn first<T>(s: &[T], n: usize) -> &[T] {
            s.get(..n).unwrap_or(&[])
        }
        match self {
            Foreign::F32(e) => Data::F32(first(e.elements(), n)),
            Foreign::U32(e) => Data::U32(first(e.elements(), n)),
            Foreign::I64(e) => Data::I64(first(e.elements(), n)),
        }
    }
}

impl std::fmt::Debug for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (dtype, len) = match self {
            Foreign::F32(e) => ("f32", e.elements().len()),
            Foreign::U32(e) => ("u32", e.elements().len()),
            Foreign::I64(e) => ("i64", e.elements().len()),
        };
        write!(f, "Foreign({dtype} x {len})")
    }
}

/// Elements that can be viewed out of a [`Storage`] of their own type.
pub trait StorageElement: DataElement {
    /// The elements if the storage holds this type.
    fn slice(storage: &Storage) -> Option<&[Self]>;
    /// The elements, mutably, if the storage holds this type.
    fn slice_mut(storage: &mut Storage) -> Option<&mut [Self]>;
    /// A storage made of these elements.
    fn into_storage(v: Vec<Self>) -> Storage;
    /// Outside memory of these elements, for a buffer.
    #[doc(hidden)]
    fn foreign(e: Box<dyn External<Self>>) -> Foreign;
}

macro_rules! storage_element {
    ($t:ty, $variant:ident) => {
        impl StorageElement for $t {
            fn slice(storage: &Storage) -> Option<&[Self]> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(storage: &mut Storage) -> Option<&mut [Self]> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn into_storage(v: Vec<Self>) -> Storage {
                Storage::$variant(v)
            }
            fn foreign(e: Box<dyn External<Self>>) -> Foreign {
                Foreign::$variant(e)
            }
        }
    };
}

storage_element!(f32, F32);
storage_element!(u32, U32);
storage_element!(i64, I64);

/// A pooled buffer of `len` elements (its storage may be a little longer: the size
/// class). Dropping it returns the storage to the pool.
#[derive(Debug)]
pub(crate) struct TensorBuffer {
    storage: Storage,
    len: usize,
    /// False for an emptied shell on a free list (its storage went back to the pool).
    live: bool,
    /// The packed form of the matrix it holds, when it is a weight (`prepack`).
    pack: PackSlot,
    /// Its elements when they live outside the engine (`from_external`): then
    /// `storage` is empty, and nothing writes the buffer (a ready tensor's elements
    /// never change).
    foreign: Option<Foreign>,
}

/// Emptied shells of shared buffers (their storage went back to the pool), for
/// [`TensorBuffer::shared`]: one list for the process, because buffers are made where a
/// segment runs and let go where their tensors die.
static FREE_BUFFERS: SharedCells<TensorBuffer> = SharedCells::new();

impl TensorBuffer {
    /// A buffer of `len` elements of `dtype`, from the pool when one of its class is free.
    /// Its contents are unspecified: the caller writes every element. Fails when the
    /// system cannot give the memory (after freeing what the pool keeps and trying once
    /// more).
    pub(crate) fn alloc(dtype: DType, len: usize) -> Result<TensorBuffer, AllocError> {
        let class = size_class(len);
        let storage = match POOL.take(dtype, class) {
            Some(s) => s,
            None => Storage::try_zeroed(dtype, class).or_else(|_| {
                trim_pools();
                Storage::try_zeroed(dtype, class)
            })?,
        };
        Ok(TensorBuffer::track(storage, len))
    }

    /// A buffer that takes ownership of `data` (no copy).
    pub(crate) fn from_vec<T: StorageElement>(data: Vec<T>) -> TensorBuffer {
        let len = data.len();
        TensorBuffer::track(T::into_storage(data), len)
    }

    /// A buffer of the `[k, n]` f32 matrix `packed` holds, kept only in that packed
    /// form (see `runtime::prepack`): products by it read the panels, and anything else
    /// that reads its elements unpacks them once.
    pub(crate) fn from_packed(packed: PackedRhs, len: usize) -> TensorBuffer {
        let mut b = TensorBuffer::track(Storage::F32(Vec::new()), len);
        b.pack = PackSlot::only(packed);
        b
    }

    /// A buffer of the first `len` elements of outside memory, read in place (no
    /// copy; its bytes are not counted as the engine's). The caller checked that `data`
    /// holds `len` elements.
    pub(crate) fn from_external<T: StorageElement>(
        data: Box<dyn External<T>>,
        len: usize,
    ) -> TensorBuffer {
        let mut b = TensorBuffer::track(T::into_storage(Vec::new()), len);
        b.foreign = Some(T::foreign(data));
        b
    }

    fn track(storage: Storage, len: usize) -> TensorBuffer {
        LIVE_BUFFERS.fetch_add(1, Ordering::Relaxed);
        add_live_bytes(storage.bytes());
        TensorBuffer {
            storage,
            len,
            live: true,
            pack: PackSlot::default(),
            foreign: None,
        }
    }

    /// A pooled buffer of `len` elements behind an `Arc`, reusing an emptied shell of
    /// the process's free list when there is one (so no allocation at all after warm-up).
    /// Fails as [`TensorBuffer::alloc`] does.
    pub(crate) fn shared(dtype: DType, len: usize) -> Result<Arc<TensorBuffer>, AllocError> {
        let fresh = TensorBuffer::alloc(dtype, len)?;
        if let Some(mut cell) = FREE_BUFFERS.take() {
            if let Some(b) = Arc::get_mut(&mut cell) {
                let old = std::mem::replace(b, fresh);
                debug_assert!(!old.live, "free shells hold no storage");
                return Ok(cell);
            }
        }
        Ok(Arc::new(fresh))
    }

    /// Lets go of one reference to a shared buffer. The last one gives the storage back
    /// to the pool (as a drop would) and keeps the emptied shell for [`TensorBuffer::shared`].
    pub(crate) fn release(mut buffer: Arc<TensorBuffer>) {
        let Some(b) = last_ref(&mut buffer) else {
            return;
        };
        b.give_back();
        FREE_BUFFERS.give(buffer);
    }

    /// Returns the storage to the pool and updates the counters; leaves an empty shell.
    fn give_back(&mut self) {
        if !self.live {
            return;
        }
        self.live = false;
        self.pack.clear();
        self.foreign = None;
        let storage = std::mem::replace(&mut self.storage, Storage::F32(Vec::new()));
        LIVE_BUFFERS.fetch_sub(1, Ordering::Relaxed);
        sub_live_bytes(storage.bytes());
        if storage.capacity_len() > 0 {
            POOL.give_back(storage, pool_limit());
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The elements, typed by the buffer's dtype (unpacked first, once, for a buffer
    /// kept only packed).
    pub(crate) fn data(&self) -> Data<'_> {
        if self.pack.is_only() {
            return Data::F32(self.pack.elements());
        }
        let n = self.len;
        if let Some(f) = &self.foreign {
            return f.data(n);
        }
        match &self.storage {
            Storage::F32(v) => Data::F32(&v[..n]),
            Storage::U32(v) => Data::U32(&v[..n]),
            Storage::I64(v) => Data::I64(&v[..n]),
        }
    }

    /// The elements, mutably, typed by the buffer's dtype (none for a buffer kept only
    /// packed, which nothing writes: a kernel handed one fails its length check).
    pub(crate) fn data_mut(&mut self) -> DataMut<'_> {
        if self.pack.is_only() || self.foreign.is_some() {
            return DataMut::F32(&mut []);
        }
        let n = self.len;
        match &mut self.storage {
            Storage::F32(v) => DataMut::F32(&mut v[..n]),
            Storage::U32(v) => DataMut::U32(&mut v[..n]),
            Storage::I64(v) => DataMut::I64(&mut v[..n]),
        }
    }

    /// The packed form of the f32 matrix `layout` reads from this buffer, for a product
    /// that has it as its right operand: made at its second such use, or at once when
    /// `eager` (see `runtime::prepack`). `None` when it is not (yet) packed.
    pub(crate) fn packed_rhs(&self, layout: &Layout, eager: bool) -> Option<&PackedRhs> {
        if self.pack.is_only() {
            return self.pack.get(&[], layout, eager);
        }
        let Data::F32(data) = self.data() else {
            return None;
        };
        self.pack.get(data, layout, eager)
    }

    /// The elements as `T`, or `None` if the buffer holds another type.
    pub(crate) fn as_slice<T: StorageElement>(&self) -> Option<&[T]> {
        if self.pack.is_only() || self.foreign.is_some() {
            return T::from_data(self.data());
        }
        T::slice(&self.storage).map(|s| &s[..self.len])
    }
}

impl Drop for TensorBuffer {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `unsafe` in `try_zeroed`: the vector owns exactly `len` initialised zeros
    /// with a layout the global allocator accepts back (growing reallocates it, dropping
    /// frees it; Miri or a sanitizer would flag a wrong layout here), and an impossible
    /// size is an error, not an abort.
    #[test]
    fn zeroed_vectors_hold_zeros_and_give_their_memory_back() {
        for len in [0usize, 1, 7, 4096, 1 << 20] {
            let mut v = try_zeroed::<f32>(len).unwrap();
            assert_eq!((v.len(), v.capacity()), (len, len));
            assert!(v.iter().all(|&x| x.to_bits() == 0));
            v.push(1.0); // reallocates with the layout it was allocated with
            assert_eq!(v[len], 1.0);
            let w = try_zeroed::<i64>(len).unwrap();
            assert!(w.iter().all(|&x| x == 0));
            let u = try_zeroed::<u32>(len).unwrap();
            assert!(u.iter().all(|&x| x == 0));
        }
        let err = try_zeroed::<f32>(usize::MAX / 2).unwrap_err();
        assert_eq!(err.bytes, usize::MAX);
        assert!(try_zeroed::<i64>(1 << 60).is_err());
    }

    #[test]
    fn buffers_are_reused() {
        let b = TensorBuffer::alloc(DType::F32, 1000).unwrap();
        assert_eq!(b.len(), 1000);
        assert_eq!(b.as_slice::<f32>().unwrap().len(), 1000);
        assert!(b.as_slice::<u32>().is_none());
        drop(b);
        let c = TensorBuffer::alloc(DType::F32, 1001).unwrap();
        assert_eq!(c.len(), 1001);
    }
}
