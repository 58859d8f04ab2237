//! The transfer paths `zerostream tune` chooses between. Uploads: the same write timed through the
//! upload ring's wgpu mappable buffers and through host memory the device's copy engine reads
//! ([`UploadStaging`]). Read-backs: the same download timed into a mapped buffer and into pinned host
//! memory ([`ReadBack`]). The faster of each is kept in the table (by at least [`HOST_MARGIN`], else
//! the mapped buffers every adapter has). The bytes that arrive are the same either way: only the
//! speed is chosen.

use anyhow::{Result, bail};

use crate::bench::transfer::{best_d2h_seconds, best_h2d_seconds};
use crate::device::transfer::TransferMethod;
use crate::device::{GpuDevice, ReadBack, UploadStaging};

/// How much faster host staging must be to be chosen: a tie goes to what every adapter has.
pub const HOST_MARGIN: f64 = 1.05;

/// Timed runs per staging kind (after one untimed run that makes the ring's buffers); the best counts.
const REPS: usize = 3;

/// What the upload timing found.
#[derive(Clone, Debug)]
pub struct UploadResult {
    /// Bytes per timed write.
    pub bytes: u64,
    pub mapped_gbps: f64,
    /// None where the adapter cannot stage in host memory, with why in `host_unavailable`.
    pub host_gbps: Option<f64>,
    pub host_unavailable: Option<String>,
    pub chosen: UploadStaging,
}

/// Times writes of `bytes` through each staging kind `dev` can use, leaves `dev` on the faster and
/// says which.
pub fn tune_upload(dev: &GpuDevice, bytes: u64) -> Result<UploadResult> {
    if bytes == 0 || !bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
        bail!("upload timing: {bytes} bytes is not a positive multiple of {}", wgpu::COPY_BUFFER_ALIGNMENT);
    }
    let host: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let gbps = |method| -> Result<f64> { Ok(bytes as f64 / best_h2d_seconds(dev, &host, method, REPS)? / 1e9) };
    let mapped_gbps = gbps(TransferMethod::StagingRing)?;
    let host_unavailable = dev.host_staging_unavailable();
    let host_gbps = if host_unavailable.is_none() { Some(gbps(TransferMethod::HostRing)?) } else { None };
    let chosen = match host_gbps {
        Some(h) if h >= HOST_MARGIN * mapped_gbps => UploadStaging::Host,
        _ => UploadStaging::Mapped,
    };
    dev.set_upload_staging(chosen)?;
    Ok(UploadResult { bytes, mapped_gbps, host_gbps, host_unavailable, chosen })
}

/// What the read-back timing found.
#[derive(Clone, Debug)]
pub struct DownloadResult {
    /// Bytes per timed read.
    pub bytes: u64,
    pub mapped_gbps: f64,
    /// None where the adapter cannot make pinned host buffers, with why in `pinned_unavailable`.
    pub pinned_gbps: Option<f64>,
    pub pinned_unavailable: Option<String>,
    pub chosen: ReadBack,
}

/// Times reads of `bytes` into each kind of read-back buffer `dev` can use (`bench d2h`'s `InPlace`
/// and `Pinned`), leaves `dev` on the faster and says which.
pub fn tune_download(dev: &GpuDevice, bytes: u64) -> Result<DownloadResult> {
    if bytes == 0 || !bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
        bail!("read-back timing: {bytes} bytes is not a positive multiple of {}", wgpu::COPY_BUFFER_ALIGNMENT);
    }
    let mut host: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let mut gbps = |method| -> Result<f64> { Ok(bytes as f64 / best_d2h_seconds(dev, &mut host, method, REPS)? / 1e9) };
    let mapped_gbps = gbps(TransferMethod::InPlace)?;
    let pinned_unavailable = dev.pinned_read_back_unavailable();
    let pinned_gbps = if pinned_unavailable.is_none() { Some(gbps(TransferMethod::Pinned)?) } else { None };
    let chosen = match pinned_gbps {
        Some(p) if p >= HOST_MARGIN * mapped_gbps => ReadBack::Pinned,
        _ => ReadBack::Mapped,
    };
    dev.set_read_back(chosen)?;
    Ok(DownloadResult { bytes, mapped_gbps, pinned_gbps, pinned_unavailable, chosen })
}
