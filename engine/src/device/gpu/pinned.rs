//! Pinned host memory: buffers the device's copy engine reads or writes by itself
//! (`create_host_buffer`, cached), mapped for good.
//!
//! - **Working copies.** Handed to the trainer as [`AlignedBuf`]s for the working copies it keeps in
//!   RAM (and a streamed output projection's copy kept for the step). The AdamW thread writes each new
//!   working copy straight into them, and an upload from one is a single device copy across the link:
//!   no host copy into staging first (issue #22 item 4; PyTorch's pinned memory). Every upload is
//!   checked against the registered regions at one place, [`GpuDevice::upload`]; a write the host makes
//!   to a region waits for the device's copies from it first ([`HostMemory::before_host_write`], the
//!   buffer's only mutable access), so a copy never reads words the host is rewriting.
//! - **Read-backs** ([`ReadBack::Pinned`], where `zerostream tune` found it faster): the device copies
//!   gradients into such a buffer and the host reads them there once the copy's submission is done,
//!   without wgpu's `map_async` round trip (`gpu/memory.rs` reads them).
//!
//! A child module of `gpu`, so it uses that file's private fields.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use zerostream_offload::aligned::align_up;
use zerostream_offload::{ALIGN_BYTES, AlignedBuf, HostMemory};

use super::GpuDevice;
use super::host_staging::HostReads;
use crate::device::{PinRefused, ReadBack};

/// Uploads smaller than this go through `write_buffer` as before (copied at once, no submission of
/// their own), even from pinned memory: a submission per layer-norm weight would cost more than it
/// saves. The default of [`GpuDevice::set_pinned_copy_min_bytes`].
pub const PINNED_COPY_MIN_BYTES: usize = 1 << 20;

/// One pinned buffer: its wgpu copy source, where the [`AlignedBuf`]'s bytes start in it, and the
/// last submission that copies from it.
struct PinnedRegion {
    buffer: wgpu::Buffer,
    /// The buffer's offset of the page-aligned start the host uses (the mapping need not be aligned).
    start_in_buffer: u64,
    /// The host address of that start, and the bytes from there.
    start: usize,
    len: usize,
    copying: Mutex<Option<Copying>>,
    device: wgpu::Device,
}

/// The last copy out of a pinned region: a submission of wgpu's queue, or a copy queue's.
enum Copying {
    Wgpu(wgpu::SubmissionIndex),
    CopyQueue(Arc<super::copy_route::Timelines>, u64),
}

impl PinnedRegion {
    /// Blocks until the device's copies from the region are done.
    fn wait_for_copies(&self) {
        let pending = self.copying.lock().unwrap_or_else(|e| e.into_inner()).take();
        // A lost device reads nothing more, so the host may write; the device thread reports the
        // loss at its next wait (not this thread, which holds the group's lock).
        match pending {
            Some(Copying::Wgpu(submission)) => {
                let _ = GpuDevice::wait_for_submission(&self.device, Some(submission));
            }
            Some(Copying::CopyQueue(timelines, value)) => {
                let _ = timelines.wait_for_copy(value);
            }
            None => {}
        }
    }
}

/// What an [`AlignedBuf`] holds to keep its region alive (the registry holds it weakly).
struct Pinned(Arc<PinnedRegion>);

impl HostMemory for Pinned {
    fn before_host_write(&self) {
        self.0.wait_for_copies();
    }
}

/// The device's pinned regions by host start address, held weakly: a region lives as long as its
/// buffer, and one whose buffer is gone is skipped (and pruned at the next registration).
#[derive(Default)]
pub(super) struct PinnedRegions {
    by_start: RefCell<BTreeMap<usize, Weak<PinnedRegion>>>,
    /// Bytes uploaded by copies straight from pinned regions so far.
    copied_bytes: Cell<u64>,
    /// The smallest upload copied from a pinned region.
    min_bytes: Cell<Option<usize>>,
    /// Where read-backs land ([`GpuDevice::set_read_back`]), whether a pinned one was refused since,
    /// and the bytes read through pinned memory so far.
    read_back: Cell<ReadBack>,
    read_back_refused: Cell<bool>,
    read_bytes: Cell<u64>,
}

