//! The device thread's NVMe traffic moved off its path, onto threads of their own:
//! - **read-ahead**: with the working copy on NVMe, the copy the next `Fetch` uploads is read while the
//!   block before it computes (`pipeline::Op::ReadAhead`);
//! - **write-behind**: with the gradient accumulator on NVMe, each group's gradient is written back
//!   after its addition while the next block computes.
//!
//! So the drive works beside the computation instead of after it. On the cpu device, whose kernels run
//! on the device thread itself, it otherwise never does (on a GPU the device thread already reads while
//! the device computes; the write-behind still frees it to submit the next block). Each thread has its
//! own I/O queue (the engine's rings and pools are per thread). One job of each kind is in flight at most:
//! the next waits for it first (and so does the update, for the writes). A copy read ahead is taken
//! by its upload, which pages it out as it would one it read itself; so the bytes moved and the RAM
//! held are the schedule's either way.

use std::cell::Cell;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use anyhow::{Context, Result, anyhow};
use zerostream_offload::NvmeDir;

use super::worker::{SharedGroup, lock};

/// What a [`BackgroundIo`] thread does to a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Job {
    /// Page the working copy in (nothing if it is resident).
    ReadWorking,
    /// Write the resident gradient accumulator back and page it out (nothing if it is paged out).
    WriteGrads,
}

impl Job {
    fn name(self) -> &'static str {
        match self {
            Job::ReadWorking => "read-ahead",
            Job::WriteGrads => "write-behind",
        }
    }
}

pub(super) struct BackgroundIo {
    job: Job,
    shared: Arc<Vec<Mutex<SharedGroup>>>,
    nvme: Arc<NvmeDir>,
    /// Groups to work on, to the thread; closed (None) to stop it.
    requests: Option<Sender<usize>>,
    /// Each job's outcome, in order: the bytes it moved (0: the group was resident already, or paged
    /// out already).
    done: Receiver<Result<u64>>,
    /// The group whose job was begun and not yet waited for.
    pending: Cell<Option<usize>>,
    /// Bytes moved so far (each job counted once it is waited for).
    moved_bytes: Cell<u64>,
    /// Taken to join the thread: when it stops, or to learn why it stopped early.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl BackgroundIo {
    /// Starts a thread that does `job` to the groups it is given, through `nvme`.
    pub(super) fn start(job: Job, shared: Arc<Vec<Mutex<SharedGroup>>>, nvme: Arc<NvmeDir>) -> Result<Self> {
        let (requests, to_do) = channel::<usize>();
        let (report, done) = channel();
        let (groups, dir) = (shared.clone(), nvme.clone());
        let thread = std::thread::Builder::new()
            .name(job.name().into())
            .spawn(move || {
                for k in to_do {
                    let mut group = lock(&groups[k]);
                    let moved = match job {
                        Job::ReadWorking => {
                            let was_resident = group.working.is_resident();
                            let bytes = if was_resident { 0 } else { group.working.len_bytes() as u64 };
                            group.working.page_in(Some(&dir)).map(|()| bytes)
                        }
                        Job::WriteGrads => {
                            let bytes = if group.grads.is_resident() { group.grads.len_bytes() as u64 } else { 0 };
                            group.grads.page_out(Some(&dir), true).map(|()| bytes)
                        }
                    };
                    drop(group);
                    if report.send(moved.map_err(anyhow::Error::from)).is_err() {
                        return;
                    }
                }
            })
            .with_context(|| format!("spawning the {} thread", job.name()))?;
        Ok(BackgroundIo {
            job,
            shared,
            nvme,
            requests: Some(requests),
            done,
            pending: Cell::new(None),
            moved_bytes: Cell::new(0),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Starts the job on group `k` (a read: its update must be done, as the thread reads whatever the
    /// tier holds; a write: its gradient is resident, the step's addition done). A job still pending
    /// is settled first, so at most one is ever in flight.
    pub(super) fn begin(&self, k: usize) -> Result<()> {
        self.settle(None)?;
        let sent = self.requests.as_ref().is_some_and(|r| r.send(k).is_ok());
        if !sent {
            return Err(self.stopped());
        }
        self.pending.set(Some(k));
        Ok(())
    }

    /// Waits for the job in flight, if any; a failed job's error is returned here. A working copy it
    /// read for a group other than `upload` (the group about to be uploaded, which pages it out after)
    /// is let go again, so nothing read ahead outlives the op that should have taken it.
    pub(super) fn settle(&self, upload: Option<usize>) -> Result<()> {
        let Some(k) = self.pending.take() else { return Ok(()) };
        let done = self.done.recv().map_err(|_| self.stopped())?;
        let moved = done.with_context(|| match self.job {
            Job::ReadWorking => format!("reading group {k}'s working copy ahead of its upload"),
            Job::WriteGrads => format!("writing group {k}'s gradient back behind the next block's backward"),
        })?;
        self.moved_bytes.set(self.moved_bytes.get() + moved);
        if self.job == Job::ReadWorking && moved > 0 && upload != Some(k) {
            lock(&self.shared[k])
                .working
                .page_out(Some(&self.nvme), false)
                .with_context(|| format!("letting go of group {k}'s working copy, read ahead of an upload that did not come"))?;
        }
        Ok(())
    }

    /// Bytes moved so far.
    pub(super) fn moved_bytes(&self) -> u64 {
        self.moved_bytes.get()
    }

    /// The error for a thread that stopped before its channel closed: it panicked, and says why.
    fn stopped(&self) -> anyhow::Error {
        let why = match self.thread_handle().take().map(JoinHandle::join) {
            Some(Err(panic)) => super::ranks::panic_message(&panic),
            _ => "(no message)".into(),
        };
        anyhow!("the {} thread stopped: {why}", self.job.name())
    }

    fn thread_handle(&self) -> MutexGuard<'_, Option<JoinHandle<()>>> {
        self.thread.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for BackgroundIo {
    fn drop(&mut self) {
        self.requests = None; // closing the channel ends the thread's loop
        if let Some(thread) = self.thread_handle().take() {
            let _ = thread.join();
        }
    }
}
