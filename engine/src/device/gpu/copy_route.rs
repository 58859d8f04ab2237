//! The trainer's big copies on a copy queue (`--copy-queue`, issue #22 item 4): uploads from pinned
//! host memory (the working copies) and read-backs into pinned host memory (the gradients) leave wgpu's
//! queue for a second queue of its family (`gpu/copy_queue.rs`), so that they can run while the
//! kernels do. A second queue of the same family needs no ownership transfers; a copy-only family's
//! would, so it is not used here.
//!
//! Order is kept on the device, by two timeline semaphores. Every submission of wgpu's queue signals
//! the next value of `compute`; every copy submission the next value of `copies`. A copy waits for
//! `compute` to reach the last submission that used any of its buffers, and a submission of wgpu's
//! queue waits for `copies` to reach the last copy that used any of its buffers. The buffers a
//! submission uses are gathered as its work is recorded ([`Route::track`]: each dispatch's bindings,
//! each copy, clear and queued write the device records on wgpu's queue), so a copy runs beside
//! kernels that do not touch its buffers, and never beside those that do: the same reads and writes
//! in the same order as on one queue, so the same bits. Every path training takes records its
//! buffers; `tests/train.rs` holds the runs to one queue's bits (on the stand-in here, where order is
//! kept by the one queue as well; on a GPU with a second queue, by the semaphores alone). Copies on
//! the copy queue are ordered among themselves by a barrier at the start of each. The host waits
//! for a read-back's copy, or a pinned region's, on `copies` ([`Timelines::wait_for_copy`]).
//!
//! wgpu zero-fills a buffer lazily, before its first use on wgpu's queue; a buffer a raw copy wrote
//! first would be zeroed after it. So each tensor is cleared on wgpu's queue before its first raw copy
//! (at creation while a route is set; `GpuTensor::ready_for_copies`), which wgpu counts as its
//! initialisation. A child module of `gpu`; Vulkan only (Linux and Windows).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use anyhow::{Result, bail};

use super::copy_queue::{BufferCopy, CopyQueueKind};
use super::{GpuDevice, GpuTensor};
use crate::device::ReadBack;

impl GpuDevice {
    /// `--copy-queue`: the big uploads (from pinned host memory) and read-backs (into it) run on a
    /// second queue of wgpu's family from now on (`on`), or on wgpu's own again. Read-backs go
    /// through pinned memory meanwhile wherever the adapter makes it (a mapped read-back can only
    /// be copied on wgpu's queue), whatever `tune` chose; turning the route off restores that
    /// choice. Where the adapter has no second queue, wgpu's own stands in (the same order, no
    /// overlap: for tests). Refused, naming the adapter, off Vulkan. Waits for the device's work first.
    pub fn set_copy_queue(&self, on: bool) -> Result<()> {
        if on == self.copy_route.borrow().is_some() {
            return Ok(());
        }
        self.synchronize();
        if !on {
            let route = self.copy_route.borrow_mut().take();
            if let Some(chosen) = route.and_then(|r| r.read_back_before.get()) {
                self.set_read_back(chosen)?;
            }
            return Ok(());
        }
        let Some((queue, kind)) = self.route_queue() else {
            bail!(
                "--copy-queue: adapter {:?} ({}) has no copy queue; copy queues are Vulkan's (Linux, Windows)",
                self.summary.name,
                self.summary.backend
            );
        };
        let route = Route::new(&self.device, queue, kind)?;
        let chosen = self.read_back();
        // Where the adapter makes no pinned read-backs, they stay mapped, on wgpu's queue.
        if chosen != ReadBack::Pinned && self.set_read_back(ReadBack::Pinned).is_ok() {
            route.read_back_before.set(Some(chosen));
        }
        *self.copy_route.borrow_mut() = Some(Rc::new(route));
        Ok(())
    }

    /// The copy queue `--copy-queue` takes (its index and kind): a second queue of wgpu's family, or
    /// wgpu's own standing in. A transfer-only family's is never taken: training's tensors would need
    /// ownership transfers between the families.
    fn route_queue(&self) -> Option<(usize, CopyQueueKind)> {
        let usable = [CopyQueueKind::SameFamily, CopyQueueKind::SharedStandIn];
        self.copy_queue_kinds().into_iter().enumerate().find(|(_, k)| usable.contains(k))
    }