impl GpuDevice {
    /// A zeroed buffer of `len_bytes` in host memory this device copies from directly (see the module
    /// doc), or why the adapter made none.
    pub fn alloc_pinned(&self, len_bytes: usize) -> Result<AlignedBuf, PinRefused> {
        let len = align_up(len_bytes.max(1));
        // A page more than asked, so that the host's part starts on a page whatever the mapping's
        // alignment.
        let bytes = (len + ALIGN_BYTES) as u64;
        let max = self.device.limits().max_buffer_size;
        if bytes > max {
            return Err(PinRefused::TooLarge(format!("{bytes} bytes is more than this adapter's largest buffer ({max} bytes)")));
        }
        let (buffer, mapped) = self.create_host_buffer(bytes, "pinned working copy", HostReads::Often).map_err(PinRefused::Unavailable)?;
        let start = (mapped as usize).next_multiple_of(ALIGN_BYTES);
        let start_in_buffer = (start - mapped as usize) as u64;
        let region = Arc::new(PinnedRegion { buffer, start_in_buffer, start, len, copying: Mutex::new(None), device: self.device.clone() });
        let mut regions = self.pinned.by_start.borrow_mut();
        regions.retain(|_, r| r.strong_count() > 0);
        regions.insert(start, Arc::downgrade(&region));
        // SAFETY: `start` is page-aligned with `len` bytes of the mapping after it (a page was added),
        // mapped for as long as the buffer lives, which the region (kept by the AlignedBuf) holds; the
        // device only reads it, after `before_host_write` has let the host's writes finish.
        Ok(unsafe { AlignedBuf::in_host_memory(start as *mut u8, len_bytes, Box::new(Pinned(region))) })
    }

    /// Records and submits a device copy of `bytes` into `dst` at `offset`, after the work recorded
    /// before it, where `bytes` lie in a pinned region (whole 32-bit words, as copies move, and at least
    /// [`PINNED_COPY_MIN_BYTES`]); false (nothing done) where they do not. On the copy queue where a
    /// route is set and `dst` is ready for raw copies (`gpu/copy_route.rs`), else on wgpu's queue.
    pub(in crate::device) fn copy_from_pinned(&self, dst: &wgpu::Buffer, dst_ready_for_copies: bool, offset: u64, bytes: &[u8]) -> bool {
        if bytes.len() < self.pinned.min_bytes.get().unwrap_or(PINNED_COPY_MIN_BYTES) {
            return false;
        }
        let at = bytes.as_ptr() as usize;
        let region = {
            let regions = self.pinned.by_start.borrow();
            let Some((_, region)) = regions.range(..=at).next_back() else { return false };
            let Some(region) = region.upgrade() else { return false };
            region
        };
        if at + bytes.len() > region.start + region.len {
            return false;
        }
        let src = region.start_in_buffer + (at - region.start) as u64;
        let align = wgpu::COPY_BUFFER_ALIGNMENT;
        if !(src.is_multiple_of(align) && offset.is_multiple_of(align) && (bytes.len() as u64).is_multiple_of(align)) {
            return false;
        }
        self.flush();
        let copying = match self.route().filter(|_| dst_ready_for_copies) {
            Some(route) => {
                let copy = super::copy_queue::BufferCopy {
                    src: &region.buffer,
                    src_offset: src,
                    dst,
                    dst_offset: offset,
                    size: bytes.len() as u64,
                };
                let value = route
                    .copy(&self.copy_queues[route.queue], &[copy])
                    .unwrap_or_else(|e| panic!("GPU copy queue failed on an upload: {e:#}"));
                route.up_bytes.set(route.up_bytes.get() + bytes.len() as u64);
                Copying::CopyQueue(route.timelines(), value)
            }
            None => {
                self.track_uses(&[&region.buffer, dst]);
                self.record(|encoder| encoder.copy_buffer_to_buffer(&region.buffer, src, dst, offset, bytes.len() as u64));
                Copying::Wgpu(self.flush().expect("the copy was recorded"))
            }
        };
        *region.copying.lock().unwrap_or_else(|e| e.into_inner()) = Some(copying);
        self.pinned.copied_bytes.set(self.pinned.copied_bytes.get() + bytes.len() as u64);
        true
    }

    /// Copies from pinned memory only for uploads of at least `bytes` ([`PINNED_COPY_MIN_BYTES`] until
    /// set); smaller ones go through `write_buffer`. For tests whose tensors are all small.
    pub fn set_pinned_copy_min_bytes(&self, bytes: usize) {
        self.pinned.min_bytes.set(Some(bytes));
    }

    /// Bytes uploaded straight from pinned host memory so far (the rest went through staging).
    pub fn pinned_upload_bytes(&self) -> u64 {
        self.pinned.copied_bytes.get()
    }

