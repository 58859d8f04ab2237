//! Copy queues beside wgpu's one queue (issue #22 item 4).
//!
//! wgpu gives a device one queue, and on the H200 copies on it ran one after the kernels (`bench
//! overlap`: 0.21 of a pinned upload hidden, none of a download), about 25 ms of a 216 ms GPT-2 step
//! (benches/results/2026-11-28-h200-analysis.md). Vulkan lets a device have more queues: a second
//! queue of the family wgpu uses, or one of a family that only copies (NVIDIA's DMA engines). A Vulkan
//! device asks for those when it opens, beside wgpu's own (through wgpu's Vulkan hal,
//! `open_with_callback`), and moves bytes on them with raw `vkCmdCopyBuffer`s, each submission fenced:
//! `bench overlap` times copies there beside kernels on wgpu's queue, and `--copy-queue` moves the
//! trainer's big uploads and read-backs to the second queue of wgpu's family (`gpu_copy_route.rs`).
//!
//! Where the adapter has no second queue of wgpu's family (lavapipe has one queue in all), a stand-in
//! submits to wgpu's own queue ([`CopyQueueKind::SharedStandIn`]): it overlaps nothing, and tests the
//! path everywhere. Every
//! queue is used from the device's thread only (the device is not `Sync`), which is what makes the
//! stand-in's submissions to wgpu's queue safe: Vulkan asks that no two threads submit to one queue
//! at once, and wgpu submits only when this thread calls it (its queue's last wait, when the device
//! is dropped, may run on whichever thread lets it go, after every copy here has finished).
//!
//! Buffers: the copies here touch only buffers that wgpu's queue is not using meanwhile (the caller's
//! rule). wgpu's buffers belong to one queue family at a time (EXCLUSIVE), and no ownership moves
//! between families here: a copy on a transfer-only family's queue overwrites its target whole, and
//! what it wrote is read back on that same queue only (Vulkan leaves it undefined on another family's
//! queue without an ownership transfer). Vulkan only (Linux and Windows). A child module of `gpu`.

use anyhow::{Context, Result, bail};

use super::GpuDevice;

/// Which kind of queue moves the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyQueueKind {
    /// A second queue of the family wgpu's queue belongs to (graphics and compute as well as copies).
    SameFamily,
    /// A queue of a family that only copies (no graphics, no compute): the DMA engines.
    TransferFamily,
    /// wgpu's own queue, where the adapter offers no other: tests the path, overlaps nothing.
    SharedStandIn,
}

impl CopyQueueKind {
    /// The name `bench overlap`'s rows carry (`h2d queue2`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CopyQueueKind::SameFamily => "queue2",
            CopyQueueKind::TransferFamily => "transfer-queue",
            CopyQueueKind::SharedStandIn => "stand-in-queue",
        }
    }

    /// What the queue is, in words.
    pub fn describe(self) -> &'static str {
        match self {
            CopyQueueKind::SameFamily => "a second queue of wgpu's queue family",
            CopyQueueKind::TransferFamily => "a queue of a transfer-only family",
            CopyQueueKind::SharedStandIn => "wgpu's own queue, standing in for a second one the adapter lacks",
        }
    }
}

/// Which extra queues a device asks for, from its adapter's queue families: `(flags, queue count)`
/// each, wgpu's family first (wgpu-hal opens family 0). A second queue of family 0 where it has two;
/// the first family that copies but neither draws nor computes.
// Used by the Vulkan opening only (and its test), which other platforms lack.
#[cfg_attr(not(any(target_os = "linux", target_os = "windows")), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueuePlan {
    pub(crate) same_family: bool,
    pub(crate) transfer_family: Option<u32>,
}