    /// Why `--copy-queue` cannot move both uploads and read-backs here (`selftest` leaves its check out
    /// then), or None: no queue it may take, no pinned host memory, or no timeline semaphores.
    pub fn copy_queue_unavailable(&self) -> Option<String> {
        let Some((queue, kind)) = self.route_queue() else {
            return Some(format!("no copy queue on {} (copy queues are Vulkan's: Linux, Windows)", self.summary.backend));
        };
        if let Some(why) = self.pinned_read_back_unavailable() {
            return Some(format!("no pinned host memory for its copies: {why}"));
        }
        Route::new(&self.device, queue, kind).err().map(|e| format!("{e:#}"))
    }

    /// Bytes uploaded and read back on the copy queue since `--copy-queue` was last set on.
    pub fn copy_queue_bytes(&self) -> (u64, u64) {
        self.route().map_or((0, 0), |r| (r.up_bytes.get(), r.down_bytes.get()))
    }

    /// The copy queue the big copies take (`--copy-queue`), or None: wgpu's queue.
    pub fn copy_queue_in_use(&self) -> Option<CopyQueueKind> {
        self.copy_route.borrow().as_ref().map(|r| r.kind)
    }

    pub(super) fn route(&self) -> Option<Rc<Route>> {
        self.copy_route.borrow().clone()
    }

    /// Counts `buffers` as used by the next submission of wgpu's queue, where a route keeps order.
    pub(super) fn track_uses(&self, buffers: &[&wgpu::Buffer]) {
        if let Some(route) = self.route() {
            route.track(buffers.iter().copied());
        }
    }

    /// Where a route is set, the read-back is into pinned memory (`pinned`: its buffer) and every
    /// tensor is ready for raw copies: `tensors` copied into it on the copy queue, and what the host
    /// waits on; else None (the caller copies on wgpu's queue). Flushes wgpu's queue first, so the
    /// copy comes after the work recorded so far.
    pub(super) fn read_on_copy_queue(
        &self,
        tensors: &[&GpuTensor],
        sizes: &[u64],
        pinned: Option<&wgpu::Buffer>,
    ) -> Option<(Arc<Timelines>, u64)> {
        let route = self.route()?;
        let pinned = pinned.filter(|_| tensors.iter().all(|t| t.ready_for_copies))?;
        self.flush();
        let mut offset = 0;
        let mut copies = Vec::new();
        for (t, &size) in tensors.iter().zip(sizes) {
            if size > 0 {
                copies.push(BufferCopy { src: &t.buffer, src_offset: 0, dst: pinned, dst_offset: offset, size });
            }
            offset += size;
        }
        let value =
            route.copy(&self.copy_queues[route.queue], &copies).unwrap_or_else(|e| panic!("GPU copy queue failed on a read-back: {e:#}"));
        route.down_bytes.set(route.down_bytes.get() + sizes.iter().sum::<u64>());
        Some((route.timelines(), value))
    }
}

/// Which copy queue the trainer's copies take, what moved there, and the order kept (`Order`).
pub(super) struct Route {
    /// Its index among the device's copy queues.
    pub(super) queue: usize,
    pub(super) kind: CopyQueueKind,
    /// Bytes moved up (pinned uploads) and down (pinned read-backs) on the copy queue.
    pub(super) up_bytes: Cell<u64>,
    pub(super) down_bytes: Cell<u64>,
    /// The read-back kind chosen before the route moved read-backs to pinned memory, restored after
    /// (None: nothing to restore, or a later choice stands: [`Self::keep_read_back`]).
    read_back_before: Cell<Option<ReadBack>>,
    order: Order,
}

impl Route {
    fn new(device: &wgpu::Device, queue: usize, kind: CopyQueueKind) -> Result<Self> {
        Ok(Route {
            queue,
            kind,
            up_bytes: Cell::new(0),
            down_bytes: Cell::new(0),
            read_back_before: Cell::new(None),
            order: Order::new(device)?,
        })
    }

    /// A read-back kind set while the route is on stands after it, too.
    pub(super) fn keep_read_back(&self) {
        self.read_back_before.set(None);
    }
}

impl std::ops::Deref for Route {
    type Target = Order;
    fn deref(&self) -> &Order {
        &self.order
    }
}

#[cfg(any(target_os = "linux", target_os = "windows"))]
pub(super) use vulkan::{Order, Timelines};