    /// A buffer of `bytes` in pinned (cached) host memory the device copies into, mapped for its
    /// lifetime at the pointer returned, or why the adapter made none: a download read where it lands
    /// once the copy's submission is done, without wgpu's `map_async` round trip ([`ReadBack::Pinned`],
    /// `bench d2h`'s `Pinned` row). The host may read it only after waiting for every copy into it.
    pub(in crate::device) fn pinned_read_back(&self, bytes: u64) -> Result<(wgpu::Buffer, *const u8), String> {
        let (buffer, ptr) = self.create_host_buffer(bytes, "pinned read-back", HostReads::Often)?;
        Ok((buffer, ptr.cast_const()))
    }

    /// Why this adapter cannot land read-backs in pinned host memory (one buffer made and dropped to
    /// find out: cached host memory, which a discrete GPU may offer only as BAR VRAM), or None.
    pub fn pinned_read_back_unavailable(&self) -> Option<String> {
        self.pinned_read_back(wgpu::COPY_BUFFER_ALIGNMENT).err()
    }

    /// Lands read-backs in `kind` of memory from now on (kept buffers of the other kind are dropped).
    /// Refused, naming why, where the adapter cannot make pinned read-back buffers.
    pub fn set_read_back(&self, kind: ReadBack) -> anyhow::Result<()> {
        if kind == ReadBack::Pinned
            && let Some(why) = self.pinned_read_back_unavailable()
        {
            anyhow::bail!("read-backs into pinned host memory are not available on {}: {why}", self.summary.name);
        }
        self.pinned.read_back.set(kind);
        self.pinned.read_back_refused.set(false);
        if let Some(route) = self.route() {
            route.keep_read_back();
        }
        self.spare_staging.borrow_mut().retain(|s| s.kind() == kind);
        Ok(())
    }

    /// Where read-backs land now.
    pub fn read_back(&self) -> ReadBack {
        self.pinned.read_back.get()
    }

    /// Bytes read back through pinned host memory so far (the rest through mapped buffers).
    pub fn pinned_read_bytes(&self) -> u64 {
        self.pinned.read_bytes.get()
    }

    /// A read-back buffer of `bytes` of the kind in use, made afresh; a mapped one where a pinned one
    /// was refused (said once, until the kind is set again).
    pub(super) fn new_read_staging(&self, bytes: u64) -> ReadStaging {
        if self.read_back() == ReadBack::Pinned && !self.pinned.read_back_refused.get() {
            match self.pinned_read_back(bytes) {
                Ok((buffer, ptr)) => return ReadStaging::Pinned(PinnedRead { buffer, ptr }),
                Err(why) => {
                    eprintln!(
                        "warning: a read-back buffer of {bytes} bytes in pinned host memory was refused ({why}); reading through mapped buffers"
                    );
                    self.pinned.read_back_refused.set(true);
                }
            }
        }
        ReadStaging::Mapped(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read-back"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    /// Counts `bytes` read through pinned host memory.
    pub(super) fn count_pinned_read(&self, bytes: u64) {
        self.pinned.read_bytes.set(self.pinned.read_bytes.get() + bytes);
    }
}

/// A read-back buffer in pinned host memory: its wgpu copy destination and where the host reads it.
pub(super) struct PinnedRead {
    pub(super) buffer: wgpu::Buffer,
    pub(super) ptr: *const u8,
}

/// Where one read-back's copies land ([`ReadBack`]).
pub(super) enum ReadStaging {
    Mapped(wgpu::Buffer),
    Pinned(PinnedRead),
}

impl ReadStaging {
    /// The buffer, where it is pinned memory (a copy queue may write it).
    pub(super) fn pinned_buffer(&self) -> Option<&wgpu::Buffer> {
        match self {
            ReadStaging::Pinned(PinnedRead { buffer, .. }) => Some(buffer),
            ReadStaging::Mapped(_) => None,
        }
    }

    pub(super) fn buffer(&self) -> &wgpu::Buffer {
        match self {
            ReadStaging::Mapped(buffer) | ReadStaging::Pinned(PinnedRead { buffer, .. }) => buffer,
        }
    }

    pub(super) fn kind(&self) -> ReadBack {
        match self {
            ReadStaging::Mapped(_) => ReadBack::Mapped,
            ReadStaging::Pinned(_) => ReadBack::Pinned,
        }
    }
}
