//! The gpu device's upload ring: staging buffers, made once and reused, that a large
//! write is copied into on rayon's threads one chunk at a time, each chunk then copied on the device
//! while the host fills the next. wgpu's own `write_buffer_with` allocates fresh staging memory for
//! every write (which the driver must map and pin) and copies only after the whole write is filled: on
//! an H100 it reached 28 GB/s at 64 MiB and 12 GB/s at 256 MiB against a 55 GB/s pinned copy
//! (benches/results/2026-11-26-h100-gpu.md). The buffers are wgpu's mappable ones or host memory the
//! device reads (`UploadStaging`, `gpu/host_staging.rs`; `zerostream tune` keeps the faster), not
//! charged to the device's byte budget (the planner counts them in host RAM). A child module of
//! `gpu`, so it uses that file's private fields.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{TryRecvError, channel};

use anyhow::{Result, bail};

use super::GpuDevice;
use super::fill::fill_in_parallel;
use super::host_staging::HostStaging;
use super::memory::Mapped;
use crate::device::UploadStaging;
use crate::device::alloc::{GPU_UPLOAD_CHUNK_BYTES, GPU_UPLOAD_RING_MAX_LEN};

/// Buffers the ring starts with, each a chunk of a write (`GPU_UPLOAD_CHUNK_BYTES`). It grows to
/// `GPU_UPLOAD_RING_MAX_LEN` (the planner counts them in host RAM, `AllocCosts::host_staging_bytes`):
/// a buffer whose copy the device has not run yet is waited for only at that size; below it the ring
/// grows instead, since that copy sits behind whatever was submitted before it (a write larger than
/// the ring, made while a block's kernels run, would otherwise hold the host until those kernels end).
const UPLOAD_RING_MIN_LEN: usize = 8;

/// A ring buffer: wgpu's mappable buffer, or host memory mapped for good ([`UploadStaging`]).
enum Staging {
    Mapped(wgpu::Buffer),
    Host(HostStaging),
}

impl Staging {
    fn buffer(&self) -> &wgpu::Buffer {
        match self {
            Staging::Mapped(b) => b,
            Staging::Host(h) => &h.buffer,
        }
    }
}

/// A ring buffer's copy that the device may still be running, and the submission holding it: a mapped
/// buffer's mapping request (granted once the copy is done), or, for host memory, a flag the queue
/// sets when the work submitted with the copy is done.
enum InUse {
    Mapping(Mapped, wgpu::SubmissionIndex),
    Copying(Arc<AtomicBool>, wgpu::SubmissionIndex),
}

struct Slot {
    staging: Staging,
    in_use: Option<InUse>,
}

/// The ring, made on the first large write (a device that never makes one holds no staging memory),
/// of the kind [`GpuDevice::set_upload_staging`] chose.
#[derive(Default)]
pub(super) struct UploadRing {
    slots: RefCell<Vec<Slot>>,
    next: Cell<usize>,
    /// Set by `set_upload_staging`.
    kind: Cell<UploadStaging>,
    /// A host buffer was refused since: new buffers are mapped ones (warned once), the ring's own kept.
    host_refused: Cell<bool>,
}

impl GpuDevice {
    /// Stages the upload ring's writes in `kind` of memory from now on (the ring is emptied, after the
    /// device's copies from it are done). Refused, naming why, where the adapter cannot make it.
    pub fn set_upload_staging(&self, kind: UploadStaging) -> Result<()> {
        if kind == UploadStaging::Host
            && let Some(why) = self.host_staging_unavailable()
        {
            bail!("upload staging in host memory is not available on {}: {why}", self.summary.name);
        }
        let mut slots = self.upload_ring.slots.borrow_mut();
        for slot in slots.iter_mut() {
            self.wait_for_copy(slot);
        }
        slots.clear();
        self.upload_ring.kind.set(kind);
        self.upload_ring.host_refused.set(false);
        Ok(())
    }

    /// Why the upload ring cannot stage in host memory on this adapter (one buffer made and dropped to
    /// find out), or None when it can.
    pub fn host_staging_unavailable(&self) -> Option<String> {
        HostStaging::new(self, GPU_UPLOAD_CHUNK_BYTES).err()
    }

    /// Where the upload ring stages writes now.
    pub fn upload_staging(&self) -> UploadStaging {
        self.upload_ring.kind.get()
    }

