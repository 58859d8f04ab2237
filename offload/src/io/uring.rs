//! The io_uring side of the I/O engine: one ring per thread, and one stream of requests over a batch of
//! segments (several files and buffers), so the queue stays full from the first segment's first block
//! to the last one's last block instead of draining between tensors. While it waits for the disk the
//! thread folds the moved bytes into each segment's CRC32 (written bytes at any time, read bytes once
//! they have arrived), so verification costs the I/O thread no time of its own while the disk is busy.

use std::cell::RefCell;
use std::io;
use std::os::unix::io::AsRawFd;

use super::stream::{Cursor, Stream, hash_step, tag, untag};
use super::{Direction, Segment, short};

/// Buffers at most this large are registered as one entry (the kernel's limit is 1 GiB).
const REGISTERED_PIECE_BYTES: usize = 512 << 20;
/// Entries in each ring's sparse buffer table: up to 8 GiB of buffers per batch are registered.
const REGISTERED_PIECES: u32 = 16;
/// Entries in each ring's sparse file table: the files of a batch beyond it go by descriptor.
const REGISTERED_FILES: u32 = 16;

/// One thread's io_uring with sparse tables of [`REGISTERED_FILES`] files and [`REGISTERED_PIECES`]
/// buffers, registered once when the ring is made; each transfer fills the tables (an update: no
/// quiescing of the ring) and clears them when it ends, so no page stays pinned beyond its transfer.
struct Ring {
    ring: io_uring::IoUring,
    entries: u32,
    file_table: bool,
    buffer_table: bool,
}

impl Ring {
    fn new(entries: u32) -> io::Result<Self> {
        // One thread submits and reaps (the ring is thread-local): the kernel may skip the interrupts and
        // locking that sharing would need. Older kernels refuse the flags: then a plain ring.
        let ring = io_uring::IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .build(entries)
            .or_else(|_| io_uring::IoUring::new(entries))?;
        let file_table = ring.submitter().register_files_sparse(REGISTERED_FILES).is_ok();
        let buffer_table = ring.submitter().register_buffers_sparse(REGISTERED_PIECES).is_ok();
        Ok(Ring { ring, entries, file_table, buffer_table })
    }
}

thread_local! {
    /// This thread's ring: each I/O thread submits to its own queue.
    static RING: RefCell<Option<Ring>> = const { RefCell::new(None) };
}

/// `submit_and_wait`, retried when a signal interrupts the wait (training handles SIGINT).
fn submit_and_wait(ring: &io_uring::IoUring, want: usize) -> io::Result<usize> {
    loop {
        match ring.submit_and_wait(want) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Whether this machine's kernel gives us a ring of `depth` entries (what [`super::IoEngine::new`]
/// asks before choosing io_uring).
pub(super) fn probe(depth: usize) -> io::Result<()> {
    io_uring::IoUring::new(depth.next_power_of_two() as u32).map(drop)
}

/// Where a stream's requests go: its descriptor, and its entries in the ring's tables if registered.
struct Target {
    fd: i32,
    /// Index in the file table, if registered.
    fixed_file: Option<u32>,
    /// First buffer-table index of the segment's pieces, if registered.
    fixed_buf: Option<u16>,
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
    let entries = depth.next_power_of_two() as u32;
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|r| r.entries != entries) {
            *slot = Some(Ring::new(entries).map_err(|e| (0, e))?);
        }
        let ring = slot.as_mut().unwrap();
        let targets = register(ring, segments, block);
        let mut streams: Vec<Stream<'_>> = segments.iter_mut().zip(totals).map(|(s, &total)| Stream::new(s, total, block)).collect();
        let result = run(&mut ring.ring, dir, &mut streams, &targets, block, depth);
        // `run` has reaped every request it issued: no buffer is in use by the kernel any more.
        if result.is_ok() {
            while hash_step(dir, &mut streams, block) {}
        }
        drop(streams);
        unregister(&mut slot, segments.len());
        result
    })
}

