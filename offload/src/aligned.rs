//! Page-aligned host buffers: what O_DIRECT reads and writes need, and what a registered io_uring buffer
//! or a GPU staging copy is fastest from.

use std::alloc::{Layout, alloc_zeroed, dealloc};

/// The alignment and size granularity of every buffer and shard file: one 4 KiB page, which is also
/// the logical block size O_DIRECT requires on every NVMe drive we know of.
pub const ALIGN_BYTES: usize = 4096;

/// Rounds `bytes` up to a whole number of [`ALIGN_BYTES`].
pub fn align_up(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES
}

/// A zero-initialised heap buffer whose address and capacity are multiples of [`ALIGN_BYTES`].
/// `len_bytes` is what the user asked for; the tail up to `capacity_bytes` is padding (zeros).
pub struct AlignedBuf {
    ptr: *mut u8,
    len_bytes: usize,
    capacity_bytes: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len_bytes: usize) -> Self {
        let capacity_bytes = align_up(len_bytes.max(1));
        let layout = Layout::from_size_align(capacity_bytes, ALIGN_BYTES).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len_bytes, capacity_bytes }
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
        // SAFETY: as above, and &mut self gives exclusive access.
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
        let layout = Layout::from_size_align(self.capacity_bytes, ALIGN_BYTES).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { dealloc(self.ptr, layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes, {} capacity)", self.len_bytes, self.capacity_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_zeroed_and_typed() {
        for len in [0, 1, 4095, 4096, 4097, 3 << 20] {
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
}