    /// Writes `bytes` into `dst` at `offset` through the ring, ordered after the work submitted before
    /// it and before the work recorded after it (each chunk's copy goes into the device's encoder and
    /// is submitted at once, so that its buffer can be filled again once the copy is done). Offset and
    /// length are whole 32-bit words, as every copy's must be.
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
                slots.extend((0..UPLOAD_RING_MIN_LEN).map(|_| self.ring_slot()));
            }
            // Run the callbacks of copies already done, then take the next buffer if its copy is
            // done, else a new one while the ring may grow, else wait for it.
            let _ = self.device.poll(wgpu::PollType::Poll);
            let i = ring.next.get() % slots.len();
            if !copy_done(&mut slots[i].in_use) && slots.len() < GPU_UPLOAD_RING_MAX_LEN {
                slots.insert(i, self.ring_slot());
            }
            ring.next.set((i + 1) % slots.len());
            let slot = &mut slots[i];
            self.wait_for_copy(slot);
            let len = piece.len() as u64;
            match &mut slot.staging {
                Staging::Mapped(buffer) => {
                    {
                        let mut view = buffer.slice(..len).get_mapped_range_mut().expect("the upload ring's buffer is mapped");
                        fill_in_parallel(view.slice(..), piece);
                    }
                    buffer.unmap();
                }
                Staging::Host(host) => host.fill(piece),
            }
            let buffer = slot.staging.buffer();
            self.track_uses(&[buffer, dst]);
            self.record(|encoder| encoder.copy_buffer_to_buffer(buffer, 0, dst, offset + k as u64 * GPU_UPLOAD_CHUNK_BYTES, len));
            let submission = self.flush().expect("the chunk's copy was recorded");
            slot.in_use = Some(match &slot.staging {
                Staging::Mapped(buffer) => {
                    let (sender, receiver) = channel();
                    buffer.slice(..).map_async(wgpu::MapMode::Write, move |r| {
                        let _ = sender.send(r);
                    });
                    InUse::Mapping(receiver, submission)
                }
                Staging::Host(_) => {
                    let done = Arc::new(AtomicBool::new(false));
                    let flag = done.clone();
                    self.queue.on_submitted_work_done(move || flag.store(true, Ordering::Release));
                    InUse::Copying(done, submission)
                }
            });
        }
    }

    /// Blocks until the device's copy from `slot` (if any) is done, and marks the slot free.
    fn wait_for_copy(&self, slot: &mut Slot) {
        match slot.in_use.take() {
            None => {}
            Some(InUse::Mapping(mapped, submission)) => self.wait_until_mapped(&mapped, Some(submission), "the upload ring's buffer"),
            Some(InUse::Copying(done, submission)) => {
                while !done.load(Ordering::Acquire) {
                    Self::wait_for_submission(&self.device, Some(submission.clone()))
                        .unwrap_or_else(|e| panic!("waiting for the upload ring: {e:#}"));
                }
            }
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
        self.track_uses(&[&staged.buffer, dst]);
        self.record(|encoder| encoder.copy_buffer_to_buffer(&staged.buffer, 0, dst, 0, staged.buffer.size()));
        self.flush();
    }

    /// Buffers in the upload ring (it grows while writes outrun the device's copies).
    pub fn upload_ring_len(&self) -> usize {
        self.upload_ring.slots.borrow().len()
    }

    /// A new ring buffer of the ring's kind. A host buffer the adapter refuses now (the kind was
    /// checked when set, but the ring grows to 64 buffers, 512 MiB of host memory) is a mapped one
    /// instead, with a warning, and the ring grows with mapped ones until its kind is set again (no
    /// refused try per new buffer): the bytes arrive the same either way.
    fn ring_slot(&self) -> Slot {
        let mapped = || {
            Staging::Mapped(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("upload ring"),
                size: GPU_UPLOAD_CHUNK_BYTES,
                usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            }))
        };
        let ring = &self.upload_ring;
        let staging = match ring.kind.get() {
            UploadStaging::Host if !ring.host_refused.get() => match HostStaging::new(self, GPU_UPLOAD_CHUNK_BYTES) {
                Ok(host) => Staging::Host(host),
                Err(why) => {
                    eprintln!(
                        "warning: an upload ring buffer in host memory was refused ({why}); the ring grows with mapped ones from now on"
                    );
                    ring.host_refused.set(true);
                    mapped()
                }
            },
            _ => mapped(),
        };
        Slot { staging, in_use: None }
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

/// Whether a ring buffer is free to fill (never used, or its copy done), without blocking; clears
/// `in_use` when it is.
fn copy_done(in_use: &mut Option<InUse>) -> bool {
    let done = match in_use {
        None => return true,
        Some(InUse::Copying(done, _)) => done.load(Ordering::Acquire),
        Some(InUse::Mapping(mapped, _)) => match mapped.try_recv() {
            Ok(result) => {
                result.expect("mapping the upload ring's buffer failed");
                true
            }
            Err(TryRecvError::Empty) => false,
            Err(TryRecvError::Disconnected) => panic!("map callback dropped"),
        },
    };
    if done {
        *in_use = None;
    }
    done
}