/// Fills the ring's tables with the segments' files and buffers (as many as fit): where each
/// segment's requests go.
fn register(ring: &mut Ring, segments: &mut [Segment<'_>], block: usize) -> Vec<Target> {
    let fds: Vec<i32> = segments.iter().map(|s| s.file.as_raw_fd()).collect();
    let files_fit = ring.file_table && fds.len() <= REGISTERED_FILES as usize;
    let fixed_files = files_fit && ring.ring.submitter().register_files_update(0, &fds).is_ok();
    // Each buffer in pieces of at most REGISTERED_PIECE_BYTES, each a whole number of blocks.
    let piece = (REGISTERED_PIECE_BYTES / block).max(1) * block;
    let mut iovs = Vec::new();
    let mut targets = Vec::with_capacity(segments.len());
    for (k, segment) in segments.iter_mut().enumerate() {
        let (base, buf_len) = (segment.buf.as_mut_ptr(), segment.buf.len());
        let pieces = buf_len.div_ceil(piece);
        let fixed_buf = (ring.buffer_table && iovs.len() + pieces <= REGISTERED_PIECES as usize).then(|| {
            let first = iovs.len() as u16;
            // SAFETY: each piece starts inside the buffer.
            iovs.extend(
                (0..pieces)
                    .map(|p| libc::iovec { iov_base: unsafe { base.add(p * piece) }.cast(), iov_len: piece.min(buf_len - p * piece) }),
            );
            first
        });
        targets.push(Target { fd: fds[k], fixed_file: fixed_files.then_some(k as u32), fixed_buf });
    }
    // SAFETY: the buffers stay alive and unmoved until the table is cleared, before `transfer` returns.
    if !iovs.is_empty() && unsafe { ring.ring.submitter().register_buffers_update(0, &iovs, None) }.is_err() {
        targets.iter_mut().for_each(|t| t.fixed_buf = None);
    }
    targets
}

/// Clears what [`register`] put in the tables, so the pages are unpinned and the files released now.
fn unregister(slot: &mut Option<Ring>, files: usize) {
    let Some(r) = slot.as_mut() else { return };
    let empty = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; REGISTERED_PIECES as usize];
    // SAFETY: empty entries clear the table.
    let buffers_cleared = !r.buffer_table || unsafe { r.ring.submitter().register_buffers_update(0, &empty, None) }.is_ok();
    let files_cleared =
        !r.file_table || r.ring.submitter().register_files_update(0, &vec![-1; files.min(REGISTERED_FILES as usize)]).is_ok();
    if !buffers_cleared || !files_cleared {
        *slot = None; // dropping the ring unregisters everything
    }
}

/// Builds the request for block `i` of stream `s`, which goes to `t`.
fn request(dir: Direction, s: &Stream, t: &Target, i: usize, block: usize) -> io_uring::squeue::Entry {
    use io_uring::{opcode, types};
    let (at, in_buf, n) = s.block_at(i, block);
    // SAFETY: in_buf + n <= the buffer's length.
    let ptr = unsafe { s.base.add(in_buf) };
    let piece = (REGISTERED_PIECE_BYTES / block).max(1) * block;
    let n32 = n as u32;
    let fixed = t.fixed_buf.map(|first| first + (in_buf / piece) as u16);
    macro_rules! build {
        ($fixed_op:ident, $op:ident, $target:expr) => {
            match fixed {
                Some(index) => opcode::$fixed_op::new($target, ptr, n32, index).offset(at).build(),
                None => opcode::$op::new($target, ptr, n32).offset(at).build(),
            }
        };
    }
    match (dir, t.fixed_file) {
        (Direction::Read, Some(f)) => build!(ReadFixed, Read, types::Fixed(f)),
        (Direction::Read, None) => build!(ReadFixed, Read, types::Fd(t.fd)),
        (Direction::Write, Some(f)) => build!(WriteFixed, Write, types::Fixed(f)),
        (Direction::Write, None) => build!(WriteFixed, Write, types::Fd(t.fd)),
    }
}

/// Issues every block of every stream in order, keeping `depth` in flight, and reaps them all, hashing
/// whenever there is something to hash instead of sleeping on the queue. Returns the first error with
/// its segment's index; after an error nothing more is issued, and what is in flight is reaped.
fn run(
    ring: &mut io_uring::IoUring,
    dir: Direction,
    streams: &mut [Stream<'_>],
    targets: &[Target],
    block: usize,
    depth: usize,
) -> Result<(), (usize, io::Error)> {
    let mut cursor = Cursor::new();
    let mut in_flight = 0usize;
    let mut result = Ok(());
    loop {
        while in_flight < depth && result.is_ok() {
            let Some((k, i)) = cursor.peek(streams) else { break };
            let entry = request(dir, &streams[k], &targets[k], i, block);
            // SAFETY: the buffer outlives the request: every submission is reaped before returning.
            if unsafe { ring.submission().push(&entry.user_data(tag(k, i))) }.is_err() {
                break; // queue full: reap first
            }
            cursor.advance();
            in_flight += 1;
        }
        if in_flight == 0 {
            break; // everything issued is back, and nothing more will be
        }
        // Hash while the disk works; when there is nothing to hash, one system call submits the batch
        // and sleeps until a completion.
        let hashing = result.is_ok() && hash_step(dir, streams, block);
        let wait = if hashing { 0 } else { 1 };
        if let Err(e) = submit_and_wait(ring, wait) {
            while in_flight > 0 {
                // Nothing returns while the kernel may still use a buffer: only a broken ring stops this.
                submit_and_wait(ring, 1).expect("io_uring failed with requests in flight");
                in_flight -= ring.completion().count();
            }
            return result.and(Err((cursor.stream.min(streams.len() - 1), e)));
        }
        for cqe in ring.completion() {
            in_flight -= 1;
            let (k, i) = untag(cqe.user_data());
            let (at, _, want) = streams[k].block_at(i, block);
            let got = cqe.result();
            if got < 0 {
                result = result.and(Err((k, io::Error::from_raw_os_error(-got))));
            } else if got as usize != want {
                result = result.and(Err((k, short(dir, at, got as usize, want))));
            } else {
                streams[k].complete(i);
            }
        }
    }
    result
}
