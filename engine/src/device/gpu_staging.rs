//! The gpu device's upload ring: host-visible staging buffers, made once and reused, that a large
//! write is copied into on rayon's threads one chunk at a time, each chunk then copied on the device
//! while the host fills the next. wgpu's own `write_buffer_with` allocates fresh staging memory for
//! every write (which the driver must map and pin) and copies only after the whole write is filled: on
//! an H100 it reached 28 GB/s at 64 MiB and 12 GB/s at 256 MiB against a 55 GB/s pinned copy
//! (benches/results/2026-11-26-h100-gpu.md). The buffers are host memory, not charged to the device's
//! byte budget (the planner counts them in host RAM). A child module of `gpu`, so it uses that
//! file's private fields.

use std::cell::{Cell, RefCell};
use std::sync::mpsc::{TryRecvError, channel};

use super::GpuDevice;
use super::memory::{Mapped, fill_in_parallel};
use crate::device::alloc::{GPU_UPLOAD_CHUNK_BYTES, GPU_UPLOAD_RING_MAX_LEN};

/// Buffers the ring starts with, each a chunk of a write (`GPU_UPLOAD_CHUNK_BYTES`). It grows to
/// `GPU_UPLOAD_RING_MAX_LEN` (the planner counts them in host RAM, `AllocCosts::host_staging_bytes`):
/// a buffer whose copy the device has not run yet is waited for only at that size; below it the ring
/// grows instead, since that copy sits behind whatever was submitted before it (a write larger than
/// the ring, made while a block's kernels run, would otherwise hold the host until those kernels end).
const UPLOAD_RING_MIN_LEN: usize = 8;

/// A ring buffer's copy that the device may still be running: the buffer's mapping request and the
/// submission holding the copy.
type InUse = Option<(Mapped, wgpu::SubmissionIndex)>;

/// The ring, made on the first large write (a device that never makes one holds no staging memory).
#[derive(Default)]
pub(super) struct UploadRing {
    slots: RefCell<Vec<(wgpu::Buffer, InUse)>>,
    next: Cell<usize>,
}

impl GpuDevice {
    /// Writes `bytes` into `dst` at `offset` through the ring, ordered after the work submitted before
    /// it and before the work recorded after it (each chunk's copy goes into the device's encoder and
    /// is submitted at once, so that its buffer can be mapped again). Offset and length are whole
    /// 32-bit words, as every copy's must be.
    pub(in crate::device) fn upload_through_ring(&self, dst: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        let align = wgpu::COPY_BUFFER_ALIGNMENT;
        assert!(
            offset.is_multiple_of(align) && (bytes.len() as u64).is_multiple_of(align),
            "a write of {} bytes at byte {offset}: GPU copies move whole multiples of {align} bytes",
            bytes.len()
        );
        let ring = &self.upload_ring;
        for (k, piece) in bytes.chunks(GPU_UPLOAD_CHUNK_BYTES as usize).enumerate() {
            let mut slots = ring.slots.borrow_mut();
            if slots.is_empty() {
                slots.extend((0..UPLOAD_RING_MIN_LEN).map(|_| (self.ring_buffer(), None)));
            }
            // Run the callbacks of mappings already done, then take the next buffer if its copy is
            // done, else a new one while the ring may grow, else wait for it.
            let _ = self.device.poll(wgpu::PollType::Poll);
            let i = ring.next.get() % slots.len();
            if !copy_done(&mut slots[i].1) && slots.len() < GPU_UPLOAD_RING_MAX_LEN {
                slots.insert(i, (self.ring_buffer(), None));
            }
            ring.next.set((i + 1) % slots.len());
            let (buffer, in_use) = &mut slots[i];
            if let Some((mapped, submission)) = in_use.take() {
                self.wait_until_mapped(&mapped, Some(submission), "the upload ring's buffer");
            }
            let len = piece.len() as u64;
            {
                let mut view = buffer.slice(..len).get_mapped_range_mut().expect("the upload ring's buffer is mapped");
                fill_in_parallel(view.slice(..), piece);
            }
            buffer.unmap();
            self.record(|encoder| encoder.copy_buffer_to_buffer(buffer, 0, dst, offset + k as u64 * GPU_UPLOAD_CHUNK_BYTES, len));
            let submission = self.flush().expect("the chunk's copy was recorded");
            let (sender, receiver) = channel();
            buffer.slice(..).map_async(wgpu::MapMode::Write, move |r| {
                let _ = sender.send(r);
            });
            *in_use = Some((receiver, submission));
        }
    }

    /// Staging memory holding `host`, made and filled now, for a copy timed later
    /// (`TransferMethod::Prestaged`, `issue_prestaged_into`); the bytes are host memory, charged to the
    /// budget as a bench's staging is.
    pub fn prestage(&self, host: &[u8]) -> anyhow::Result<Prestaged> {
        let bytes = host.len() as u64;
        if bytes == 0 || !bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
            anyhow::bail!(
                "prestaging {bytes} bytes: must be a positive multiple of {} (wgpu's copy alignment)",
                wgpu::COPY_BUFFER_ALIGNMENT
            );
        }
        let charge = self.budget.charge(bytes, "prestaged upload")?;
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("prestaged upload"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        fill_in_parallel(buffer.slice(..).get_mapped_range_mut().expect("mapped at creation").slice(..), host);
        buffer.unmap();
        Ok(Prestaged { buffer, _charge: charge })
    }

    /// Copies prestaged bytes into the start of `dst` on the device, ordered after the work recorded
    /// before it, and submits the copy without waiting for it.
    pub(in crate::device) fn copy_prestaged(&self, dst: &wgpu::Buffer, staged: &Prestaged) {
        self.record(|encoder| encoder.copy_buffer_to_buffer(&staged.buffer, 0, dst, 0, staged.buffer.size()));
        self.flush();
    }

    /// Buffers in the upload ring (it grows while writes outrun the device's copies).
    pub fn upload_ring_len(&self) -> usize {
        self.upload_ring.slots.borrow().len()
    }

    fn ring_buffer(&self) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("upload ring"),
            size: GPU_UPLOAD_CHUNK_BYTES,
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        })
    }
}

/// Bytes already in staging memory (`GpuDevice::prestage`): a copy's source, filled before the copy.
pub struct Prestaged {
    buffer: wgpu::Buffer,
    _charge: crate::device::alloc::Charge,
}

impl Prestaged {
    pub fn bytes(&self) -> u64 {
        self.buffer.size()
    }
}

/// Whether a ring buffer is free to fill (never used, or mapped again after its copy), without
/// blocking; clears `in_use` when it is.
fn copy_done(in_use: &mut InUse) -> bool {
    let Some((mapped, _)) = in_use else { return true };
    match mapped.try_recv() {
        Ok(result) => {
            result.expect("mapping the upload ring's buffer failed");
            *in_use = None;
            true
        }
        Err(TryRecvError::Empty) => false,
        Err(TryRecvError::Disconnected) => panic!("map callback dropped"),
    }
}