#[cfg(any(target_os = "linux", target_os = "windows"))]
mod vulkan {
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use anyhow::{Result, anyhow};
    use ash::vk;
    use wgpu::hal::api::Vulkan;

    use super::super::copy_queue::{BufferCopy, CopyQueue, raw_buffer, raw_handles};
    use super::super::wait::{Slice, WaitLimits, wait_in_slices};

    /// Entries kept per map before those every queue has passed are pruned.
    const PRUNE_AT: usize = 4096;

    /// The two timeline semaphores, shared with the pinned regions whose host writes wait on `copies`
    /// (on the AdamW thread), and destroyed when the last holder goes.
    pub(in crate::device::gpu) struct Timelines {
        /// Keeps the Vulkan device alive while the semaphores are.
        _device: wgpu::Device,
        raw: ash::Device,
        compute: vk::Semaphore,
        copies: vk::Semaphore,
        /// The last values a submission of wgpu's queue and of the copy queue signal, for the wait
        /// before the semaphores go.
        last_compute: AtomicU64,
        last_copy: AtomicU64,
    }

    impl Timelines {
        fn new(device: &wgpu::Device) -> Result<Self> {
            // SAFETY: only the hal device's handles are read.
            let hal = unsafe { device.as_hal::<Vulkan>() }.ok_or_else(|| anyhow!("copy queues need the Vulkan backend"))?;
            // The timeline functions used are Vulkan 1.2's own, and wgpu enables the feature where the
            // device has it.
            let instance = hal.shared_instance().raw_instance();
            // SAFETY: the physical device belongs to this instance.
            let api = unsafe { instance.get_physical_device_properties(hal.raw_physical_device()) }.api_version;
            if vk::api_version_major(api) == 1 && vk::api_version_minor(api) < 2 {
                anyhow::bail!(
                    "--copy-queue needs Vulkan 1.2's timeline semaphores; this device offers Vulkan 1.{}",
                    vk::api_version_minor(api)
                );
            }
            let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
            let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut v12);
            // SAFETY: as above; a 1.2 device answers the 1.2 feature query.
            unsafe { instance.get_physical_device_features2(hal.raw_physical_device(), &mut features) };
            if v12.timeline_semaphore != vk::TRUE {
                anyhow::bail!("--copy-queue needs timeline semaphores, which this Vulkan device lacks");
            }
            let raw = hal.raw_device().clone();
            drop(hal);
            let make = || {
                let mut kind = vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::TIMELINE).initial_value(0);
                let info = vk::SemaphoreCreateInfo::default().push_next(&mut kind);
                // SAFETY: a valid create info on a live device; destroyed in Drop.
                unsafe { raw.create_semaphore(&info, None) }
                    .map_err(|e| anyhow!("a timeline semaphore (Vulkan 1.2's timelineSemaphore): {e}"))
            };
            let compute = make()?;
            let copies = make().inspect_err(|_| {
                // SAFETY: made above, used by nothing yet.
                unsafe { raw.destroy_semaphore(compute, None) }
            })?;
            Ok(Timelines { _device: device.clone(), raw, compute, copies, last_compute: AtomicU64::new(0), last_copy: AtomicU64::new(0) })
        }

        /// Blocks until the copies up to `value` are done (within the wait limit).
        pub(in crate::device::gpu) fn wait_for_copy(&self, value: u64) -> Result<()> {
            self.wait(&[self.copies], &[value]).map_err(|e| anyhow!("waiting for copy {value} on the copy queue: {e}"))
        }

        /// Blocks until each semaphore reaches its value (within the wait limit).
        fn wait(&self, semaphores: &[vk::Semaphore], values: &[u64]) -> Result<()> {
            let info = vk::SemaphoreWaitInfo::default().semaphores(semaphores).values(values);
            let what = || format!("the copy queue's timeline at {values:?}");
            wait_in_slices(&what, WaitLimits::current(), |slice| {
                // SAFETY: the semaphores are live (destroyed only in Drop).
                match unsafe { self.raw.wait_semaphores(&info, slice.as_nanos() as u64) } {
                    Ok(()) => Ok(Slice::Done),
                    Err(vk::Result::TIMEOUT) => Ok(Slice::TimedOut),
                    Err(e) => Err(anyhow!("{e}")),
                }
            })
        }

        fn reached(&self, semaphore: vk::Semaphore) -> u64 {
            // SAFETY: the semaphore is live. A lost device reads as nothing reached: no pruning.
            unsafe { self.raw.get_semaphore_counter_value(semaphore) }.unwrap_or(0)
        }
    }

    impl Drop for Timelines {
        fn drop(&mut self) {
            // Nothing may still wait on or signal them. Every submission that names them signals one
            // (each of wgpu's signals `compute`, each copy `copies`), so the last values cover them
            // all; waiting on the semaphores themselves (not polling wgpu's device) keeps this short
            // on whichever thread lets them go (a pinned region's, on the AdamW thread).
            let values = [self.last_compute.load(Ordering::Acquire), self.last_copy.load(Ordering::Acquire)];
            if let Err(e) = self.wait(&[self.compute, self.copies], &values) {
                // A hung queue may still use them: leaked rather than destroyed under it, with the
                // device they belong to.
                eprintln!("warning: --copy-queue's semaphores are leaked: their last submissions did not finish ({e:#})");
                std::mem::forget(self._device.clone());
                return;
            }
            // SAFETY: no submission in flight refers to them any more (waited for above); the device
            // is alive (held by `_device`).
            unsafe {
                self.raw.destroy_semaphore(self.compute, None);
                self.raw.destroy_semaphore(self.copies, None);
            }
        }
    }

    /// The order kept between wgpu's queue and a copy queue.
    pub(in crate::device::gpu) struct Order {
        timelines: Arc<Timelines>,
        compute_value: Cell<u64>,
        copy_value: Cell<u64>,
        /// Per buffer, the last value of `compute` (a submission of wgpu's queue) and of `copies`
        /// that used it. A freed buffer's handle may come back for another; its stale value is one
        /// already reached or soon to be, so it costs at most a wait that was due anyway.
        last_compute: RefCell<HashMap<vk::Buffer, u64>>,
        last_copy: RefCell<HashMap<vk::Buffer, u64>>,
        /// The buffers the work recorded since the last submission of wgpu's queue uses.
        pending: RefCell<Vec<vk::Buffer>>,
        /// The values the maps' pruned entries had reached, (compute, copies): a buffer not found
        /// may be one of them, so every wait is at least for these (already reached, so free), which
        /// keeps the memory dependency the pruned entry's wait would have made.
        pruned: Cell<(u64, u64)>,
    }

    impl Order {
        pub(in crate::device::gpu) fn new(device: &wgpu::Device) -> Result<Self> {
            Ok(Order {
                timelines: Arc::new(Timelines::new(device)?),
                compute_value: Cell::new(0),
                copy_value: Cell::new(0),
                last_compute: RefCell::default(),
                last_copy: RefCell::default(),
                pending: RefCell::default(),
                pruned: Cell::new((0, 0)),
            })
        }

        /// Counts `buffers` as used by the next submission of wgpu's queue.
        pub(in crate::device::gpu) fn track<'b>(&self, buffers: impl IntoIterator<Item = &'b wgpu::Buffer>) {
            let mut pending = self.pending.borrow_mut();
            pending.extend(buffers.into_iter().filter_map(raw_buffer));
        }

        /// Whether recorded work uses buffers no submission has carried yet.
        pub(in crate::device::gpu) fn has_pending(&self) -> bool {
            !self.pending.borrow().is_empty()
        }

        /// Sets up wgpu's next submission: a wait for the copies its buffers wait on, and the signal
        /// of `compute`'s next value, which it returns for [`Self::after_submit`].
        pub(in crate::device::gpu) fn before_submit(&self, queue: &wgpu::Queue) -> u64 {
            let value = self.compute_value.get() + 1;
            let last_copy = self.last_copy.borrow();
            let need = self.pending.borrow().iter().filter_map(|b| last_copy.get(b)).copied().max().unwrap_or(0).max(self.pruned.get().1);
            // SAFETY: the semaphores are live (held by `timelines`) and timeline ones; the wait's value
            // was signalled by a copy already submitted, the signal's is the next one.
            let hal = unsafe { queue.as_hal::<Vulkan>() }.expect("a route exists only on a Vulkan device");
            if need > 0 {
                hal.add_wait_semaphore(self.timelines.copies, Some(need), vk::PipelineStageFlags::ALL_COMMANDS);
            }
            hal.add_signal_semaphore(self.timelines.compute, Some(value));
            value
        }

        /// Records that the submission set up by [`Self::before_submit`] (its `value`) used the pending
        /// buffers. Where wgpu never handed it to Vulkan (validation refused it), the wait and signal
        /// still queued are taken back and nothing is recorded, so the next submission signals `value`.
        pub(in crate::device::gpu) fn after_submit(&self, queue: &wgpu::Queue, value: u64) {
            // SAFETY: only the pending semaphore lists of the hal queue are touched.
            let hal = unsafe { queue.as_hal::<Vulkan>() }.expect("a route exists only on a Vulkan device");
            if hal.remove_signal_semaphore(self.timelines.compute) {
                hal.remove_wait_semaphore(self.timelines.copies);
                return;
            }
            self.compute_value.set(value);
            self.timelines.last_compute.store(value, Ordering::Release);
            let mut last = self.last_compute.borrow_mut();
            for b in self.pending.borrow_mut().drain(..) {
                last.insert(b, value);
            }
            if last.len() > PRUNE_AT {
                let reached = self.timelines.reached(self.timelines.compute);
                last.retain(|_, v| *v > reached);
                self.pruned.set((reached.max(self.pruned.get().0), self.pruned.get().1));
            }
        }

        /// Submits `copies` on `queue` once wgpu's queue is done with their buffers; returns the value
        /// of `copies` that says they are done.
        pub(in crate::device::gpu) fn copy(&self, queue: &CopyQueue, copies: &[BufferCopy<'_>]) -> Result<u64> {
            let handles = raw_handles(copies)?;
            let buffers: Vec<vk::Buffer> = handles.iter().flatten().copied().collect();
            let after = {
                let last = self.last_compute.borrow();
                buffers.iter().filter_map(|b| last.get(b)).copied().max().unwrap_or(0).max(self.pruned.get().0)
            };
            let value = self.copy_value.get() + 1;
            let wait = (after > 0).then_some((self.timelines.compute, after));
            queue.submit_resolved(copies, &handles, wait, Some((self.timelines.copies, value)))?;
            self.copy_value.set(value);
            self.timelines.last_copy.store(value, Ordering::Release);
            let mut last = self.last_copy.borrow_mut();
            for b in buffers {
                last.insert(b, value);
            }
            if last.len() > PRUNE_AT {
                let reached = self.timelines.reached(self.timelines.copies);
                last.retain(|_, v| *v > reached);
                self.pruned.set((self.pruned.get().0, reached.max(self.pruned.get().1)));
            }
            Ok(value)
        }

        /// The semaphores, for a wait on another thread (a pinned region's host write).
        pub(in crate::device::gpu) fn timelines(&self) -> Arc<Timelines> {
            self.timelines.clone()
        }
    }
}

