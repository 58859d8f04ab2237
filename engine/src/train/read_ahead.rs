//! Reading a block's working copy ahead of its upload. With the working copy on NVMe, a thread of its
//! own pages in the copy the next `Fetch` uploads while the device thread computes the block before it
//! (`pipeline::Op::ReadAhead`), so the drive's read overlaps the computation instead of following it.
//! On the cpu device, whose kernels run on the device thread itself, it otherwise never does. One
//! copy at most is read ahead; the upload that takes it waits for the read, then pages the copy out
//! as it would one it read itself, so the bytes read and the RAM held are the schedule's either way.

use std::cell::Cell;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result, anyhow};
use zerostream_offload::NvmeDir;

use super::worker::{SharedGroup, lock};

pub(super) struct ReadAhead {
    shared: Arc<Vec<Mutex<SharedGroup>>>,
    nvme: Arc<NvmeDir>,
    /// Groups to read, to the thread; closed (None) to stop it.
    requests: Option<Sender<usize>>,
    /// Each read's outcome, in order: whether it paged the copy in (false: it was resident already).
    done: Receiver<Result<bool>>,
    /// The group whose read was asked for and not yet waited for.
    pending: Cell<Option<usize>>,
    /// Bytes read ahead so far (each copy counted once its read is waited for).
    read_bytes: Cell<u64>,
    thread: Option<JoinHandle<()>>,
}

impl ReadAhead {
    /// Starts the read-ahead thread over the groups' working copies in `nvme`.
    pub(super) fn start(shared: Arc<Vec<Mutex<SharedGroup>>>, nvme: Arc<NvmeDir>) -> Result<Self> {
        let (requests, to_read) = channel::<usize>();
        let (report, done) = channel();
        let (groups, dir) = (shared.clone(), nvme.clone());
        let thread = std::thread::Builder::new()
            .name("read-ahead".into())
            .spawn(move || {
                for k in to_read {
                    let mut group = lock(&groups[k]);
                    let was_resident = group.working.is_resident();
                    let read = group.working.page_in(Some(&dir)).map(|()| !was_resident).map_err(anyhow::Error::from);
                    drop(group);
                    if report.send(read).is_err() {
                        return;
                    }
                }
            })
            .context("spawning the read-ahead thread")?;
        Ok(ReadAhead {
            shared,
            nvme,
            requests: Some(requests),
            done,
            pending: Cell::new(None),
            read_bytes: Cell::new(0),
            thread: Some(thread),
        })
    }

    /// Starts reading group `k`'s working copy (its update must be done: the thread reads whatever the
    /// tier holds). A read still pending is settled first, so at most one is ever in flight.
    pub(super) fn begin(&self, k: usize) -> Result<()> {
        self.settle(None)?;
        let sent = self.requests.as_ref().is_some_and(|r| r.send(k).is_ok());
        if !sent {
            return Err(anyhow!("the read-ahead thread stopped"));
        }
        self.pending.set(Some(k));
        Ok(())
    }

    /// Waits for the read in flight, if any. A copy it paged in for a group other than `upload` (the
    /// group about to be uploaded, which pages it out after) is let go again, so nothing read ahead
    /// outlives the op that should have taken it. A failed read's error is returned here (it made
    /// nothing resident).
    pub(super) fn settle(&self, upload: Option<usize>) -> Result<()> {
        let Some(k) = self.pending.take() else { return Ok(()) };
        let read = self.done.recv().map_err(|_| anyhow!("the read-ahead thread stopped"))?;
        let paged_in = read.with_context(|| format!("reading group {k}'s working copy ahead of its upload"))?;
        if paged_in {
            let mut group = lock(&self.shared[k]);
            self.read_bytes.set(self.read_bytes.get() + group.working.len_bytes() as u64);
            if upload != Some(k) {
                group.working.page_out(Some(&self.nvme), false)?;
            }
        }
        Ok(())
    }

    /// Bytes read ahead so far.
    pub(super) fn read_bytes(&self) -> u64 {
        self.read_bytes.get()
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.requests = None; // closing the channel ends the thread's loop
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
