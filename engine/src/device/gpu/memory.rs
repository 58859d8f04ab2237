//! The gpu device's memory: creating tensors (each charged to the byte budget), writing them (large
//! writes through the upload ring, filled on rayon's threads: one core's memcpy is far below a PCIe
//! link) and reading them back (copies into one staging buffer per read, reused for the next read of
//! its size; the values widened straight from the mapping into vectors the trainer hands back, or f32
//! tensors lent out of the mapping itself to `finish_read_with`, which adds gradients into the
//! accumulator with no host copy between). A child module of `gpu`, so it uses that file's private
//! fields.

use std::sync::mpsc::{Receiver, TryRecvError};

use anyhow::{Result, bail};

use super::fill::fill_in_parallel;
use super::pinned::ReadStaging;
use super::{GpuDevice, GpuTensor};
use crate::device::{AllocCosts, HalfFormat};

/// A staging buffer's mapping request: its callback's result.
pub(super) type Mapped = Receiver<Result<(), wgpu::BufferAsyncError>>;

/// Below this an upload is one `write_buffer` (threads and a submission would cost more than they save).
const RING_UPLOAD_MIN_BYTES: usize = 1 << 20;

// `write_halves` uploads 16-bit values as they lie in memory, which is the device's packing only on a
// little-endian host (every target zerostream builds for).
const _: () = assert!(cfg!(target_endian = "little"), "zerostream's gpu device assumes a little-endian host");

/// A read-back in flight: the staging buffer its copies were submitted into, the submission, and the
/// pieces (bytes, format and length of each tensor).
pub struct GpuPendingRead {
    pub(super) staging: Option<ReadStaging>,
    pub(super) sizes: Vec<u64>,
    pub(super) formats: Vec<(Option<HalfFormat>, usize)>,
    pub(super) mapped: Option<Mapped>,
    pub(super) submission: Option<wgpu::SubmissionIndex>,
    /// Where the copies ran on a copy queue: its timelines and the value that says they are done.
    pub(super) copy: Option<(std::sync::Arc<super::copy_route::Timelines>, u64)>,
}

impl GpuDevice {
    /// Writes `bytes` into `dst` at `offset`, ordered after the work recorded before it (submitted
    /// first) and before the work recorded after it: bytes in pinned host memory by one device copy
    /// from there (`gpu/pinned.rs`), other large writes through the upload ring (`gpu/staging.rs`),
    /// small ones through `write_buffer`, which lands before the next submission.
    pub(in crate::device) fn upload(&self, t: &GpuTensor, offset: u64, bytes: &[u8]) {
        let dst = &t.buffer;
        self.flush();
        if self.copy_from_pinned(dst, t.ready_for_copies, offset, bytes) {
            return;
        }
        self.track_uses(&[dst]);
        if bytes.len() >= RING_UPLOAD_MIN_BYTES {
            self.upload_through_ring(dst, offset, bytes);
        } else {
            self.queue.write_buffer(dst, offset, bytes);
        }
    }

    /// The write path before the ring, for `bench h2d`'s comparison: wgpu's staging memory for the
    /// whole write (`write_buffer_with`), filled on rayon's threads, copied at the next submission.
    pub(in crate::device) fn upload_via_wgpu_staging(&self, dst: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        let size = wgpu::BufferSize::new(bytes.len() as u64);
        let Some(mut view) = size.and_then(|size| self.queue.write_buffer_with(dst, offset, size)) else {
            // Empty, or refused by validation (which `write_buffer` then reports as wgpu does).
            self.queue.write_buffer(dst, offset, bytes);
            return;
        };
        fill_in_parallel(view.slice(..), bytes);
    }

    pub(super) fn create_tensor(&self, len: usize, label: &str, usage: wgpu::BufferUsages) -> Result<GpuTensor> {
        self.create_formatted(len, None, label, usage)
    }

