//! Copy queues beside wgpu's one queue (issue #22 item 4).
//!
//! wgpu gives a device one queue, and on the H200 copies on it ran one after the kernels (`bench
//! overlap`: 0.21 of a pinned upload hidden, none of a download), about 25 ms of a 216 ms GPT-2 step
//! (benches/results/2026-11-28-h200-analysis.md). Vulkan lets a device have more queues: a second
//! queue of the family wgpu uses, or one of a family that only copies (NVIDIA's DMA engines). A Vulkan
//! device asks for those when it opens, beside wgpu's own (through wgpu's Vulkan hal,
//! `open_with_callback`), and moves bytes on them with raw `vkCmdCopyBuffer`s, each submission fenced:
//! `bench overlap` times copies there beside kernels on wgpu's queue, and `--copy-queue` moves the
//! trainer's big uploads and read-backs to the second queue of wgpu's family (`gpu/copy_route.rs`).
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
pub(super) use vulkan::{CopyQueue, open_with_queues, raw_buffer, raw_handles};

#[cfg(any(target_os = "linux", target_os = "windows"))]
mod vulkan;

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
