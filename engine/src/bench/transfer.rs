//! `zerostream bench h2d` / `bench d2h`: host<->device GB/s through wgpu, for each transfer method.

use anyhow::{Result, bail};

use crate::device::GpuDevice;
use crate::device::gpu::PINNED_COPY_MIN_BYTES;
use crate::device::transfer::TransferMethod;

/// Which way bytes cross.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    HostToDevice,
    DeviceToHost,
}

/// One size and method of `bench h2d` / `bench d2h`: the best of its repetitions.
#[derive(Clone, Debug)]
pub struct TransferRun {
    pub link: Link,
    pub method: TransferMethod,
    pub bytes: u64,
    pub gbps: f64,
}

impl TransferRun {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "link": if self.link == Link::HostToDevice { "h2d" } else { "d2h" },
            "method": format!("{:?}", self.method), "bytes": self.bytes, "gbps": self.gbps,
        })
    }
}

/// Host<->device GB/s for each size and method, best of `reps`; the data is checked once per size.
pub fn bench_transfer(
    dev: &GpuDevice,
    link: Link,
    sizes: &[u64],
    reps: usize,
    mut on_run: impl FnMut(&TransferRun),
) -> Result<Vec<TransferRun>> {
    // Every size is checked before any is moved, so a bad one late in the list costs no time.
    let max_buffer_bytes = dev.summary().max_buffer_bytes;
    for &bytes in sizes {
        if bytes == 0 || bytes % wgpu::COPY_BUFFER_ALIGNMENT != 0 {
            bail!(
                "--sizes: transfer size {bytes} bytes: must be a positive multiple of {} (wgpu's copy alignment)",
                wgpu::COPY_BUFFER_ALIGNMENT
            );
        }
        if bytes > max_buffer_bytes {
            bail!(
                "--sizes: transfer size {bytes} bytes ({:.1} GiB): larger than the adapter's largest buffer, {max_buffer_bytes} bytes",
                bytes as f64 / (1u64 << 30) as f64
            );
        }
        // The host's bytes, a download's expected copy (and pinned read-back buffer) or a prestaged
        // upload's staging beside them.
        let copies = if link == Link::DeviceToHost { 3 } else { 2 };
        crate::train::refuse_past_available_ram(bytes.saturating_mul(copies), &format!("--sizes: transfer size {bytes} bytes"))?;
    }
    let mut runs = Vec::new();
    for &bytes in sizes {
        let mut host: Vec<u8> = (0..bytes).map(|i| (i % 253) as u8).collect();
        // A download has no parallel variant: every copy out of a mapping runs on rayon's threads.
        let methods: Vec<TransferMethod> = match link {
            Link::HostToDevice => h2d_methods(dev, bytes),
            Link::DeviceToHost => d2h_methods(dev),
        };
        for method in methods {
            let best = match link {
                Link::HostToDevice => best_h2d_seconds(dev, &host, method, reps)?,
                Link::DeviceToHost => best_d2h_seconds(dev, &mut host, method, reps)?,
            };
            let run = TransferRun { link, method, bytes, gbps: bytes as f64 / best / 1e9 };
            on_run(&run);
            runs.push(run);
        }
    }
    Ok(runs)
}

/// The fastest of `reps` (at least one) timed uploads of `host` by `method`, after one untimed upload:
/// the upload ring's buffers are made on the first large write (as PyTorch's pinned buffer is made
/// before its copies are timed).
pub fn best_h2d_seconds(dev: &GpuDevice, host: &[u8], method: TransferMethod, reps: usize) -> Result<f64> {
    dev.time_h2d(host, method)?;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        best = best.min(dev.time_h2d(host, method)?);
    }
    Ok(best)
}

/// The fastest of `reps` (at least one) timed downloads of `host` by `method` (each copies `host` up
/// untimed and reads it back), failing if a read returns other bytes than were sent
/// ([`GpuDevice::time_d2h`] checks each).
pub fn best_d2h_seconds(dev: &GpuDevice, host: &mut [u8], method: TransferMethod, reps: usize) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        best = best.min(dev.time_d2h(host, method)?);
    }
    Ok(best)
}

/// The methods `dev` can download by: every one, `Pinned` only where the adapter makes pinned
/// read-back buffers (Vulkan, not in a discrete GPU's BAR memory).
pub fn d2h_methods(dev: &GpuDevice) -> Vec<TransferMethod> {
    use TransferMethod::*;
    let pinned = dev.pinned_read_back_unavailable().is_none();
    [Direct, StagingRing, InPlace, Pinned].into_iter().filter(|&m| m != Pinned || pinned).collect()
}

/// The methods `dev` can upload `bytes` by: every one, `HostRing` and `Pinned` only where the adapter
/// makes host-memory buffers (Vulkan), and `Pinned` only from 1 MiB (smaller uploads are never copied
/// from pinned memory: `write_buffer` takes them).
pub fn h2d_methods(dev: &GpuDevice, bytes: u64) -> Vec<TransferMethod> {
    use TransferMethod::*;
    let host_memory = dev.host_staging_unavailable().is_none();
    let pinned = host_memory && bytes >= PINNED_COPY_MIN_BYTES as u64;
    [Direct, Parallel, StagingRing, HostRing, Pinned, Prestaged]
        .into_iter()
        .filter(|&m| match m {
            HostRing => host_memory,
            Pinned => pinned,
            _ => true,
        })
        .collect()
}
