//! Upload staging in host memory (`UploadStaging::Host`), for the upload ring: a buffer the device's
//! copy engine reads across the link, like PyTorch's pinned memory, rather than wgpu's mappable
//! buffers. wgpu asks for device-local host-visible memory first for those, which on a GPU with a
//! resizable BAR is VRAM behind PCIe, so every byte of a fill crosses the link as a CPU store (an
//! H200 reached 24 GB/s that way against 55 GB/s for a pinned copy; benches/results/2026-11-27-h200-gpu.md).
//! wgpu offers no host-memory staging buffer, so this one is made through its Vulkan hal: a
//! `VkBuffer` bound to host-visible, coherent memory (not device-local where the adapter has such a
//! type), mapped once for its lifetime, and handed to wgpu as a copy source (or destination, for a
//! pinned read-back). Vulkan only (Linux and Windows); elsewhere [`GpuDevice::create_host_buffer`]
//! says it is unavailable. The same kind of buffer, in cached memory, holds working copies the device
//! copies from directly (`gpu/pinned.rs`).
//! A child module of `gpu`, so it uses that file's private fields.

use super::GpuDevice;
use super::fill::fill_raw_in_parallel;

/// A copy source in host memory, mapped for its lifetime (wgpu frees the buffer and its memory when
/// the buffer is dropped, which unmaps it).
pub(super) struct HostStaging {
    pub(super) buffer: wgpu::Buffer,
    ptr: *mut u8,
    len: usize,
}

impl HostStaging {
    /// Copies `src` into the start of the buffer on rayon's threads. The caller has waited for every
    /// copy the device made from it before (the ring's rule), and records its own copy after this.
    pub(super) fn fill(&mut self, src: &[u8]) {
        assert!(src.len() <= self.len, "{} bytes into host staging of {}", src.len(), self.len);
        // SAFETY: the mapping is `len` bytes, live while the buffer is; `&mut self` means nothing else
        // writes it, and the device reads it only in copies recorded after this returns.
        unsafe { fill_raw_in_parallel(self.ptr, src) }
    }
}

impl HostStaging {
    /// A staging buffer of `bytes` in write-combined host memory, or why this adapter cannot make one.
    pub(super) fn new(dev: &GpuDevice, bytes: u64) -> Result<HostStaging, String> {
        let (buffer, ptr) = dev.create_host_buffer(bytes, "upload ring (host memory)", HostReads::Never)?;
        Ok(HostStaging { buffer, ptr, len: bytes as usize })
    }
}

/// Whether the host reads a host buffer back, which picks its memory type: a buffer it only writes
/// is best write-combined (uncached); one it also reads (a working copy) must be cached, since reads
/// of uncached memory run at a small fraction of the speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HostReads {
    Never,
    Often,
}

/// Of a physical device's memory types allowed by `type_bits`, the one a host buffer uses: host-visible
/// and coherent (no flushes), not device-local where one such exists (then it is host memory the
/// device reads across the link), uncached before cached where the host only writes it, cached
/// before uncached where it reads it too. None: no host-visible coherent type.
#[cfg(any(target_os = "linux", target_os = "windows"))]
pub(crate) fn host_staging_memory_type(types: &[(bool, bool, bool, bool)], type_bits: u32, reads: HostReads) -> Option<u32> {
    // (host_visible, host_coherent, device_local, host_cached) per type.
    let allowed = |i: usize| type_bits & (1 << i) != 0;
    let usable = |i: usize| allowed(i) && types[i].0 && types[i].1;
    let rank = |i: usize| (types[i].2 as u8, (types[i].3 == (reads == HostReads::Never)) as u8);
    (0..types.len()).filter(|&i| usable(i)).min_by_key(|&i| (rank(i), i)).map(|i| i as u32)
}

#[cfg(any(target_os = "linux", target_os = "windows"))]
mod vulkan {
    use ash::vk;
    use wgpu::hal::api::Vulkan;

    use super::{GpuDevice, HostReads, host_staging_memory_type};

