//! Host<->device throughput through wgpu, for `zerostream bench h2d` / `bench d2h`: the ways the
//! trainer can move parameters up and gradients down, timed until the data has arrived (h2d
//! `staging-ring` is the gpu device's own write path, `GpuDevice::upload`). Staging memory a method
//! keeps between moves is made before the clock starts, as PyTorch's pinned buffer is. Tested (the
//! bytes that come back) in tests/transfer.rs.

use std::sync::mpsc::{Receiver, channel};
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use rayon::prelude::*;

use super::UploadStaging;
use super::gpu::{GpuDevice, GpuTensor, PINNED_COPY_MIN_BYTES, Prestaged};

/// How bytes cross to or from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransferMethod {
    /// h2d: `queue.write_buffer` (wgpu copies into its own staging memory on one thread). d2h: one
    /// copy into a mapped read-back buffer of the whole size, copied out on rayon's threads (what
    /// `Backend::read` does with mapped read-backs, the default; the trainer adds gradients straight
    /// out of the mapping).
    Direct,
    /// h2d only: wgpu's fresh staging memory for the whole write, filled by rayon's threads (the gpu
    /// device's write path before the ring).
    Parallel,
    /// A ring of mapped staging buffers, each chunk copied on the device while the next is filled
    /// (h2d: the gpu device's upload ring, what its writes do) or drained (d2h), on rayon's threads.
    StagingRing,
    /// h2d only: the upload ring with its buffers in host memory the device's copy engine reads
    /// (`UploadStaging::Host`, Vulkan only), where `StagingRing` uses wgpu's mappable buffers. Each
    /// method sets the ring's kind it needs (the device keeps the last one set).
    HostRing,
    /// h2d only: the bytes already in staging memory, filled before the clock starts (as PyTorch's
    /// pinned buffer holds them): the device's copy alone. What an upload would cost the device thread
    /// if the AdamW thread wrote the working copy straight into staging memory (issue #22 item 4), so
    /// `StagingRing` against this row is what the host's copy into the ring costs.
    Prestaged,
    /// h2d: the bytes in pinned host memory (`GpuDevice::alloc_pinned`, filled before the clock),
    /// copied by the device from where they lie: how the trainer uploads the working copies it keeps
    /// in RAM, which the AdamW thread writes there (issue #22 item 4). d2h: one copy into a buffer in
    /// pinned host memory mapped for good, timed until its submission is done (no `map_async`), as
    /// PyTorch's copy into a pinned buffer: how the trainer reads where `zerostream tune` found it
    /// faster than `InPlace` (`ReadBack::Pinned`). Vulkan only.
    Pinned,
    /// d2h only: one copy into a mapped read-back buffer made (and used once) before the clock, timed
    /// until its bytes can be read where they landed (checked afterwards): how the trainer takes
    /// gradients with mapped read-backs (the default), adding them into the accumulator straight out of
    /// the mapping of a buffer it reuses (`Backend::finish_read_with`), as PyTorch's copy into a pinned
    /// buffer leaves the bytes for the host to read there.
    InPlace,
}

/// Chunk size and ring length of the d2h staging ring (the h2d ring is the device's own,
/// `gpu/staging.rs`).
const RING_CHUNK_BYTES: u64 = 8 << 20;
const RING_LEN: usize = 4;
/// Bytes per rayon task copying out of a mapping.
const DRAIN_PIECE_BYTES: usize = 1 << 20;

fn map(buffer: &wgpu::Buffer, mode: wgpu::MapMode) -> Receiver<Result<(), wgpu::BufferAsyncError>> {
    let (tx, rx) = channel();
    buffer.slice(..).map_async(mode, move |r| {
        let _ = tx.send(r);
    });
    rx
}

impl GpuDevice {
    fn wait(&self) -> Result<()> {
        Self::wait_for_submission(&self.device, None)
    }

    fn wait_mapped(&self, rx: &Receiver<Result<(), wgpu::BufferAsyncError>>) -> Result<()> {
        loop {
            if let Ok(r) = rx.try_recv() {
                return r.map_err(|e| anyhow!("mapping a staging buffer failed: {e}"));
            }
            self.wait()?;
        }
    }