    pub(super) fn create_formatted(
        &self,
        len: usize,
        format: Option<HalfFormat>,
        label: &str,
        usage: wgpu::BufferUsages,
    ) -> Result<GpuTensor> {
        let bytes = if format.is_some() { AllocCosts::GPU.tensor_16bit_bytes(len) } else { AllocCosts::GPU.tensor_bytes(len) };
        let max = self.device.limits().max_buffer_size;
        if bytes > max {
            bail!("tensor {label} needs {bytes} bytes, more than this adapter's largest buffer ({max} bytes)");
        }
        let charge = self.budget.charge(bytes, label)?;
        let buffer =
            self.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size: bytes, usage, mapped_at_creation: false });
        // Under a copy route the zeros wgpu would write before the buffer's first use on its queue
        // are written now, so that a raw copy into it is never followed by them.
        let ready_for_copies = self.route().is_some() && usage.contains(wgpu::BufferUsages::COPY_DST);
        if ready_for_copies {
            self.record(|encoder| encoder.clear_buffer(&buffer, 0, None));
            self.track_uses(&[&buffer]);
        }
        Ok(GpuTensor { buffer, len, format, ready_for_copies, _charge: charge })
    }

    pub(super) fn storage_tensor(&self, len: usize, label: &str) -> Result<GpuTensor> {
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        // wgpu zero-fills a buffer before its first use on its queue, so a new tensor reads as zeros
        // there (raw copies on a copy queue would not see that fill: see `create_tensor`).
        self.create_tensor(len, label, usage)
    }

    /// Uploads raw 32-bit words (token ids, packed halves).
    pub fn upload_words(&self, words: &[u32], label: &str) -> Result<GpuTensor> {
        let t = self.storage_tensor(words.len(), label)?;
        self.write_words(&t, words);
        Ok(t)
    }

    pub fn write_words(&self, t: &GpuTensor, words: &[u32]) {
        if !words.is_empty() {
            self.upload(t, 0, bytemuck::cast_slice(words));
        }
    }

    /// Writes 16-bit values into `t`'s words, two per word, low half first (little-endian `bits` already
    /// are that layout, so they are uploaded as they lie; an odd last value goes in a word of its own).
    pub(super) fn write_halves(&self, t: &GpuTensor, bits: &[u16]) {
        if bits.is_empty() {
            return;
        }
        let pairs_bytes = bits.len() / 2 * 4;
        self.flush(); // for the odd last word's `write_buffer` (`upload` submits first itself)
        if pairs_bytes > 0 {
            self.upload(t, 0, &bytemuck::cast_slice(bits)[..pairs_bytes]);
        }
        if bits.len() % 2 == 1 {
            let last = bits[bits.len() - 1] as u32;
            self.track_uses(&[&t.buffer]);
            self.queue.write_buffer(&t.buffer, pairs_bytes as u64, bytemuck::bytes_of(&last));
        }
    }

    /// Reads raw 32-bit words back.
    pub fn read_words(&self, t: &GpuTensor) -> Vec<u32> {
        self.read_words_many(&[t]).pop().expect("one tensor read")
    }

    /// Reads several tensors' words back through one staging buffer: one submission and one wait for
    /// all of them (a block's twelve gradients cost one round trip, not twelve).
    pub fn read_words_many(&self, tensors: &[&GpuTensor]) -> Vec<Vec<u32>> {
        self.finish_read_words(self.begin_read_words(tensors))
    }

    /// Records copies of `tensors` into one staging buffer, submits them and asks for the mapping.
    pub(super) fn begin_read_words(&self, tensors: &[&GpuTensor]) -> GpuPendingRead {
        let sizes: Vec<u64> = tensors.iter().map(|t| (t.words() * 4) as u64).collect();
        let formats = tensors.iter().map(|t| (t.format, t.len)).collect();
        let total: u64 = sizes.iter().sum();
        if total == 0 {
            return GpuPendingRead { staging: None, sizes, formats, mapped: None, submission: None, copy: None };
        }
        self.largest_read_bytes.set(self.largest_read_bytes.get().max(total));
        let spare = {
            let mut spares = self.spare_staging.borrow_mut();
            let kind = self.read_back();
            spares.iter().position(|s| s.buffer().size() == total && s.kind() == kind).map(|i| spares.swap_remove(i))
        };
        let staging = spare.unwrap_or_else(|| self.new_read_staging(total));
        if let Some(pending) = self.read_on_copy_queue(tensors, &sizes, staging.pinned_buffer()) {
            return GpuPendingRead { staging: Some(staging), sizes, formats, mapped: None, submission: None, copy: Some(pending) };
        }
        self.track_uses(&tensors.iter().map(|t| &t.buffer).chain([staging.buffer()]).collect::<Vec<_>>());
        self.record(|encoder| {
            let mut offset = 0;
            for (t, &bytes) in tensors.iter().zip(&sizes) {
                if bytes > 0 {
                    encoder.copy_buffer_to_buffer(&t.buffer, 0, staging.buffer(), offset, bytes);
                }
                offset += bytes;
            }
        });
        let submission = self.flush();
        // A mapped buffer asks for its mapping now; pinned memory is read once the submission is done.
        let mapped = match &staging {
            ReadStaging::Mapped(buffer) => {
                let (sender, receiver) = std::sync::mpsc::channel();
                buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                    let _ = sender.send(r);
                });
                Some(receiver)
            }
            ReadStaging::Pinned(_) => None,
        };
        GpuPendingRead { staging: Some(staging), sizes, formats, mapped, submission, copy: None }
    }

    /// Waits for the submission holding the copies (not for work submitted after it) and copies out.
    pub(super) fn finish_read_words(&self, pending: GpuPendingRead) -> Vec<Vec<u32>> {
        self.with_mapped(pending, |words| words.iter().map(|w| w.to_vec()).collect())
    }

    /// Waits for a read started by [`Self::begin_read_words`] and gives `f` each tensor's words, straight
    /// from the mapped staging buffer; the buffer is kept for the next read of its size.
    pub(super) fn with_mapped<R>(&self, pending: GpuPendingRead, f: impl FnOnce(&[&[u32]]) -> R) -> R {
        let Some(staging) = pending.staging else {
            return f(&vec![&[][..]; pending.sizes.len()]);
        };
        // What was recorded since the read began (the trainer records block l's backward before it
        // finishes block l + 1's download) goes to the device before the host blocks, so the device
        // runs it while the host waits and then adds the gradient, rather than idling until the next read.
        self.flush();
        let sizes = &pending.sizes;
        let out = match &staging {
            ReadStaging::Mapped(buffer) => {
                let mapped = pending.mapped.expect("a mapped read-back asked for its mapping");
                self.wait_until_mapped(&mapped, pending.submission, "a read-back buffer");
                let view = buffer.slice(..).get_mapped_range().expect("mapped range");
                let out = f(&split_words(bytemuck::cast_slice::<u8, u32>(&view), sizes));
                drop(view);
                buffer.unmap();
                out
            }
            ReadStaging::Pinned(pinned) => {
                match &pending.copy {
                    Some((timelines, value)) => {
                        timelines.wait_for_copy(*value).unwrap_or_else(|e| panic!("GPU device lost while waiting for a read-back: {e:#}"))
                    }
                    None => Self::wait_for_submission(&self.device, pending.submission)
                        .unwrap_or_else(|e| panic!("waiting for a read-back: {e:#}")),
                }
                let bytes = staging.buffer().size();
                self.count_pinned_read(bytes);
                // SAFETY: the mapping holds the buffer's `bytes` (made so, live while `staging` is) at
                // an address aligned for words (Vulkan maps at its minimum map alignment, 64 bytes or
                // more); the copies into it are done (their submission waited for) and no other copy
                // into it is recorded until it is handed out again. The memory is host-coherent and
                // the copies' submission is done. Vulkan asks for a transfer-to-host barrier besides
                // (wgpu records one only for the buffers it maps); drivers of coherent memory make the
                // writes visible by the fence alone (NVIDIA, Mesa: tests/train.rs reads through it on
                // lavapipe), but that is practice, not the specification's promise.
                let all = unsafe { std::slice::from_raw_parts(pinned.ptr.cast::<u32>(), (bytes / 4) as usize) };
                f(&split_words(all, sizes))
            }
        };
        let mut spares = self.spare_staging.borrow_mut();
        // Capped by the largest read so far, as the planner counts them (by its own size, a smaller
        // buffer would find the cap filled by a larger one's and be made afresh for every read).
        let cap = AllocCosts::GPU.spare_readback_bytes(self.largest_read_bytes.get());
        if spares.iter().map(|s| s.buffer().size()).sum::<u64>() + staging.buffer().size() <= cap {
            spares.push(staging);
        }
        out
    }

    /// Blocks until `mapped` reports the mapping of a staging buffer (`what`), requested after
    /// `submission`: waits for that submission and those before it, not for later work.
    pub(super) fn wait_until_mapped(&self, mapped: &Mapped, submission: Option<wgpu::SubmissionIndex>, what: &str) {
        loop {
            match mapped.try_recv() {
                Ok(result) => return result.unwrap_or_else(|e| panic!("mapping {what} failed: {e}")),
                Err(TryRecvError::Empty) => {
                    Self::wait_for_submission(&self.device, submission.clone()).unwrap_or_else(|e| panic!("waiting for {what}: {e:#}"));
                }
                Err(TryRecvError::Disconnected) => panic!("the map callback of {what} was dropped"),
            }
        }
    }

    /// A tensor's words as f32 values (16-bit storage widened exactly), into a recycled vector.
    pub(super) fn widen(&self, format: Option<HalfFormat>, len: usize, words: &[u32]) -> Vec<f32> {
        let mut out = self.spare_reads.vector(len);
        match format {
            None => crate::ops::elementwise::copy(&mut out, bytemuck::cast_slice(&words[..len])),
            Some(format) => {
                let halves = words.iter().flat_map(|w| [*w as u16, (*w >> 16) as u16]);
                for (o, h) in out.iter_mut().zip(halves) {
                    *o = match format {
                        HalfFormat::F16 => half::f16::from_bits(h).to_f32(),
                        HalfFormat::Bf16 => half::bf16::from_bits(h).to_f32(),
                    };
                }
            }
        }
        out
    }
}

/// `all` cut into consecutive pieces of `sizes` bytes each.
fn split_words<'a>(all: &'a [u32], sizes: &[u64]) -> Vec<&'a [u32]> {
    let mut words = Vec::with_capacity(sizes.len());
    let mut offset = 0;
    for &bytes in sizes {
        let n = (bytes / 4) as usize;
        words.push(&all[offset..offset + n]);
        offset += n;
    }
    words
}