    impl GpuDevice {
        /// A copy source and destination of `bytes` in host memory, mapped for its lifetime (at the
        /// pointer returned), or why this adapter cannot make one.
        pub(in crate::device::gpu) fn create_host_buffer(
            &self,
            bytes: u64,
            label: &'static str,
            reads: HostReads,
        ) -> Result<(wgpu::Buffer, *mut u8), String> {
            // SAFETY: the hal device is only read here (its handles, to make and bind one buffer that
            // is then handed to wgpu, which owns and frees it); nothing made by wgpu is destroyed.
            let hal = unsafe { self.device.as_hal::<Vulkan>() }.ok_or("host-memory staging needs the Vulkan backend")?;
            let (raw, physical) = (hal.raw_device(), hal.raw_physical_device());
            let info = vk::BufferCreateInfo::default()
                .size(bytes)
                .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST)
                .sharing_mode(vk::SharingMode::EXCLUSIVE);
            // SAFETY: a valid create info on the device's own handle.
            let buffer = unsafe { raw.create_buffer(&info, None) }.map_err(|e| format!("vkCreateBuffer: {e}"))?;
            let destroy = |why: String| {
                // SAFETY: the buffer was made above and nothing else holds it.
                unsafe { raw.destroy_buffer(buffer, None) };
                why
            };
            // SAFETY: the buffer is valid (made above).
            let needs = unsafe { raw.get_buffer_memory_requirements(buffer) };
            // SAFETY: the physical device belongs to this instance.
            let props = unsafe { hal.shared_instance().raw_instance().get_physical_device_memory_properties(physical) };
            let flags = |i: usize| props.memory_types[i].property_flags;
            let types: Vec<(bool, bool, bool, bool)> = (0..props.memory_type_count as usize)
                .map(|i| {
                    let f = flags(i);
                    (
                        f.contains(vk::MemoryPropertyFlags::HOST_VISIBLE),
                        f.contains(vk::MemoryPropertyFlags::HOST_COHERENT),
                        f.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL),
                        f.contains(vk::MemoryPropertyFlags::HOST_CACHED),
                    )
                })
                .collect();
            let type_index = host_staging_memory_type(&types, needs.memory_type_bits, reads)
                .ok_or_else(|| destroy("no host-visible coherent memory type allows a copy source and destination".into()))?;
            // Memory the host reads too must not be a discrete GPU's VRAM behind the BAR: uncached to
            // the host, and outside the device's byte budget.
            if reads == HostReads::Often && types[type_index as usize].2 && self.summary.device_type == wgpu::DeviceType::DiscreteGpu {
                return Err(destroy("the only host-visible memory a copy source may use is the GPU's own (VRAM behind the BAR)".into()));
            }
            let alloc = vk::MemoryAllocateInfo::default().allocation_size(needs.size).memory_type_index(type_index);
            // SAFETY: a valid allocate info; the memory is bound to the buffer and both go to wgpu below.
            let memory = unsafe { raw.allocate_memory(&alloc, None) }.map_err(|e| destroy(format!("vkAllocateMemory: {e}")))?;
            let free = |why: String| {
                // SAFETY: the memory was allocated above and nothing else holds it.
                unsafe { raw.free_memory(memory, None) };
                destroy(why)
            };
            // SAFETY: the memory was allocated from a type the buffer allows, at least its size.
            unsafe { raw.bind_buffer_memory(buffer, memory, 0) }.map_err(|e| free(format!("vkBindBufferMemory: {e}")))?;
            // SAFETY: host-visible memory, mapped once, whole; it stays mapped until freed.
            let ptr = unsafe { raw.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
                .map_err(|e| free(format!("vkMapMemory: {e}")))?;
            // SAFETY: the buffer and its memory are handed over whole: wgpu-hal destroys the buffer and
            // frees the memory when wgpu drops it; nothing here touches either after this.
            let hal_buffer = unsafe { wgpu::hal::vulkan::Buffer::from_raw_managed(buffer, memory, 0, needs.size) };
            drop(hal);
            let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
            let desc = wgpu::BufferDescriptor { label: Some(label), size: bytes, usage, mapped_at_creation: false };
            // SAFETY: made from this device's handle, with the usage and size of `desc`, its bytes
            // (host memory) defined as they are: every copy reads only what a fill wrote, and the host
            // reads only what a copy into it wrote, after waiting for that copy's submission.
            let buffer = unsafe { self.device.create_buffer_from_hal::<Vulkan>(hal_buffer, &desc) };
            Ok((buffer, ptr.cast()))
        }
    }
}

#[cfg(not(any(target_os = "linux", target_os = "windows")))]
impl GpuDevice {
    /// Host-memory buffers are made through the Vulkan hal, which this platform's wgpu does not use.
    pub(in crate::device::gpu) fn create_host_buffer(
        &self,
        _bytes: u64,
        _label: &'static str,
        _reads: HostReads,
    ) -> Result<(wgpu::Buffer, *mut u8), String> {
        Err("host-memory buffers need the Vulkan backend (Linux or Windows)".into())
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "windows")))]
mod tests {
    use super::{HostReads, host_staging_memory_type};

    /// NVIDIA's types on a discrete GPU (device-local; host memory write-combined, then cached;
    /// resizable-BAR VRAM) pick the write-combined host type for staging and the cached one for memory
    /// the host reads too; lavapipe's single kind of memory is taken as it is; a type the buffer does
    /// not allow is never picked; no coherent type, no buffer.
    #[test]
    fn picks_host_memory_over_bar_vram() {
        let (device, host_wc, host_cached, bar) =
            ((false, false, true, false), (true, true, false, false), (true, true, false, true), (true, true, true, false));
        let nvidia = [device, host_wc, host_cached, bar];
        for reads in [HostReads::Never, HostReads::Often] {
            let (best, other) = if reads == HostReads::Never { (1, 2) } else { (2, 1) };
            let without_best = 0b1111 & !(1 << best);
            assert_eq!(host_staging_memory_type(&nvidia, 0b1111, reads), Some(best));
            assert_eq!(host_staging_memory_type(&nvidia, without_best, reads), Some(other), "the preferred type not allowed");
            assert_eq!(host_staging_memory_type(&nvidia, 0b1001, reads), Some(3), "only BAR memory allowed: better than none");
            assert_eq!(host_staging_memory_type(&nvidia, 0b0001, reads), None);
            let lavapipe = [(true, true, true, true)];
            assert_eq!(host_staging_memory_type(&lavapipe, 1, reads), Some(0));
            assert_eq!(host_staging_memory_type(&[(true, false, false, true)], 1, reads), None, "not coherent");
        }
    }
}