    fn bench_buffer(&self, bytes: u64, usage: wgpu::BufferUsages, label: &str) -> Result<(wgpu::Buffer, super::alloc::Charge)> {
        let charge = self.budget.charge(bytes, label)?;
        let buffer =
            self.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size: bytes, usage, mapped_at_creation: false });
        Ok((buffer, charge))
    }

    /// Seconds to move `host` into a device buffer and have it arrive.
    pub fn time_h2d(&self, host: &[u8], method: TransferMethod) -> Result<f64> {
        let bytes = host.len() as u64;
        let (dst, _c) = self.bench_buffer(bytes, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST, "h2d target")?;
        let staged = if method == TransferMethod::Prestaged { Some(self.prestage(host)?) } else { None };
        let pinned = if method == TransferMethod::Pinned { Some(self.pinned_copy_of(host)?) } else { None };
        self.synchronize();
        let start = Instant::now();
        match (&staged, &pinned) {
            (Some(staged), _) => self.copy_prestaged(&dst, staged),
            (None, Some(pinned)) => self.issue_h2d(&dst, pinned.bytes(), method)?,
            (None, None) => self.issue_h2d(&dst, host, method)?,
        }
        self.wait()?;
        Ok(start.elapsed().as_secs_f64())
    }

    /// Starts moving `host` into the start of `dst` by `method` and returns once the host's part is
    /// done, without waiting for the device's (`zerostream bench overlap` runs kernels meanwhile). The
    /// ring waits only for its own earlier copies before refilling a buffer.
    pub fn issue_h2d_into(&self, dst: &GpuTensor, host: &[u8], method: TransferMethod) -> Result<()> {
        if host.len() as u64 > dst.buffer().size() {
            bail!("an h2d copy of {} bytes into a tensor of {} bytes", host.len(), dst.buffer().size());
        }
        if !(host.len() as u64).is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
            bail!("an h2d copy of {} bytes: must be a multiple of {} (wgpu's copy alignment)", host.len(), wgpu::COPY_BUFFER_ALIGNMENT);
        }
        self.issue_h2d(dst.buffer(), host, method)
    }

    /// `host` copied into a new pinned buffer ([`GpuDevice::alloc_pinned`]), the source
    /// [`TransferMethod::Pinned`] copies from.
    pub fn pinned_copy_of(&self, host: &[u8]) -> Result<zerostream_offload::AlignedBuf> {
        if host.len() < PINNED_COPY_MIN_BYTES {
            bail!("a pinned copy of {} bytes: uploads under 1 MiB go through write_buffer, not copied from pinned memory", host.len());
        }
        let mut pinned = self.alloc_pinned(host.len()).map_err(|why| anyhow!("pinned host memory of {} bytes: {why}", host.len()))?;
        pinned.bytes_mut().copy_from_slice(host);
        Ok(pinned)
    }

    /// [`Self::issue_h2d_into`] from bytes prestaged before: records and submits the device's copy.
    pub fn issue_prestaged_into(&self, dst: &GpuTensor, staged: &Prestaged) -> Result<()> {
        if staged.bytes() > dst.buffer().size() {
            bail!("an h2d copy of {} bytes into a tensor of {} bytes", staged.bytes(), dst.buffer().size());
        }
        self.copy_prestaged(dst.buffer(), staged);
        Ok(())
    }

    fn issue_h2d(&self, dst: &wgpu::Buffer, host: &[u8], method: TransferMethod) -> Result<()> {
        match method {
            TransferMethod::Direct => {
                self.queue.write_buffer(dst, 0, host);
                self.queue.submit([]);
            }
            TransferMethod::Parallel => {
                self.upload_via_wgpu_staging(dst, 0, host);
                self.queue.submit([]);
            }
            TransferMethod::StagingRing | TransferMethod::HostRing => {
                let kind = if method == TransferMethod::HostRing { UploadStaging::Host } else { UploadStaging::Mapped };
                if self.upload_staging() != kind {
                    self.set_upload_staging(kind)?;
                }
                self.upload_through_ring(dst, 0, host)
            }
            TransferMethod::InPlace => bail!("{method:?} moves bytes down only (d2h)"),
            TransferMethod::Prestaged => {
                bail!("a prestaged copy's bytes are staged before it is issued: GpuDevice::prestage, then issue_prestaged_into")
            }
            TransferMethod::Pinned => {
                if !self.copy_from_pinned(dst, false, 0, host) {
                    bail!("a pinned copy's bytes must lie in pinned host memory: GpuDevice::pinned_copy_of");
                }
            }
        }
        Ok(())
    }

    /// Seconds to bring a device buffer of `host.len()` bytes (`host`'s, copied up untimed) back to the
    /// host: into `host` (Direct, StagingRing) or readable where it lands (InPlace, Pinned). Fails if
    /// the bytes read differ from those sent (checked untimed): the one place every d2h timing is checked.
    pub fn time_d2h(&self, host: &mut [u8], method: TransferMethod) -> Result<f64> {
        if matches!(method, TransferMethod::Parallel | TransferMethod::HostRing | TransferMethod::Prestaged) {
            bail!("{method:?} moves bytes up only (h2d)");
        }
        if matches!(method, TransferMethod::InPlace | TransferMethod::Pinned) {
            return self.time_d2h_in_place(host, method);
        }
        let bytes = host.len() as u64;
        let (src, _c) = self.bench_buffer(
            bytes,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            "d2h source",
        )?;
        self.queue.write_buffer(&src, 0, host);
        self.queue.submit([]);
        let sent = host.to_vec();
        // Overwritten (untimed) so that a read that moved nothing fails the check below.
        host.iter_mut().for_each(|b| *b = !*b);
        let chunk = match method {
            TransferMethod::StagingRing => RING_CHUNK_BYTES.min(bytes),
            _ => bytes,
        };
        let ring_len = if method == TransferMethod::StagingRing { RING_LEN } else { 1 };
        let mut ring = Vec::new();
        for _ in 0..ring_len {
            ring.push(self.bench_buffer(chunk, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, "d2h staging")?);
        }
        self.synchronize();
        let start = Instant::now();
        let chunks = bytes.div_ceil(chunk) as usize;
        let mut in_flight: std::collections::VecDeque<(usize, Receiver<_>)> = Default::default();
        let drain = |k: usize, rx: Receiver<_>, host: &mut [u8]| -> Result<()> {
            self.wait_mapped(&rx)?;
            let buffer = &ring[k % ring_len].0;
            let off = k * chunk as usize;
            let n = (host.len() - off).min(chunk as usize);
            {
                let mapped = buffer.slice(..n as u64).get_mapped_range().map_err(|e| anyhow!("{e}"))?;
                let pieces = host[off..off + n].par_chunks_mut(DRAIN_PIECE_BYTES).zip(mapped.par_chunks(DRAIN_PIECE_BYTES));
                pieces.for_each(|(d, s)| d.copy_from_slice(s));
            }
            buffer.unmap();
            Ok(())
        };
        for k in 0..chunks {
            if in_flight.len() == ring_len {
                let (old, rx) = in_flight.pop_front().expect("non-empty");
                drain(old, rx, host)?;
            }
            let buffer = &ring[k % ring_len].0;
            let n = (bytes - k as u64 * chunk).min(chunk);
            let mut encoder = self.device.create_command_encoder(&Default::default());
            encoder.copy_buffer_to_buffer(&src, k as u64 * chunk, buffer, 0, n);
            self.queue.submit([encoder.finish()]);
            in_flight.push_back((k, map(buffer, wgpu::MapMode::Read)));
        }
        while let Some((k, rx)) = in_flight.pop_front() {
            drain(k, rx, host)?;
        }
        let seconds = start.elapsed().as_secs_f64();
        if *host != *sent {
            bail!("d2h {method:?} of {bytes} bytes: the bytes read differ from those sent");
        }
        Ok(seconds)
    }

    /// [`TransferMethod::InPlace`] and d2h [`TransferMethod::Pinned`]: seconds until a device buffer of
    /// `host.len()` bytes is readable where it lands (after one untimed copy into the same buffer, as
    /// the trainer reuses its read-back buffers); the bytes are then checked against `host` (untimed).
    fn time_d2h_in_place(&self, host: &[u8], method: TransferMethod) -> Result<f64> {
        let bytes = host.len() as u64;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let (src, _c) = self.bench_buffer(bytes, usage, "d2h source")?;
        self.queue.write_buffer(&src, 0, host);
        // The destination, and how long the host waits until it may read there: the mapping a buffer
        // gets after the copy, or (pinned) the copy's submission.
        let (staging, _s, pinned) = if method == TransferMethod::Pinned {
            let (buffer, ptr) =
                self.pinned_read_back(bytes).map_err(|why| anyhow!("d2h Pinned: pinned host memory of {bytes} bytes: {why}"))?;
            (buffer, None, Some(ptr))
        } else {
            let (buffer, charge) = self.bench_buffer(bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, "d2h staging")?;
            (buffer, Some(charge), None)
        };
        let copy_and_wait = || -> Result<()> {
            let mut encoder = self.device.create_command_encoder(&Default::default());
            encoder.copy_buffer_to_buffer(&src, 0, &staging, 0, bytes);
            let submission = self.queue.submit([encoder.finish()]);
            match pinned {
                Some(_) => {
                    Self::wait_for_submission(&self.device, Some(submission))?;
                }
                None => self.wait_mapped(&map(&staging, wgpu::MapMode::Read))?,
            }
            Ok(())
        };
        copy_and_wait()?;
        if pinned.is_none() {
            staging.unmap();
        }
        self.synchronize();
        let start = Instant::now();
        copy_and_wait()?;
        let seconds = start.elapsed().as_secs_f64();
        let same = match pinned {
            // SAFETY: the mapping is `bytes` long and lives as long as `staging`; the copy into it is
            // done (its submission waited for) and nothing else writes it.
            Some(ptr) => (unsafe { std::slice::from_raw_parts(ptr, bytes as usize) }) == host,
            None => {
                let same = *staging.slice(..).get_mapped_range().map_err(|e| anyhow!("{e}"))? == *host;
                staging.unmap();
                same
            }
        };
        if !same {
            bail!("d2h {method:?} of {bytes} bytes: the bytes where they landed differ from the device's");
        }
        Ok(seconds)
    }
}
