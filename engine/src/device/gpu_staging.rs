//! The gpu device's upload ring: a few host-visible staging buffers, created once, that a large write
//! is copied into on rayon's threads one chunk at a time, each chunk then copied on the device while
//! the host fills the next. wgpu's own `write_buffer_with` allocates fresh staging memory for every
//! write (which the driver must map and pin) and copies only after the whole write is filled: on an
//! H100 it reached 28 GB/s at 64 MiB and 12 GB/s at 256 MiB against a 55 GB/s pinned copy
//! (benches/results/2026-11-26-h100-gpu.md). A child module of `gpu`, so it uses that file's private
//! fields.

use std::cell::{Cell, RefCell};
use std::sync::mpsc::{Receiver, TryRecvError, channel};

use super::GpuDevice;
use super::memory::fill_in_parallel;

/// Bytes a ring buffer holds: a chunk of a write.
pub(super) const UPLOAD_CHUNK_BYTES: u64 = 8 << 20;
/// Ring buffers: chunks the device may still be copying while the host fills another.
pub(super) const UPLOAD_RING_LEN: usize = 8;

type Mapped = Receiver<Result<(), wgpu::BufferAsyncError>>;
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
    /// Writes `bytes` into `dst` at `offset` through the ring, ordered after the work recorded before
    /// it and before the work recorded after it (each chunk's copy goes into the device's encoder and
    /// is submitted at once, so that its buffer can be mapped again).
    pub(in crate::device) fn upload_through_ring(&self, dst: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        let ring = &self.upload_ring;
        for (k, piece) in bytes.chunks(UPLOAD_CHUNK_BYTES as usize).enumerate() {
            let i = ring.next.get();
            ring.next.set((i + 1) % UPLOAD_RING_LEN);
            let mut slots = ring.slots.borrow_mut();
            if slots.is_empty() {
                slots.extend((0..UPLOAD_RING_LEN).map(|_| {
                    let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("upload ring"),
                        size: UPLOAD_CHUNK_BYTES,
                        usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                        mapped_at_creation: true,
                    });
                    (buffer, None)
                }));
            }
            let (buffer, in_use) = &mut slots[i];
            if let Some((mapped, submission)) = in_use.take() {
                self.wait_mapped_for_upload(&mapped, submission);
            }
            let len = piece.len() as u64;
            {
                let mut view = buffer.slice(..len).get_mapped_range_mut().expect("the upload ring's buffer is mapped");
                fill_in_parallel(view.slice(..), piece);
            }
            buffer.unmap();
            {
                let mut slot = self.encoder.borrow_mut();
                let encoder = slot.get_or_insert_with(|| self.device.create_command_encoder(&Default::default()));
                encoder.copy_buffer_to_buffer(buffer, 0, dst, offset + k as u64 * UPLOAD_CHUNK_BYTES, len);
            }
            let submission = self.flush().expect("the chunk's copy was recorded");
            let (sender, receiver) = channel();
            buffer.slice(..).map_async(wgpu::MapMode::Write, move |r| {
                let _ = sender.send(r);
            });
            *in_use = Some((receiver, submission));
        }
    }

    /// Waits until a ring buffer is mapped again: for the submission holding its copy (and those
    /// before it), not for later work.
    fn wait_mapped_for_upload(&self, mapped: &Mapped, submission: wgpu::SubmissionIndex) {
        loop {
            match mapped.try_recv() {
                Ok(result) => return result.expect("mapping the upload ring's buffer failed"),
                Err(TryRecvError::Empty) => {
                    self.device
                        .poll(wgpu::PollType::Wait { submission_index: Some(submission.clone()), timeout: None })
                        .expect("GPU device lost while uploading");
                }
                Err(TryRecvError::Disconnected) => panic!("map callback dropped"),
            }
        }
    }
}
