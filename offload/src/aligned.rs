//! Page-aligned host buffers: what uncached reads and writes (O_DIRECT and its kin) need, and what a
//! registered io_uring buffer or a GPU staging copy is fastest from. A buffer lives on the heap, or in
//! memory another owner provides ([`HostMemory`]: host memory a GPU copies from directly).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::sync::Mutex;

/// The alignment and size granularity of every buffer and shard file: one 4 KiB page, which is also
/// the logical block size O_DIRECT requires on every NVMe drive we know of.
pub const ALIGN_BYTES: usize = 4096;

/// Rounds `bytes` up to a whole number of [`ALIGN_BYTES`].
pub fn align_up(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES
}

/// Buffers of at least this size are aligned to, and advised onto, 2 MiB huge pages where the kernel
/// offers them (transparent huge pages in `madvise` or `always` mode): the first touch of a fresh
/// buffer then faults once per 2 MiB instead of once per 4 KiB (measured here: 4 GB/s instead of 1.5).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Memory an [`AlignedBuf`] lives in other than the heap, kept alive by the buffer: host memory a
/// device reads by itself (a GPU's copy engine), so that what the host writes there is never copied
/// again before it crosses the link.
pub trait HostMemory: Send + Sync {
    /// Blocks until nothing reads the memory any more (copies the device was asked for and may still
    /// be running). The buffer calls it before every mutable access: the one place that keeps host
    /// writes from racing the device's reads.
    fn before_host_write(&self);
}

/// A zero-initialised buffer whose address and capacity are multiples of [`ALIGN_BYTES`], on the heap
/// or in a [`HostMemory`]. `len_bytes` is what the user asked for; the tail up to `align_up(len_bytes)`
/// is padding (zeros); a reused buffer ([`BufferPool`]) may hold more capacity beyond that.
pub struct AlignedBuf {
    ptr: *mut u8,
    len_bytes: usize,
    capacity_bytes: usize,
    align_bytes: usize,
    /// The memory's owner where it is not the heap (then dropping it frees the memory).
    external: Option<Box<dyn HostMemory>>,
}

// SAFETY: the buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len_bytes: usize) -> Self {
        let capacity_bytes = align_up(len_bytes.max(1));
        let align_bytes = if capacity_bytes >= HUGE_PAGE_BYTES { HUGE_PAGE_BYTES } else { ALIGN_BYTES };
        let layout = Layout::from_size_align(capacity_bytes, align_bytes).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        if align_bytes == HUGE_PAGE_BYTES {
            crate::os::advise_huge_pages(ptr, capacity_bytes);
        }
        AlignedBuf { ptr, len_bytes, capacity_bytes, align_bytes, external: None }
    }

    /// A buffer of `len_bytes` in `owner`'s memory at `ptr`, zeroed here.
    ///
    /// # Safety
    /// `ptr` is aligned to [`ALIGN_BYTES`] and valid for reads and writes of `align_up(len_bytes)`
    /// bytes for as long as `owner` lives, and nothing else writes those bytes.
    pub unsafe fn in_host_memory(ptr: *mut u8, len_bytes: usize, owner: Box<dyn HostMemory>) -> Self {
        assert!((ptr as usize).is_multiple_of(ALIGN_BYTES), "host memory at {ptr:?} is not page-aligned");
        let capacity_bytes = align_up(len_bytes.max(1));
        let mut buf = AlignedBuf { ptr, len_bytes, capacity_bytes, align_bytes: ALIGN_BYTES, external: Some(owner) };
        buf.padded_mut().fill(0);
        buf
    }

    /// Whether the buffer lives in a [`HostMemory`] (not the heap).
    pub fn is_in_host_memory(&self) -> bool {
        self.external.is_some()
    }

    /// This buffer holding `len_bytes` (at most its capacity): the padding up to the next page is
    /// zeroed, the rest keeps whatever it held.
    fn reused_for(mut self, len_bytes: usize) -> Self {
        assert!(align_up(len_bytes) <= self.capacity_bytes, "reusing a buffer of {} bytes for {len_bytes}", self.capacity_bytes);
        self.len_bytes = len_bytes;
        self.padded_mut()[len_bytes..align_up(len_bytes)].fill(0);
        self
    }

    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }
    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// The whole aligned capacity, padding included (what O_DIRECT transfers).
    pub fn padded(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity_bytes initialised bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.capacity_bytes) }
    }
    pub fn padded_mut(&mut self) -> &mut [u8] {
        if let Some(owner) = &self.external {
            owner.before_host_write();
        }
        // SAFETY: as above, and &mut self gives exclusive access (and no device reads it any more).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.capacity_bytes) }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.padded()[..self.len_bytes]
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.len_bytes;
        &mut self.padded_mut()[..n]
    }

    /// The buffer as a slice of `T` (f32, u16, ...); `len_bytes` must be a multiple of its size.
    pub fn as_slice<T: bytemuck::Pod>(&self) -> &[T] {
        bytemuck::cast_slice(self.bytes())
    }
    pub fn as_mut_slice<T: bytemuck::Pod>(&mut self) -> &mut [T] {
        bytemuck::cast_slice_mut(self.bytes_mut())
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.external.take().is_some() {
            return; // its owner, dropped now, frees it
        }
        let layout = Layout::from_size_align(self.capacity_bytes, self.align_bytes).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { dealloc(self.ptr, layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes, {} capacity)", self.len_bytes, self.capacity_bytes)
    }
}

