//! Buffers: the typed memory a tensor's elements live in, and the pool they come from.
//!
//! A [`Buffer`] owns one `Vec` of a single element type. Buffers are handed out by a
//! size-class pool: a request for `n` elements is rounded up to the next class (powers
//! of two split in quarters, so at most 25% is wasted), and a dropped buffer goes back
//! to its class for the next request of that size, up to a cap on the bytes the pool
//! keeps. After warm-up, a repeated forward pass therefore finds every buffer it needs
//! in the pool. Buffer contents are not cleared between uses: every kernel writes all
//! of its output.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::recycle;

use crate::ir::{DType, Element};

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

    fn zeroed(dtype: DType, len: usize) -> Storage {
        match dtype {
            DType::F32 => Storage::F32(vec![0.0; len]),
            DType::U32 => Storage::U32(vec![0; len]),
            DType::I64 => Storage::I64(vec![0; len]),
        }
    }
}

/// A borrowed, typed slice of tensor elements: what a kernel reads.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// u32 elements.
    U32(&'a [u32]),
    /// i64 elements.
    I64(&'a [i64]),
}

/// A mutably borrowed, typed slice of tensor elements: what a kernel writes.
#[derive(Debug)]
pub enum DataMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// u32 elements.
    U32(&'a mut [u32]),
    /// i64 elements.
    I64(&'a mut [i64]),
}

/// Elements that can be viewed out of a [`Storage`] of their own type.
pub trait StorageElement: Element {
    /// The slice if `data` holds this type.
    fn from_data(data: Data<'_>) -> Option<&[Self]>;
    /// The slice if `data` holds this type.
    fn from_data_mut(data: DataMut<'_>) -> Option<&mut [Self]>;
    /// The elements if the storage holds this type.
    fn slice(storage: &Storage) -> Option<&[Self]>;
    /// The elements, mutably, if the storage holds this type.
    fn slice_mut(storage: &mut Storage) -> Option<&mut [Self]>;
    /// A storage made of these elements.
    fn into_storage(v: Vec<Self>) -> Storage;
}

macro_rules! storage_element {
    ($t:ty, $variant:ident) => {
        impl StorageElement for $t {
            fn from_data(data: Data<'_>) -> Option<&[Self]> {
                match data {
                    Data::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn from_data_mut(data: DataMut<'_>) -> Option<&mut [Self]> {
                match data {
                    DataMut::$variant(v) => Some(v),
                    _ => None,
                }
            }
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
        }
    };
}

storage_element!(f32, F32);
storage_element!(u32, U32);
storage_element!(i64, I64);

/// A pooled buffer of `len` elements (its storage may be a little longer: the size
/// class). Dropping it returns the storage to the pool.
#[derive(Debug)]
pub struct Buffer {
    storage: Storage,
    len: usize,
    /// False for an emptied shell on a free list (its storage went back to the pool).
    live: bool,
}

static LIVE_BUFFERS: AtomicUsize = AtomicUsize::new(0);
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Adds `delta` bytes to the tensor memory in use (buffers and arenas) and updates the
/// peak.
pub(crate) fn add_live_bytes(delta: usize) {
    let now = LIVE_BYTES.fetch_add(delta, Ordering::Relaxed) + delta;
    PEAK_BYTES.fetch_max(now, Ordering::Relaxed);
}

/// Removes `delta` bytes from the tensor memory in use.
pub(crate) fn sub_live_bytes(delta: usize) {
    LIVE_BYTES.fetch_sub(delta, Ordering::Relaxed);
}

/// The most tensor memory (buffers and arenas, in bytes) in use at once since the
/// last [`reset_peak_bytes`].
pub fn peak_bytes() -> usize {
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// Starts a new peak measurement from the memory in use now.
pub fn reset_peak_bytes() {
    PEAK_BYTES.store(LIVE_BYTES.load(Ordering::Relaxed), Ordering::Relaxed);
}

impl Buffer {
    /// A buffer of `len` elements of `dtype`, from the pool when one of its class is free.
    /// Its contents are unspecified: the caller writes every element.
    pub fn alloc(dtype: DType, len: usize) -> Buffer {
        let class = size_class(len);
        let storage = POOL
            .take(dtype, class)
            .unwrap_or_else(|| Storage::zeroed(dtype, class));
        Buffer::track(storage, len)
    }

    /// A buffer that takes ownership of `data` (no copy).
    pub fn from_vec<T: StorageElement>(data: Vec<T>) -> Buffer {
        let len = data.len();
        Buffer::track(T::into_storage(data), len)
    }

    fn track(storage: Storage, len: usize) -> Buffer {
        LIVE_BUFFERS.fetch_add(1, Ordering::Relaxed);
        add_live_bytes(storage.capacity_len() * storage.dtype().size_in_bytes());
        Buffer {
            storage,
            len,
            live: true,
        }
    }

    /// A pooled buffer of `len` elements behind an `Arc`, reusing an emptied shell of
    /// this thread's free list when there is one (so no allocation at all after warm-up).
    pub fn shared(dtype: DType, len: usize) -> Arc<Buffer> {
        if let Some(mut cell) = recycle::buffers::take() {
            if let Some(b) = Arc::get_mut(&mut cell) {
                let fresh = Buffer::alloc(dtype, len);
                let old = std::mem::replace(b, fresh);
                debug_assert!(!old.live, "free shells hold no storage");
                return cell;
            }
        }
        Arc::new(Buffer::alloc(dtype, len))
    }

    /// Lets go of one reference to a shared buffer. The last one gives the storage back
    /// to the pool (as a drop would) and keeps the emptied shell for [`Buffer::shared`].
    pub fn release(mut buffer: Arc<Buffer>) {
        let Some(b) = recycle::last_ref(&mut buffer) else {
            return;
        };
        b.give_back();
        recycle::buffers::give(buffer);
    }

    /// Returns the storage to the pool and updates the counters; leaves an empty shell.
    fn give_back(&mut self) {
        if !self.live {
            return;
        }
        self.live = false;
        let storage = std::mem::replace(&mut self.storage, Storage::F32(Vec::new()));
        LIVE_BUFFERS.fetch_sub(1, Ordering::Relaxed);
        sub_live_bytes(storage.capacity_len() * storage.dtype().size_in_bytes());
        POOL.give_back(storage);
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements, typed by the buffer's dtype.
    pub fn data(&self) -> Data<'_> {
        let n = self.len;
        match &self.storage {
            Storage::F32(v) => Data::F32(&v[..n]),
            Storage::U32(v) => Data::U32(&v[..n]),
            Storage::I64(v) => Data::I64(&v[..n]),
        }
    }

    /// The elements, mutably, typed by the buffer's dtype.
    pub fn data_mut(&mut self) -> DataMut<'_> {
        let n = self.len;
        match &mut self.storage {
            Storage::F32(v) => DataMut::F32(&mut v[..n]),
            Storage::U32(v) => DataMut::U32(&mut v[..n]),
            Storage::I64(v) => DataMut::I64(&mut v[..n]),
        }
    }

    /// The elements as `T`, or `None` if the buffer holds another type.
    pub fn as_slice<T: StorageElement>(&self) -> Option<&[T]> {
        T::slice(&self.storage).map(|s| &s[..self.len])
    }

    /// The elements as `T`, mutably, or `None` if the buffer holds another type.
    pub fn as_mut_slice<T: StorageElement>(&mut self) -> Option<&mut [T]> {
        let len = self.len;
        T::slice_mut(&mut self.storage).map(|s| &mut s[..len])
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// Number of buffers alive now (held by tensors, queued ops or running kernels; pooled
/// free storage is not counted).
pub fn live_buffers() -> usize {
    LIVE_BUFFERS.load(Ordering::Relaxed)
}

/// Bytes of tensor memory in use: live buffers (with their size-class slack) and
/// arenas of running segments.
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Bytes of free storage the pool keeps for reuse.
pub fn pooled_bytes() -> usize {
    POOL.inner.lock().bytes
}

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

/// The most bytes of free storage the pool keeps; beyond it, freed storage goes back to
/// the system allocator.
const POOL_CAP_BYTES: usize = 2 << 30;

struct Pool {
    inner: Mutex<PoolInner>,
}

#[derive(Default)]
struct PoolInner {
    free: Option<HashMap<(DType, usize), Vec<Storage>>>,
    bytes: usize,
}

static POOL: Pool = Pool {
    inner: Mutex::new(PoolInner {
        free: None,
        bytes: 0,
    }),
};

impl Pool {
    fn take(&self, dtype: DType, class: usize) -> Option<Storage> {
        let mut inner = self.inner.lock();
        let storage = inner.free.as_mut()?.get_mut(&(dtype, class))?.pop()?;
        inner.bytes -= class * dtype.size_in_bytes();
        Some(storage)
    }

    fn give_back(&self, storage: Storage) {
        let len = storage.capacity_len();
        if len == 0 || size_class(len) != len {
            return;
        }
        let bytes = len * storage.dtype().size_in_bytes();
        let mut inner = self.inner.lock();
        if inner.bytes + bytes > POOL_CAP_BYTES {
            return;
        }
        inner.bytes += bytes;
        inner
            .free
            .get_or_insert_with(HashMap::new)
            .entry((storage.dtype(), len))
            .or_default()
            .push(storage);
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

    #[test]
    fn buffers_are_reused() {
        let b = Buffer::alloc(DType::F32, 1000);
        assert_eq!(b.len(), 1000);
        assert_eq!(b.as_slice::<f32>().unwrap().len(), 1000);
        assert!(b.as_slice::<u32>().is_none());
        drop(b);
        let c = Buffer::alloc(DType::F32, 1001);
        assert_eq!(c.len(), 1001);
    }
}
