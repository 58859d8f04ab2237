//! Host<->device throughput through wgpu, for `zerostream bench h2d` / `bench d2h`: the ways the
//! trainer can move parameters up and gradients down, timed until the data has arrived (`parallel` is
//! the gpu device's own write path, `GpuDevice::upload`). Tested (the bytes that come back) in
//! tests/transfer.rs.

use std::sync::mpsc::{Receiver, channel};
use std::time::Instant;

use anyhow::{Result, anyhow, bail};

use super::gpu::{GpuDevice, GpuTensor};

/// How bytes cross to or from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransferMethod {
    /// h2d: `queue.write_buffer` (wgpu copies into its own staging memory on one thread). d2h: one
    /// copy into a mapped read-back buffer of the whole size (what `Backend::read` does).
    Direct,
    /// h2d only: wgpu's staging memory filled by rayon's threads (`GpuDevice::upload`, what the gpu
    /// device's writes do: one core's memcpy is far below a PCIe link).
    Parallel,
    /// A ring of mapped staging buffers, each chunk copied on the device while the next is filled
    /// (h2d) or drained (d2h).
    StagingRing,
}

/// The staging buffers of an h2d move that the device may still be copying from: drop it once the
/// device has run them.
pub struct H2dInFlight {
    ring: Vec<(wgpu::Buffer, super::alloc::Charge)>,
}

/// Chunk size and ring length of the staging ring.
const RING_CHUNK_BYTES: u64 = 8 << 20;
const RING_LEN: usize = 4;

fn map(buffer: &wgpu::Buffer, mode: wgpu::MapMode) -> Receiver<Result<(), wgpu::BufferAsyncError>> {
    let (tx, rx) = channel();
    buffer.slice(..).map_async(mode, move |r| {
        let _ = tx.send(r);
    });
    rx
}

impl GpuDevice {
    fn wait(&self) -> Result<()> {
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| anyhow!("GPU device lost: {e}"))?;
        Ok(())
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
        self.synchronize();
        let start = Instant::now();
        let in_flight = self.issue_h2d(&dst, host, method)?;
        self.wait()?;
        drop(in_flight);
        Ok(start.elapsed().as_secs_f64())
    }

    /// Starts moving `host` into the start of `dst` by `method` and returns once the host's part is
    /// done, without waiting for the device's (`zerostream bench overlap` runs kernels meanwhile). The
    /// ring waits only for its own earlier copies before refilling a buffer. Keep the result until the
    /// device has run the copies.
    pub fn issue_h2d_into(&self, dst: &GpuTensor, host: &[u8], method: TransferMethod) -> Result<H2dInFlight> {
        if host.len() as u64 > dst.buffer().size() {
            bail!("an h2d copy of {} bytes into a tensor of {} bytes", host.len(), dst.buffer().size());
        }
        self.issue_h2d(dst.buffer(), host, method)
    }

    fn issue_h2d(&self, dst: &wgpu::Buffer, host: &[u8], method: TransferMethod) -> Result<H2dInFlight> {
        let bytes = host.len() as u64;
        let mut in_flight = H2dInFlight { ring: Vec::new() };
        match method {
            TransferMethod::Direct => {
                self.queue.write_buffer(dst, 0, host);
                self.queue.submit([]);
            }
            TransferMethod::Parallel => {
                self.upload(dst, 0, host);
                self.queue.submit([]);
            }
            TransferMethod::StagingRing => {
                let chunk = RING_CHUNK_BYTES.min(bytes);
                let mut pending: Vec<Option<(Receiver<_>, wgpu::SubmissionIndex)>> = (0..RING_LEN).map(|_| None).collect();
                for _ in 0..RING_LEN {
                    let charge = self.budget.charge(chunk, "h2d staging")?;
                    let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("h2d staging"),
                        size: chunk,
                        usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                        mapped_at_creation: true,
                    });
                    in_flight.ring.push((buffer, charge));
                }
                for (k, piece) in host.chunks(chunk as usize).enumerate() {
                    let buffer = &in_flight.ring[k % RING_LEN].0;
                    if let Some((rx, submission)) = pending[k % RING_LEN].take() {
                        self.wait_mapped_after(&rx, submission)?;
                    }
                    buffer.slice(..).get_mapped_range_mut().map_err(|e| anyhow!("{e}"))?.slice(..piece.len()).copy_from_slice(piece);
                    buffer.unmap();
                    let mut encoder = self.device.create_command_encoder(&Default::default());
                    encoder.copy_buffer_to_buffer(buffer, 0, dst, k as u64 * chunk, piece.len() as u64);
                    let submission = self.queue.submit([encoder.finish()]);
                    pending[k % RING_LEN] = Some((map(buffer, wgpu::MapMode::Write), submission));
                }
            }
        }
        Ok(in_flight)
    }

    /// Waits for a staging buffer's mapping, requested after `submission` (its copy): only that
    /// submission and those before it, not later work.
    fn wait_mapped_after(&self, rx: &Receiver<Result<(), wgpu::BufferAsyncError>>, submission: wgpu::SubmissionIndex) -> Result<()> {
        loop {
            if let Ok(r) = rx.try_recv() {
                return r.map_err(|e| anyhow!("mapping a staging buffer failed: {e}"));
            }
            let wait = wgpu::PollType::Wait { submission_index: Some(submission.clone()), timeout: None };
            self.device.poll(wait).map_err(|e| anyhow!("GPU device lost: {e}"))?;
        }
    }

    /// Seconds to bring a device buffer of `host.len()` bytes into `host`.
    pub fn time_d2h(&self, host: &mut [u8], method: TransferMethod) -> Result<f64> {
        let bytes = host.len() as u64;
        let (src, _c) = self.bench_buffer(
            bytes,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            "d2h source",
        )?;
        self.queue.write_buffer(&src, 0, host);
        self.queue.submit([]);
        self.synchronize();
        let start = Instant::now();
        let chunk = match method {
            TransferMethod::Direct | TransferMethod::Parallel => bytes,
            TransferMethod::StagingRing => RING_CHUNK_BYTES.min(bytes),
        };
        let ring_len = if method == TransferMethod::StagingRing { RING_LEN } else { 1 };
        let mut ring = Vec::new();
        for _ in 0..ring_len {
            ring.push(self.bench_buffer(chunk, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, "d2h staging")?);
        }
        let chunks = bytes.div_ceil(chunk) as usize;
        let mut in_flight: std::collections::VecDeque<(usize, Receiver<_>)> = Default::default();
        let drain = |k: usize, rx: Receiver<_>, host: &mut [u8]| -> Result<()> {
            self.wait_mapped(&rx)?;
            let buffer = &ring[k % ring_len].0;
            let off = k * chunk as usize;
            let n = (host.len() - off).min(chunk as usize);
            host[off..off + n].copy_from_slice(&buffer.slice(..).get_mapped_range().map_err(|e| anyhow!("{e}"))?[..n]);
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
        Ok(start.elapsed().as_secs_f64())
    }
}
