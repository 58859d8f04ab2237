//! The Vulkan side of the copy queues (`gpu/copy_queue.rs`): opening the device with the extra
//! queues, and each queue's command pool, fenced submissions of raw `vkCmdCopyBuffer`s and their waits.
//! Linux and Windows only; a child of `gpu/copy_queue.rs`.

use std::cell::RefCell;

use anyhow::{Context, Result, anyhow};
use ash::vk;
use wgpu::hal::api::Vulkan;

use super::super::wait::{Slice, WaitLimits, wait_in_slices};
use super::{BufferCopy, CopyQueueKind, QueueAbilities, QueuePlan};

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
    let open = unsafe { hal_adapter.open_with_callback(desc.required_features, &desc.required_limits, &desc.memory_hints, Some(callback)) }
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
    let queues = extra.into_iter().map(|(kind, family, q)| CopyQueue::new(kind, &device, raw.clone(), family, q)).collect::<Result<_>>()?;
    Ok(Some((device, queue, queues)))
}

impl CopyQueue {
    fn new(kind: CopyQueueKind, device: &wgpu::Device, raw: ash::Device, family: u32, queue: vk::Queue) -> Result<Self> {
        let info = vk::CommandPoolCreateInfo::default().queue_family_index(family).flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
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
        // SAFETY: valid create infos on a live device; both are freed in Drop (or by `keep_spare`
        // where their reset fails).
        let fence = unsafe { self.raw.create_fence(&vk::FenceCreateInfo::default(), None) }.map_err(|e| anyhow!("vkCreateFence: {e}"))?;
        let alloc =
            vk::CommandBufferAllocateInfo::default().command_pool(self.pool).level(vk::CommandBufferLevel::PRIMARY).command_buffer_count(1);
        // SAFETY: as above.
        let commands = unsafe { self.raw.allocate_command_buffers(&alloc) }.map_err(|e| anyhow!("vkAllocateCommandBuffers: {e}"))?[0];
        Ok((fence, commands))
    }

    /// Moves the submissions whose fences have signalled to the spares, reset, without waiting.
    fn recycle_finished(&self) -> Result<()> {
        let mut in_flight = self.in_flight.borrow_mut();
        let mut i = 0;
        while i < in_flight.len() {
            // SAFETY: the fence is live (made here; destroyed in Drop, or by `keep_spare` once out of
            // `in_flight`).
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
    /// the next (freed where their reset fails, leaked where the device was lost).
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
            // resets too), or freed where a reset fails.
            let lost = e.root_cause().downcast_ref::<vk::Result>() == Some(&vk::Result::ERROR_DEVICE_LOST);
            if !lost && let Err(reset) = self.keep_spare(fence, commands) {
                return Err(e.context(format!("and resetting its fence and command buffer failed too (both freed): {reset:#}")));
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

    /// Waits for every submission in flight and keeps their fences and command buffers, reset (each
    /// pair whose reset fails freed instead, the first failure returned). Where the wait fails (a lost
    /// or hung device) they stay in flight.
    pub(in crate::device::gpu) fn wait_idle(&self) -> Result<()> {
        let fences: Vec<vk::Fence> = self.in_flight.borrow().iter().map(|s| s.fence).collect();
        if fences.is_empty() {
            return Ok(());
        }
        let what = || format!("the {}'s {} submissions", self.kind.name(), fences.len());
        wait_in_slices(&what, WaitLimits::current(), |slice| {
            // SAFETY: the fences are live and were submitted with their command buffers.
            match unsafe { self.raw.wait_for_fences(&fences, true, slice.as_nanos() as u64) } {
                Ok(()) => Ok(Slice::Done),
                Err(vk::Result::TIMEOUT) => Ok(Slice::TimedOut),
                Err(e) => Err(anyhow!("waiting for {}: {e}", what())),
            }
        })?;
        let done: Vec<Submitted> = self.in_flight.borrow_mut().drain(..).collect();
        // Every one kept or freed, the first failure reported.
        let kept: Vec<Result<()>> = done.into_iter().map(|s| self.keep_spare(s.fence, s.commands)).collect();
        kept.into_iter().collect()
    }
}

impl Drop for CopyQueue {
    fn drop(&mut self) {
        if let Err(e) = self.wait_idle() {
            if !self.in_flight.borrow().is_empty() {
                // Its submissions may still run (a hung device): their objects and buffers are
                // leaked rather than freed under them.
                eprintln!("warning: the {} did not finish its copies ({e:#}); its command pool is leaked", self.kind.name());
                std::mem::forget(std::mem::take(&mut *self.in_flight.borrow_mut()));
                return;
            }
            // None left in flight: the copies are done, only a reset failed (its pair freed); the
            // rest is freed below.
            eprintln!("warning: the {}'s finished copies could not be reset ({e:#})", self.kind.name());
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