#[cfg(not(any(target_os = "linux", target_os = "windows")))]
pub(super) use elsewhere::{Order, Timelines};

#[cfg(not(any(target_os = "linux", target_os = "windows")))]
mod elsewhere {
    use std::sync::Arc;

    use anyhow::Result;

    use super::super::copy_queue::{BufferCopy, CopyQueue};

    /// No routes where wgpu does not run on Vulkan.
    pub(in crate::device::gpu) enum Order {}
    pub(in crate::device::gpu) enum Timelines {}

    impl Timelines {
        pub(in crate::device::gpu) fn wait_for_copy(&self, _value: u64) -> Result<()> {
            match *self {}
        }
    }

    impl Order {
        pub(in crate::device::gpu) fn new(_device: &wgpu::Device) -> Result<Self> {
            anyhow::bail!("copy queues need the Vulkan backend (Linux or Windows)")
        }
        pub(in crate::device::gpu) fn track<'b>(&self, _buffers: impl IntoIterator<Item = &'b wgpu::Buffer>) {
            match *self {}
        }
        pub(in crate::device::gpu) fn has_pending(&self) -> bool {
            match *self {}
        }
        pub(in crate::device::gpu) fn before_submit(&self, _queue: &wgpu::Queue) -> u64 {
            match *self {}
        }
        pub(in crate::device::gpu) fn after_submit(&self, _queue: &wgpu::Queue, _value: u64) {
            match *self {}
        }
        pub(in crate::device::gpu) fn copy(&self, _queue: &CopyQueue, _copies: &[BufferCopy<'_>]) -> Result<u64> {
            match *self {}
        }
        pub(in crate::device::gpu) fn timelines(&self) -> Arc<Timelines> {
            match *self {}
        }
    }
}
