//! The portable I/O engine: positioned reads and writes (`pread`/`pwrite`, or `ReadFile`/`WriteFile`
//! at an offset) on a pool of worker threads, one request per worker at a time, so `depth` workers
//! keep `depth` requests in flight on any operating system. It moves a batch the way the io_uring
//! engine does (`io/uring.rs`): one stream of requests across all the segments, the queue refilled
//! as requests come back, each segment's checksum taken by the submitting thread while the workers
//! wait on the disk. Like io_uring's ring, the pool belongs to the thread that submits (the sweep's
//! reader and writer each have their own), so reads and writes never queue behind each other.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};

use super::stream::{Cursor, Stream, hash_step, tag, untag};
use super::{Direction, Segment, short};
use crate::os;

/// The most worker threads one submitting thread gets: a queue deeper than this keeps the extra
/// requests waiting in the pool's queue, so no worker ever waits on the submitter.
const MAX_WORKERS: usize = 128;

/// One block to move: a positioned read or write of `len` bytes at `ptr`.
struct Job {
    dir: Direction,
    file: *const File,
    offset: u64,
    ptr: *mut u8,
    len: usize,
    tag: u64,
}

// SAFETY: the submitting thread keeps the file and the buffer alive, and touches no block in flight,
// until every job it sent has come back (`InFlight`), so a worker may use them meanwhile.
unsafe impl Send for Job {}

impl Job {
    /// Moves the block; returns the bytes moved (fewer than asked only at the end of the file).
    fn run(&self) -> io::Result<usize> {
        // SAFETY: see `unsafe impl Send`: both outlive the job, and the range is this job's alone.
        let (file, buf) = unsafe { (&*self.file, std::slice::from_raw_parts_mut(self.ptr, self.len)) };
        let mut done = 0;
        while done < self.len {
            let at = self.offset + done as u64;
            let moved = match self.dir {
                Direction::Read => os::read_at(file, &mut buf[done..], at),
                Direction::Write => os::write_at(file, &buf[done..], at),
            };
            match moved {
                Ok(0) if self.dir == Direction::Read => break, // the end of the file: a short read
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, format!("the write at offset {at} moved nothing"))),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }
}

/// A submitting thread's workers: jobs go out on one queue (the idle workers take turns at it) and
/// come back on another.
struct Pool {
    workers: usize,
    jobs: Sender<Job>,
    done: Receiver<(u64, io::Result<usize>)>,
}

impl Pool {
    fn spawn(workers: usize) -> io::Result<Self> {
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let (done_tx, done) = channel();
        for w in 0..workers {
            let (queue, done_tx) = (queue.clone(), done_tx.clone());
            // Workers end when the pool (the job queue's sender) is dropped with its thread.
            std::thread::Builder::new().name(format!("zerostream-io-{w}")).spawn(move || work(&queue, &done_tx))?;
        }
        Ok(Pool { workers, jobs, done })
    }
}

fn work(queue: &Mutex<Receiver<Job>>, done: &Sender<(u64, io::Result<usize>)>) {
    loop {
        // The lock is held only while waiting for the next job: the others wait for the lock.
        let job = match queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        // A job always answers, so the submitter never waits on one that will not come back.
        let result = catch_unwind(AssertUnwindSafe(|| job.run())).unwrap_or_else(|_| Err(io::Error::other("an I/O worker panicked")));
        if done.send((job.tag, result)).is_err() {
            return;
        }
    }
}

thread_local! {
    /// This thread's workers: each thread that moves data has its own, as it has its own io_uring.
    static POOL: RefCell<Option<Pool>> = const { RefCell::new(None) };
}

/// Moves every segment (a `total` of bytes each, through its buffer, reused from its start when the
/// total exceeds it) in one stream of requests of `block` bytes with `depth` in flight, hashing each
/// segment's checksum range as it goes. On failure, says which segment (the first error seen).
pub(super) fn transfer(
    dir: Direction,
    segments: &mut [Segment<'_>],
    totals: &[u64],
    block: usize,
    depth: usize,
) -> Result<(), (usize, io::Error)> {
    let workers = depth.min(MAX_WORKERS);
    POOL.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|p| p.workers != workers) {
            *slot = None; // the old workers end as their queue closes
            *slot = Some(Pool::spawn(workers).map_err(|e| (0, e))?);
        }
        let pool = slot.as_ref().unwrap();
        let files: Vec<&File> = segments.iter().map(|s| s.file).collect();
        let mut streams: Vec<Stream<'_>> = segments.iter_mut().zip(totals).map(|(s, &total)| Stream::new(s, total, block)).collect();
        let result = run(pool, dir, &mut streams, &files, block, depth);
        // `run` has had every job back: no worker touches a buffer any more.
        if result.is_ok() {
            while hash_step(dir, &mut streams, block) {}
        }
        result
    })
}

/// The jobs sent and not yet back. Dropped, it waits for them: a buffer is never freed (not even by
/// a panic unwinding past the submitter) while a worker may still be using it.
struct InFlight<'p> {
    pool: &'p Pool,
    count: usize,
}

impl InFlight<'_> {
    /// The next job back: waiting for it, or only if one is already back (`wait` false).
    fn next(&mut self, wait: bool) -> Option<(u64, io::Result<usize>)> {
        let back = if wait {
            self.pool.done.recv().ok()
        } else {
            match self.pool.done.try_recv() {
                Ok(back) => Some(back),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => unreachable!("the pool's workers end only with the pool"),
            }
        };
        self.count -= usize::from(back.is_some());
        back
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        while self.count > 0 && self.next(true).is_some() {}
    }
}

/// Issues every block of every stream in order, keeping `depth` in flight, and takes them all back,
/// hashing whenever there is something to hash instead of sleeping on the completions. Returns the
/// first error with its segment's index; after an error nothing more is issued.
fn run(
    pool: &Pool,
    dir: Direction,
    streams: &mut [Stream<'_>],
    files: &[&File],
    block: usize,
    depth: usize,
) -> Result<(), (usize, io::Error)> {
    let mut cursor = Cursor::new();
    let mut in_flight = InFlight { pool, count: 0 };
    let mut result = Ok(());
    loop {
        while in_flight.count < depth && result.is_ok() {
            let Some((k, i)) = cursor.peek(streams) else { break };
            let (offset, in_buf, len) = streams[k].block_at(i, block);
            // SAFETY: in_buf + len <= the buffer's length.
            let ptr = unsafe { streams[k].base.add(in_buf) };
            let job = Job { dir, file: files[k], offset, ptr, len, tag: tag(k, i) };
            pool.jobs.send(job).expect("the pool's workers end only with the pool");
            cursor.advance();
            in_flight.count += 1;
        }
        if in_flight.count == 0 {
            break; // everything issued is back, and nothing more will be
        }
        // Hash while the workers wait on the disk; with nothing to hash, sleep until a job is back.
        let hashing = result.is_ok() && hash_step(dir, streams, block);
        let mut back = in_flight.next(!hashing);
        while let Some((tag, moved)) = back {
            let (k, i) = untag(tag);
            let (at, _, want) = streams[k].block_at(i, block);
            match moved {
                Ok(got) if got == want => streams[k].complete(i),
                Ok(got) => result = result.and(Err((k, short(dir, at, got, want)))),
                Err(e) => result = result.and(Err((k, e))),
            }
            back = in_flight.next(false);
        }
    }
    result
}
