//! Copies into staging memory the device reads (wgpu's mapped buffers, host staging) on rayon's
//! threads, a piece each: one core's stores do not reach the link's speed.

use rayon::prelude::*;

/// Bytes per rayon task filling mapped staging memory.
const FILL_PIECE_BYTES: usize = 1 << 20;

/// Copies `src` into the start of `dst` (write-only mapped memory) on rayon's threads, a piece each.
pub(super) fn fill_in_parallel(mut dst: wgpu::WriteOnly<'_, [u8]>, src: &[u8]) {
    assert!(src.len() <= dst.len(), "{} bytes into a mapping of {}", src.len(), dst.len());
    // SAFETY: the mapping is at least `src.len()` bytes and `dst` is borrowed mutably while this runs.
    unsafe { fill_raw_in_parallel(dst.as_raw_element_ptr().as_ptr(), src) }
}

/// Copies `src` to `dst` on rayon's threads, a piece each.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes, not overlap `src`, and be written by nothing
/// else while this runs.
pub(super) unsafe fn fill_raw_in_parallel(dst: *mut u8, src: &[u8]) {
    let base = StagingPtr(dst);
    src.par_chunks(FILL_PIECE_BYTES).enumerate().for_each(|(i, piece)| {
        // SAFETY: piece i goes to bytes i * PIECE .. of `dst`, which holds `src.len()` bytes (the
        // caller's promise): in bounds, disjoint between tasks, and only written.
        unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), base.get().add(i * FILL_PIECE_BYTES), piece.len()) }
    });
}

/// The mapping's base pointer, shared by the tasks that each write their own disjoint piece (wgpu's
/// `WriteOnly<[u8]>` is not `Send`, so it cannot be split among them).
#[derive(Clone, Copy)]
struct StagingPtr(*mut u8);
// SAFETY: the tasks write disjoint byte ranges through it, inside the mapping, which outlives them.
unsafe impl Send for StagingPtr {}
unsafe impl Sync for StagingPtr {}

impl StagingPtr {
    /// Through a method, so that closures capture the whole `StagingPtr` (Send), not its field.
    fn get(self) -> *mut u8 {
        self.0
    }
}
