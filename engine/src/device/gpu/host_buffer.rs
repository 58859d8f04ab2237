//! Host buffers for `bench overlap`'s copies on the copy queues (`gpu/copy_queue.rs`): mapped host
//! memory that a copy reads or writes while the host keeps its hands off, enforced by the types (a
//! copy into it takes `&mut`, its reads and writes wait for the copies issued with it). A child
//! module of `gpu`.

use anyhow::{Result, bail};

use super::GpuDevice;
use super::copy_queue::{BufferCopy, CopyQueueKind};

/// A buffer in host memory the copy queues copy into or out of, mapped for its lifetime (`bench
/// overlap`'s source and read-back; see `gpu/host_staging.rs` for the memory).
///
/// The host touches it only once the copies issued with it are done: [`Self::write`] and
/// [`Self::bytes`] wait for the device's copy queues first where one was issued since, and a copy
/// into it takes `&mut`, so none can be issued while its bytes are borrowed.
pub struct HostBuffer {
    pub(in crate::device) buffer: wgpu::Buffer,
    /// The device whose copy queues use it (the one waited for).
    device: wgpu::Device,
    ptr: *mut u8,
    len: usize,
    /// Whether a copy was issued with it since the last wait.
    copying: std::cell::Cell<bool>,
}

impl HostBuffer {
    /// Writes `bytes` at the start, once the copies issued with the buffer are done.
    pub fn write(&mut self, dev: &GpuDevice, bytes: &[u8]) -> Result<()> {
        if bytes.len() > self.len {
            bail!("{} bytes into a host buffer of {}", bytes.len(), self.len);
        }
        self.wait(dev)?;
        // SAFETY: the mapping is `len` bytes, live while the buffer is; `&mut self` means nothing else
        // writes it here, and no copy that reads it is in flight (waited for above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr, bytes.len()) }
        Ok(())
    }

    /// The buffer's bytes, once the copies issued with it are done.
    pub fn bytes(&self, dev: &GpuDevice) -> Result<&[u8]> {
        self.wait(dev)?;
        // SAFETY: the mapping is `len` bytes, live while the buffer is, host-coherent; no copy into it
        // is in flight (waited for above; each copy's command buffer ends with a transfer-to-host
        // barrier), and none can be issued while the slice borrows `self` (a copy into it takes `&mut`).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// Waits for `dev`'s copy queues where a copy was issued with this buffer since the last wait.
    fn wait(&self, dev: &GpuDevice) -> Result<()> {
        self.check_device(dev)?;
        if self.copying.get() {
            dev.wait_for_copy_queues()?;
            self.copying.set(false);
        }
        Ok(())
    }

    fn check_device(&self, dev: &GpuDevice) -> Result<()> {
        if dev.device != self.device {
            bail!("a host buffer used with a GPU device other than the one that made it");
        }
        Ok(())
    }
}

impl GpuDevice {
    /// A host buffer of `bytes` (a whole number of 4-byte words, not 0) for copies on the copy
    /// queues, or why the adapter makes none.
    pub fn host_buffer(&self, bytes: usize) -> Result<HostBuffer> {
        if bytes == 0 || !bytes.is_multiple_of(4) {
            bail!("a host buffer of {bytes} bytes: copy queues move whole 4-byte words, at least one");
        }
        let (buffer, ptr) = self
            .create_host_buffer(bytes as u64, "copy-queue host buffer", super::host_staging::HostReads::Often)
            .map_err(|why| anyhow::anyhow!("a host buffer of {bytes} bytes: {why}"))?;
        Ok(HostBuffer { buffer, device: self.device.clone(), ptr, len: bytes, copying: std::cell::Cell::new(false) })
    }

    /// Issues a copy of the first `bytes` of `host` into `dst` on the copy queue of `kind`, without
    /// waiting ([`Self::synchronize`] waits). `dst` is not in use by wgpu's queue meanwhile.
    pub fn copy_host_to_tensor_on(&self, kind: CopyQueueKind, host: &HostBuffer, dst: &super::GpuTensor, bytes: u64) -> Result<()> {
        let copy = BufferCopy { src: &host.buffer, src_offset: 0, dst: dst.buffer(), dst_offset: 0, size: bytes };
        self.copy_with_host(kind, host, copy)
    }

    /// Issues a copy of the first `bytes` of `src` into `host` on the copy queue of `kind`, without
    /// waiting (`host`'s next read waits). `src` is not being written by wgpu's queue meanwhile. On
    /// a transfer-only family's queue, `src` holds only what that queue wrote: without an ownership
    /// transfer, Vulkan leaves what another family's queue wrote undefined there.
    pub fn copy_tensor_to_host_on(&self, kind: CopyQueueKind, src: &super::GpuTensor, host: &mut HostBuffer, bytes: u64) -> Result<()> {
        let copy = BufferCopy { src: src.buffer(), src_offset: 0, dst: &host.buffer, dst_offset: 0, size: bytes };
        self.copy_with_host(kind, host, copy)
    }

    fn copy_with_host(&self, kind: CopyQueueKind, host: &HostBuffer, copy: BufferCopy<'_>) -> Result<()> {
        host.check_device(self)?;
        self.copy_on_queue(kind, &[copy])?;
        host.copying.set(true);
        Ok(())
    }
}