// Used by the Vulkan opening only (and its test), which other platforms lack.
#[cfg_attr(not(any(target_os = "linux", target_os = "windows")), allow(dead_code))]
impl QueuePlan {
    pub(crate) fn of(families: &[(QueueAbilities, u32)]) -> QueuePlan {
        let same_family = families.first().is_some_and(|&(_, count)| count >= 2);
        let transfer_family = families
            .iter()
            .position(|&(a, count)| count >= 1 && a.transfer && !a.graphics && !a.compute)
            .filter(|&i| i > 0)
            .map(|i| i as u32);
        QueuePlan { same_family, transfer_family }
    }
}

/// What a queue family can do, as far as choosing a copy queue goes.
// Used by the Vulkan opening only (and its test), which other platforms lack.
#[cfg_attr(not(any(target_os = "linux", target_os = "windows")), allow(dead_code))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct QueueAbilities {
    pub(crate) graphics: bool,
    pub(crate) compute: bool,
    pub(crate) transfer: bool,
}

/// One copy a copy queue makes: `size` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
pub(in crate::device) struct BufferCopy<'a> {
    pub(in crate::device) src: &'a wgpu::Buffer,
    pub(in crate::device) src_offset: u64,
    pub(in crate::device) dst: &'a wgpu::Buffer,
    pub(in crate::device) dst_offset: u64,
    pub(in crate::device) size: u64,
}

impl GpuDevice {
    /// The copy queues this device was opened with (none off Vulkan).
    pub fn copy_queue_kinds(&self) -> Vec<CopyQueueKind> {
        self.copy_queues.iter().map(|q| q.kind()).collect()
    }

    /// Issues `copies` on the copy queue of `kind` and returns without waiting; [`Self::synchronize`]
    /// waits for them. Every buffer is one wgpu's queue is not using meanwhile (the caller's rule), so
    /// not while a copy route is set, whose order these copies would bypass.
    pub(in crate::device) fn copy_on_queue(&self, kind: CopyQueueKind, copies: &[BufferCopy<'_>]) -> Result<()> {
        if let Some(route) = self.copy_queue_in_use() {
            bail!("copies on the {} bypass the order kept by --copy-queue ({} in use): set it off first", kind.name(), route.name());
        }
        let queue = self.copy_queues.iter().find(|q| q.kind() == kind).with_context(|| format!("this device has no {}", kind.name()))?;
        for c in copies {
            let fits = |offset: u64, buffer: &wgpu::Buffer| offset.checked_add(c.size).is_some_and(|end| end <= buffer.size());
            let what = || {
                let (size, from, to) = (c.size, c.src_offset, c.dst_offset);
                format!(
                    "a copy of {size} bytes from offset {from} of a {}-byte buffer to offset {to} of a {}-byte one",
                    c.src.size(),
                    c.dst.size()
                )
            };
            if c.size == 0 {
                bail!("{}: empty", what());
            }
            if ![c.size, c.src_offset, c.dst_offset].iter().all(|n| n.is_multiple_of(4)) {
                bail!("{}: not whole 4-byte words", what());
            }
            if !fits(c.src_offset, c.src) || !fits(c.dst_offset, c.dst) {
                bail!("{}: out of range", what());
            }
        }
        queue.submit(copies, None, None)
    }

    /// Waits until every copy issued on the copy queues is done.
    pub(super) fn wait_for_copy_queues(&self) -> Result<()> {
        self.copy_queues.iter().try_for_each(|q| q.wait_idle())
    }
}

#[cfg(any(target_os = "linux", target_os = "windows"))]
pub(super) use vulkan::{CopyQueue, WAIT_LIMIT, open_with_queues, raw_buffer, raw_handles};

#[cfg(any(target_os = "linux", target_os = "windows"))]
mod vulkan {
    use std::cell::RefCell;
    use std::time::Duration;

    use anyhow::{Context, Result, anyhow};
    use ash::vk;
    use wgpu::hal::api::Vulkan;

    use super::{BufferCopy, CopyQueueKind, QueueAbilities, QueuePlan};