/// Buffers kept for reuse once released, so that paging tens of gigabytes in and out per step does
/// not fault every page in again (a fresh buffer's pages are faulted and zeroed on first touch, at
/// 1.5-4 GB/s here). A request takes a free buffer of its capacity; when there is none, free buffers
/// of at least the requested size are released before a new one is allocated, so the pool never makes
/// the process hold more bytes than the most it had in use at once.
#[derive(Default)]
pub struct BufferPool {
    free: Mutex<Vec<AlignedBuf>>,
}

impl BufferPool {
    /// A buffer of `len_bytes` whose contents up to `len_bytes` are unspecified (a read overwrites them).
    pub fn take(&self, len_bytes: usize) -> AlignedBuf {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        // Only a buffer of the same capacity: a larger one would hold untouched-by-this-tensor pages
        // resident for as long as it serves smaller tensors.
        let capacity_bytes = align_up(len_bytes.max(1));
        if let Some(i) = free.iter().position(|b| b.capacity_bytes == capacity_bytes) {
            return free.swap_remove(i).reused_for(len_bytes);
        }
        let mut released = 0;
        while released < len_bytes {
            let Some(b) = free.pop() else { break };
            released += b.capacity_bytes;
        }
        drop(free);
        AlignedBuf::zeroed(len_bytes)
    }

    /// A zero-filled buffer of `len_bytes`.
    pub fn take_zeroed(&self, len_bytes: usize) -> AlignedBuf {
        let mut b = self.take(len_bytes);
        b.bytes_mut().fill(0);
        b
    }

    /// Returns a buffer for later requests.
    pub fn give(&self, buf: AlignedBuf) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(buf);
    }

    /// Bytes held by free buffers.
    pub fn free_bytes(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|b| b.capacity_bytes).sum()
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferPool({} bytes free)", self.free_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_zeroed_and_typed() {
        for len in [0, 1, 4095, 4096, 4097, 3 << 20, (5 << 20) + 3] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.padded().as_ptr() as usize % ALIGN_BYTES, 0);
            assert_eq!(b.capacity_bytes() % ALIGN_BYTES, 0);
            assert!(b.capacity_bytes() >= len && b.padded().iter().all(|&x| x == 0));
            assert_eq!(b.bytes().len(), len);
            if len % 4 == 0 && len > 0 {
                b.as_mut_slice::<f32>()[0] = 1.5;
                assert_eq!(b.as_slice::<f32>()[0], 1.5);
            }
        }
    }

    #[test]
    fn the_pool_reuses_buffers_of_the_same_size_and_never_holds_more_than_the_peak_in_use() {
        let pool = BufferPool::default();
        let (a, b) = (pool.take(3 << 20), pool.take((1 << 20) - 100));
        let b_ptr = b.padded().as_ptr();
        pool.give(a);
        pool.give(b);
        // A free buffer of the same capacity; its padding zeroed, its length the request's.
        let mut c = pool.take((1 << 20) - 3000);
        assert_eq!(c.padded().as_ptr(), b_ptr);
        assert_eq!(c.len_bytes(), (1 << 20) - 3000);
        assert!(c.padded()[(1 << 20) - 3000..].iter().all(|&x| x == 0));
        c.bytes_mut().fill(7);
        pool.give(c);
        assert!(pool.take_zeroed(1 << 20).bytes().iter().all(|&x| x == 0), "take_zeroed zero-fills a reused buffer");
        // Nothing free is big enough: at least as many free bytes are released as are allocated.
        let free_before = pool.free_bytes();
        assert_eq!(free_before, 3 << 20);
        let big = pool.take(4 << 20);
        assert_eq!(big.len_bytes(), 4 << 20);
        assert_eq!(pool.free_bytes(), 0);
    }

    /// Memory lent by another owner: zeroed, every mutable access waits on the owner first (reads do
    /// not), and dropping the buffer drops the owner rather than freeing the memory itself.
    #[test]
    fn host_memory_buffers_wait_before_every_write_and_free_through_their_owner() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        struct Lent {
            memory: Vec<u8>,
            waits: Arc<AtomicUsize>,
            dropped: Arc<AtomicUsize>,
        }
        impl HostMemory for Lent {
            fn before_host_write(&self) {
                self.waits.fetch_add(1, Ordering::SeqCst);
            }
        }
        impl Drop for Lent {
            fn drop(&mut self) {
                self.dropped.fetch_add(1, Ordering::SeqCst);
            }
        }
        let (waits, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut lent = Box::new(Lent { memory: vec![7u8; 3 * ALIGN_BYTES], waits: waits.clone(), dropped: dropped.clone() });
        let at = lent.memory.as_mut_ptr() as usize;
        // SAFETY: a page inside the owner's vector, which lives as long as the owner.
        let ptr = unsafe { lent.memory.as_mut_ptr().add(align_up(at) - at) };
        // SAFETY: page-aligned, with 4096 bytes before the vector's end, kept by `lent`.
        let mut b = unsafe { AlignedBuf::in_host_memory(ptr, 4000, lent) };
        assert!(b.is_in_host_memory() && b.padded().len() == ALIGN_BYTES && b.padded().iter().all(|&x| x == 0));
        let zeroing = waits.load(Ordering::SeqCst);
        assert_eq!(zeroing, 1, "the zeroing is a write");
        b.as_mut_slice::<f32>()[3] = 2.0;
        b.bytes_mut()[0] = 1;
        assert_eq!(waits.load(Ordering::SeqCst), zeroing + 2);
        assert_eq!((b.as_slice::<f32>()[3], b.bytes()[0]), (2.0, 1));
        assert_eq!(waits.load(Ordering::SeqCst), zeroing + 2, "reads do not wait");
        drop(b);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }
}