    /// How long a wait for a copy queue may take before it is called a hung device.
    pub(in crate::device::gpu) const WAIT_LIMIT: Duration = Duration::from_secs(120);

    /// The priorities of the queues asked for (Vulkan wants one per queue; all equal).
    static PRIORITIES: [f32; 2] = [1.0, 1.0];

    /// One copy queue: its command pool and the submissions still in flight (their fence, command
    /// buffer and the buffers they copy, kept alive until the fence signals).
    pub(in crate::device::gpu) struct CopyQueue {
        kind: CopyQueueKind,
        /// Keeps the Vulkan device alive while this queue's objects are.
        _device: wgpu::Device,
        raw: ash::Device,
        queue: vk::Queue,
        pool: vk::CommandPool,
        in_flight: RefCell<Vec<Submitted>>,
        /// Fences and command buffers of finished submissions, reset, for the next.
        spare: RefCell<Vec<(vk::Fence, vk::CommandBuffer)>>,
    }

    struct Submitted {
        fence: vk::Fence,
        commands: vk::CommandBuffer,
        _buffers: Vec<wgpu::Buffer>,
    }

    /// Opens `adapter` as `request_device` would, with the extra queues its families allow asked for
    /// beside wgpu's: the device, wgpu's queue, and a [`CopyQueue`] per extra queue (the stand-in on
    /// wgpu's queue where there is none). `Ok(None)`: not a Vulkan adapter.
    #[allow(clippy::type_complexity)]
    pub(in crate::device::gpu) fn open_with_queues(
        adapter: &wgpu::Adapter,
        desc: &wgpu::DeviceDescriptor<'_>,
    ) -> Result<Option<(wgpu::Device, wgpu::Queue, Vec<CopyQueue>)>> {
        // SAFETY: the hal adapter is only read (its queue families) and opened once below, as wgpu's
        // own `request_device` opens it.
        let Some(hal_adapter) = (unsafe { adapter.as_hal::<Vulkan>() }) else { return Ok(None) };
        let instance = hal_adapter.shared_instance().raw_instance();
        // SAFETY: the physical device belongs to this instance.
        let families = unsafe { instance.get_physical_device_queue_family_properties(hal_adapter.raw_physical_device()) };
        let abilities: Vec<(QueueAbilities, u32)> = families
            .iter()
            .map(|f| {
                let has = |flag| f.queue_flags.contains(flag);
                let a = QueueAbilities {
                    graphics: has(vk::QueueFlags::GRAPHICS),
                    compute: has(vk::QueueFlags::COMPUTE),
                    transfer: has(vk::QueueFlags::TRANSFER),
                };
                (a, f.queue_count)
            })
            .collect();
        let plan = QueuePlan::of(&abilities);
        let callback = Box::new(move |args: wgpu::hal::vulkan::CreateDeviceCallbackArgs<'_, '_, '_>| {
            if plan.same_family
                && let Some(first) = args.queue_create_infos.first_mut()
            {
                *first = first.queue_priorities(&PRIORITIES);
            }
            if let Some(family) = plan.transfer_family {
                args.queue_create_infos
                    .push(vk::DeviceQueueCreateInfo::default().queue_family_index(family).queue_priorities(&PRIORITIES[..1]));
            }
        });
        // SAFETY: the callback only adds queues the adapter lists (a second of family 0 where it has
        // two or more, the first of a transfer family). `request_device`'s checks of features and limits
        // against the adapter are skipped on this path; `desc` asks for what the adapter offers.
        let open =
            unsafe { hal_adapter.open_with_callback(desc.required_features, &desc.required_limits, &desc.memory_hints, Some(callback)) }
                .map_err(|e| anyhow!("opening the Vulkan device with copy queues: {e}"))?;
        let raw = open.device.raw_device().clone();
        let wgpu_queue = open.device.raw_queue();
        let mut extra = Vec::new();
        if plan.same_family {
            // SAFETY: the device was made with two queues of family 0.
            extra.push((CopyQueueKind::SameFamily, 0, unsafe { raw.get_device_queue(0, 1) }));
        }
        if let Some(family) = plan.transfer_family {
            // SAFETY: the device was made with one queue of this family.
            extra.push((CopyQueueKind::TransferFamily, family, unsafe { raw.get_device_queue(family, 0) }));
        }
        // Without a second queue of wgpu's family (the one `--copy-queue` takes), wgpu's own stands in.
        if !plan.same_family {
            extra.push((CopyQueueKind::SharedStandIn, 0, wgpu_queue));
        }
        drop(hal_adapter);
        // SAFETY: `open` was made from this adapter with `desc`'s features.
        let (device, queue) = unsafe { adapter.create_device_from_hal(open, desc) }.context("handing the Vulkan device to wgpu")?;
        let queues =
            extra.into_iter().map(|(kind, family, q)| CopyQueue::new(kind, &device, raw.clone(), family, q)).collect::<Result<_>>()?;
        Ok(Some((device, queue, queues)))
    }

    impl CopyQueue {
        fn new(kind: CopyQueueKind, device: &wgpu::Device, raw: ash::Device, family: u32, queue: vk::Queue) -> Result<Self> {
            let info =
                vk::CommandPoolCreateInfo::default().queue_family_index(family).flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
            // SAFETY: a valid create info on a live device; the pool is destroyed in Drop.
            let pool = unsafe { raw.create_command_pool(&info, None) }.map_err(|e| anyhow!("vkCreateCommandPool: {e}"))?;
            Ok(CopyQueue { kind, _device: device.clone(), raw, queue, pool, in_flight: RefCell::default(), spare: RefCell::default() })
        }

        pub(in crate::device::gpu) fn kind(&self) -> CopyQueueKind {
            self.kind
        }

        /// A reset fence and command buffer: a spare one (finished submissions' first), or new.
        fn take_spare(&self) -> Result<(vk::Fence, vk::CommandBuffer)> {
            self.recycle_finished()?;
            if let Some(spare) = self.spare.borrow_mut().pop() {
                return Ok(spare);
            }
            // SAFETY: valid create infos on a live device; both are freed in Drop.
            let fence =
                unsafe { self.raw.create_fence(&vk::FenceCreateInfo::default(), None) }.map_err(|e| anyhow!("vkCreateFence: {e}"))?;
            let alloc = vk::CommandBufferAllocateInfo::default()
                .command_pool(self.pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            // SAFETY: as above.
            let commands = unsafe { self.raw.allocate_command_buffers(&alloc) }.map_err(|e| anyhow!("vkAllocateCommandBuffers: {e}"))?[0];
            Ok((fence, commands))
        }

        /// Moves the submissions whose fences have signalled to the spares, reset, without waiting.
        fn recycle_finished(&self) -> Result<()> {
            let mut in_flight = self.in_flight.borrow_mut();
            let mut i = 0;
            while i < in_flight.len() {
                // SAFETY: the fence is live (made here, destroyed only in Drop).
                let done = unsafe { self.raw.get_fence_status(in_flight[i].fence) }.map_err(|e| anyhow!("vkGetFenceStatus: {e}"))?;
                if done {
                    let s = in_flight.swap_remove(i);
                    self.keep_spare(s.fence, s.commands)?;
                } else {
                    i += 1;
                }
            }
            Ok(())
        }

        /// Resets a finished (or never submitted) submission's fence and command buffer and keeps them
        /// for the next; where a reset fails, frees both instead (nothing uses them any more).
        fn keep_spare(&self, fence: vk::Fence, commands: vk::CommandBuffer) -> Result<()> {
            // SAFETY: the submission is done (its fence signalled) or was never made, so both may be
            // reset, or destroyed.
            unsafe {
                let reset = self.raw.reset_fences(&[fence]).map_err(|e| anyhow!("vkResetFences: {e}")).and_then(|()| {
                    self.raw
                        .reset_command_buffer(commands, vk::CommandBufferResetFlags::empty())
                        .map_err(|e| anyhow!("vkResetCommandBuffer: {e}"))
                });
                if let Err(e) = reset {
                    self.raw.destroy_fence(fence, None);
                    self.raw.free_command_buffers(self.pool, &[commands]);
                    return Err(e);
                }
            }
            self.spare.borrow_mut().push((fence, commands));
            Ok(())
        }

        /// Records `copies` into one command buffer and submits it, fenced (see [`Self::submit_resolved`]).
        pub(in crate::device::gpu) fn submit(
            &self,
            copies: &[BufferCopy<'_>],
            wait: Option<(vk::Semaphore, u64)>,
            signal: Option<(vk::Semaphore, u64)>,
        ) -> Result<()> {
            self.submit_resolved(copies, &raw_handles(copies)?, wait, signal)
        }

        /// Records `copies` (whose Vulkan handles are `handles`, source and destination per copy) into
        /// one command buffer, between a barrier after this queue's earlier copies and one that makes
        /// the writes visible to the host, and submits it, fenced; where given, after the timeline
        /// semaphore `wait` reaches its value (before any copy starts), and signalling `signal`'s value
        /// when done. On an error nothing was submitted, and the fence and command buffer are kept for
        /// the next (leaked where the device was lost).
        pub(in crate::device::gpu) fn submit_resolved(
            &self,
            copies: &[BufferCopy<'_>],
            handles: &[[vk::Buffer; 2]],
            wait: Option<(vk::Semaphore, u64)>,
            signal: Option<(vk::Semaphore, u64)>,
        ) -> Result<()> {
            let (fence, commands) = self.take_spare()?;
            if let Err(e) = self.record_and_submit(commands, fence, copies, handles, wait, signal) {
                // A lost device leaves the fence and command buffer in no known state: leaked. Else
                // nothing was submitted: both are kept for the next, reset (an unsignalled fence
                // resets too).
                let lost = e.root_cause().downcast_ref::<vk::Result>() == Some(&vk::Result::ERROR_DEVICE_LOST);
                if !lost && let Err(reset) = self.keep_spare(fence, commands) {
                    return Err(e.context(format!("and resetting its command buffer failed too: {reset:#}")));
                }
                return Err(e);
            }
            let kept = copies.iter().flat_map(|c| [c.src.clone(), c.dst.clone()]).collect();
            self.in_flight.borrow_mut().push(Submitted { fence, commands, _buffers: kept });
            Ok(())
        }

        fn record_and_submit(
            &self,
            commands: vk::CommandBuffer,
            fence: vk::Fence,
            copies: &[BufferCopy<'_>],
            handles: &[[vk::Buffer; 2]],
            wait: Option<(vk::Semaphore, u64)>,
            signal: Option<(vk::Semaphore, u64)>,
        ) -> Result<()> {
            let raw = &self.raw;
            // After the copies submitted before on this queue: nothing else orders two copy
            // submissions that touch the same bytes (an upload and the read-back of it).
            let after_copies = (vk::PipelineStageFlags::TRANSFER, vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE);
            let to_host = (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ);
            // SAFETY: the command buffer is reset (new, or reset with its fence after its submission
            // finished or failed) and recorded by this thread only; every buffer handle is live (the
            // wgpu buffers are kept in `in_flight` until the fence signals).
            unsafe {
                let begin = vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
                raw.begin_command_buffer(commands, &begin).map_err(|e| anyhow!("vkBeginCommandBuffer: {e}"))?;
                self.barrier_after_copies(commands, after_copies);
                for (c, [src, dst]) in copies.iter().zip(handles) {
                    let region = vk::BufferCopy { src_offset: c.src_offset, dst_offset: c.dst_offset, size: c.size };
                    raw.cmd_copy_buffer(commands, *src, *dst, &[region]);
                }
                self.barrier_after_copies(commands, to_host);
                raw.end_command_buffer(commands).map_err(|e| anyhow!("vkEndCommandBuffer: {e}"))?;
                let buffers = [commands];
                let (wait_sems, wait_values): (Vec<_>, Vec<_>) = wait.into_iter().unzip();
                let (signal_sems, signal_values): (Vec<_>, Vec<_>) = signal.into_iter().unzip();
                let stages = vec![vk::PipelineStageFlags::TRANSFER; wait_sems.len()];
                let mut timeline =
                    vk::TimelineSemaphoreSubmitInfo::default().wait_semaphore_values(&wait_values).signal_semaphore_values(&signal_values);
                let mut submit = vk::SubmitInfo::default().command_buffers(&buffers);
                if !wait_sems.is_empty() || !signal_sems.is_empty() {
                    submit = submit
                        .wait_semaphores(&wait_sems)
                        .wait_dst_stage_mask(&stages)
                        .signal_semaphores(&signal_sems)
                        .push_next(&mut timeline);
                }
                raw.queue_submit(self.queue, &[submit], fence)
                    .map_err(|e| anyhow::Error::new(e).context(format!("vkQueueSubmit on the {}", self.kind.name())))
            }
        }

        /// Records a barrier from the copies' writes (transfer stage) to `(stage, access)`.
        ///
        /// # Safety
        /// `commands` is recording, on this thread.
        unsafe fn barrier_after_copies(&self, commands: vk::CommandBuffer, (stage, access): (vk::PipelineStageFlags, vk::AccessFlags)) {
            let barrier = vk::MemoryBarrier::default().src_access_mask(vk::AccessFlags::TRANSFER_WRITE).dst_access_mask(access);
            // SAFETY: the caller's.
            unsafe {
                self.raw.cmd_pipeline_barrier(
                    commands,
                    vk::PipelineStageFlags::TRANSFER,
                    stage,
                    vk::DependencyFlags::empty(),
                    &[barrier],
                    &[],
                    &[],
                )
            }
        }

        /// Waits for every submission in flight and keeps their fences and command buffers, reset.
        /// Where the wait fails (a lost or hung device) they stay in flight.
        pub(in crate::device::gpu) fn wait_idle(&self) -> Result<()> {
            let fences: Vec<vk::Fence> = self.in_flight.borrow().iter().map(|s| s.fence).collect();
            if fences.is_empty() {
                return Ok(());
            }
            // SAFETY: the fences are live and were submitted with their command buffers.
            unsafe { self.raw.wait_for_fences(&fences, true, WAIT_LIMIT.as_nanos() as u64) }.map_err(|e| {
                anyhow!("waiting for the {} ({} submissions, {} s at most): {e}", self.kind.name(), fences.len(), WAIT_LIMIT.as_secs())
            })?;
            let done: Vec<Submitted> = self.in_flight.borrow_mut().drain(..).collect();
            // Every one kept or freed, the first failure reported.
            let kept: Vec<Result<()>> = done.into_iter().map(|s| self.keep_spare(s.fence, s.commands)).collect();
            kept.into_iter().collect()
        }
    }

    impl Drop for CopyQueue {
        fn drop(&mut self) {
            if let Err(e) = self.wait_idle()
                && !self.in_flight.borrow().is_empty()
            {
                // Its submissions may still run (a hung device): their objects and buffers are leaked
                // rather than freed under them. (With none left in flight, only a reset failed: the
                // copies are done, and what is left is freed below.)
                eprintln!("warning: the {} did not finish its copies ({e:#}); its command pool is leaked", self.kind.name());
                std::mem::forget(std::mem::take(&mut *self.in_flight.borrow_mut()));
                return;
            }
            let spare = std::mem::take(&mut *self.spare.borrow_mut());
            // SAFETY: nothing of this queue's is in flight (waited for above); the device outlives
            // this (held by `_device`).
            unsafe {
                for (fence, commands) in spare {
                    self.raw.destroy_fence(fence, None);
                    self.raw.free_command_buffers(self.pool, &[commands]);
                }
                self.raw.destroy_command_pool(self.pool, None);
            }
        }
    }

    /// The Vulkan handle of a wgpu buffer (None: not a Vulkan buffer).
    pub(in crate::device::gpu) fn raw_buffer(buffer: &wgpu::Buffer) -> Option<vk::Buffer> {
        // SAFETY: the handle is only compared, used as a key, or recorded into a copy whose
        // submission keeps the buffer alive until it is done.
        let hal = unsafe { buffer.as_hal::<Vulkan>() }?;
        // SAFETY: as above.
        Some(unsafe { hal.raw_handle() })
    }

    /// The Vulkan handles of each copy's source and destination.
    pub(in crate::device::gpu) fn raw_handles(copies: &[BufferCopy<'_>]) -> Result<Vec<[vk::Buffer; 2]>> {
        copies
            .iter()
            .map(|c| Some([raw_buffer(c.src)?, raw_buffer(c.dst)?]))
            .collect::<Option<_>>()
            .context("a copy-queue copy of a buffer of another backend")
    }
}

#[cfg(not(any(target_os = "linux", target_os = "windows")))]
pub(super) use elsewhere::{CopyQueue, open_with_queues};

#[cfg(not(any(target_os = "linux", target_os = "windows")))]
mod elsewhere {
    use anyhow::Result;

    use super::{BufferCopy, CopyQueueKind};

    /// No copy queues where wgpu does not run on Vulkan.
    pub(in crate::device::gpu) enum CopyQueue {}

    impl CopyQueue {
        pub(in crate::device::gpu) fn kind(&self) -> CopyQueueKind {
            match *self {}
        }
        pub(in crate::device::gpu) fn submit(&self, _copies: &[BufferCopy<'_>], _wait: Option<()>, _signal: Option<()>) -> Result<()> {
            match *self {}
        }
        pub(in crate::device::gpu) fn wait_idle(&self) -> Result<()> {
            match *self {}
        }
    }

    #[allow(clippy::type_complexity)]
    pub(in crate::device::gpu) fn open_with_queues(
        _adapter: &wgpu::Adapter,
        _desc: &wgpu::DeviceDescriptor<'_>,
    ) -> Result<Option<(wgpu::Device, wgpu::Queue, Vec<CopyQueue>)>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::{QueueAbilities, QueuePlan};

    /// NVIDIA's families (graphics+compute+transfer x16, transfer x2, compute+transfer x8, ...) ask
    /// for a second queue of family 0 and the transfer family; lavapipe's one family of one queue
    /// asks for none; a transfer-only family 0 is wgpu's own, never taken as the extra one.
    #[test]
    fn plans_the_queues_the_families_allow() {
        let all = QueueAbilities { graphics: true, compute: true, transfer: true };
        let copy = QueueAbilities { transfer: true, ..Default::default() };
        let compute = QueueAbilities { compute: true, transfer: true, ..Default::default() };
        let nvidia = [(all, 16), (copy, 2), (compute, 8)];
        assert_eq!(QueuePlan::of(&nvidia), QueuePlan { same_family: true, transfer_family: Some(1) });
        assert_eq!(QueuePlan::of(&[(all, 1)]), QueuePlan { same_family: false, transfer_family: None });
        assert_eq!(
            QueuePlan::of(&[(all, 1), (compute, 4), (copy, 0), (copy, 1)]),
            QueuePlan { same_family: false, transfer_family: Some(3) }
        );
        assert_eq!(QueuePlan::of(&[(copy, 1)]), QueuePlan { same_family: false, transfer_family: None });
        assert_eq!(QueuePlan::of(&[]), QueuePlan { same_family: false, transfer_family: None });
    }
}
