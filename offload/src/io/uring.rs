//! The io_uring side of the I/O engine: one ring per thread, and one stream of requests over a batch of
//! segments (several files and buffers), so the queue stays full from the first segment's first block
//! to the last one's last block instead of draining between tensors. While it waits for the disk the
//! thread folds the moved bytes into each segment's CRC32 (written bytes at any time, read bytes once
//! they have arrived), so verification costs the I/O thread no time of its own while the disk is busy.

use std::cell::RefCell;
use std::io;
use std::os::unix::io::AsRawFd;

use super::{Direction, Segment, short};

/// Buffers at most this large are registered as one entry (the kernel's limit is 1 GiB).
const REGISTERED_PIECE_BYTES: usize = 512 << 20;
/// Entries in each ring's sparse buffer table: up to 8 GiB of buffers per batch are registered.
const REGISTERED_PIECES: u32 = 16;
/// Entries in each ring's sparse file table: the files of a batch beyond it go by descriptor.
const REGISTERED_FILES: u32 = 16;
/// Bytes hashed between two looks at the completion queue: small enough (about 0.1-0.3 ms) that the
/// queue is refilled long before the requests in flight run out.
const HASH_STEP_BYTES: usize = 1 << 20;

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

/// A segment as the ring sees it: raw pointers (the kernel and the hashing share the buffer), its
/// requests, and how far its checksum and (for reads) its arrived prefix have got.
struct Stream<'s> {
    fd: i32,
    /// Index in the file table, if registered.
    fixed_file: Option<u32>,
    /// First buffer-table index of the segment's pieces, if registered.
    fixed_buf: Option<u16>,
    offset: u64,
    base: *mut u8,
    buf_len: usize,
    total: u64,
    blocks: usize,
    /// Blocks completed, and how many from the start are all complete.
    done: Vec<bool>,
    done_prefix: usize,
    /// The segment's checksum, fed its first `hash_bytes`; `hashed_bytes` of them so far.
    hasher: Option<&'s mut crc32fast::Hasher>,
    hashed_bytes: usize,
    hash_bytes: usize,
}

impl Stream<'_> {
    /// Where block `i` lies: its file offset, its offset in the buffer (reused from its start when
    /// `total` exceeds it) and its length.
    fn block_at(&self, i: usize, block: usize) -> (u64, usize, usize) {
        let start = i as u64 * block as u64;
        let n = (block as u64).min(self.total - start) as usize;
        (self.offset + start, (start % self.buf_len as u64) as usize, n)
    }

    /// Bytes from the buffer's start that may be hashed now: all of them for a write; for a read, those
    /// whose blocks have all arrived.
    fn hashable_bytes(&self, dir: Direction, block: usize) -> usize {
        match dir {
            Direction::Write => self.hash_bytes,
            Direction::Read => self.hash_bytes.min(self.done_prefix * block),
        }
    }
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
        let mut streams = register(ring, segments, totals, block);
        let result = run(&mut ring.ring, dir, &mut streams, block, depth);
        // `run` has reaped every request it issued: no buffer is in use by the kernel any more.
        if result.is_ok() {
            while hash_step(dir, &mut streams, block) {}
        }
        drop(streams);
        unregister(&mut slot, segments.len());
        result
    })
}

/// Fills the ring's tables with the segments' files and buffers (as many as fit) and makes their streams.
fn register<'s>(ring: &mut Ring, segments: &'s mut [Segment<'_>], totals: &[u64], block: usize) -> Vec<Stream<'s>> {
    let fds: Vec<i32> = segments.iter().map(|s| s.file.as_raw_fd()).collect();
    let files_fit = ring.file_table && fds.len() <= REGISTERED_FILES as usize;
    let fixed_files = files_fit && ring.ring.submitter().register_files_update(0, &fds).is_ok();
    // Each buffer in pieces of at most REGISTERED_PIECE_BYTES, each a whole number of blocks.
    let piece = (REGISTERED_PIECE_BYTES / block).max(1) * block;
    let mut iovs = Vec::new();
    let mut streams = Vec::with_capacity(segments.len());
    for (k, (segment, &total)) in segments.iter_mut().zip(totals).enumerate() {
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
        let blocks = total.div_ceil(block as u64) as usize;
        let (hasher, hash_bytes) = match segment.checksum.as_mut() {
            Some((hasher, n)) => (Some(&mut **hasher), (*n).min(buf_len)),
            None => (None, 0),
        };
        streams.push(Stream {
            fd: fds[k],
            fixed_file: fixed_files.then_some(k as u32),
            fixed_buf,
            offset: segment.offset,
            base,
            buf_len,
            total,
            blocks,
            done: vec![false; blocks],
            done_prefix: 0,
            hasher,
            hashed_bytes: 0,
            hash_bytes,
        });
    }
    // SAFETY: the buffers stay alive and unmoved until the table is cleared, before `transfer` returns.
    if !iovs.is_empty() && unsafe { ring.ring.submitter().register_buffers_update(0, &iovs, None) }.is_err() {
        streams.iter_mut().for_each(|s| s.fixed_buf = None);
    }
    streams
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

/// Builds the request for block `i` of stream `s`.
fn request(dir: Direction, s: &Stream, i: usize, block: usize) -> io_uring::squeue::Entry {
    use io_uring::{opcode, types};
    let (at, in_buf, n) = s.block_at(i, block);
    // SAFETY: in_buf + n <= the buffer's length.
    let ptr = unsafe { s.base.add(in_buf) };
    let piece = (REGISTERED_PIECE_BYTES / block).max(1) * block;
    let n32 = n as u32;
    let fixed = s.fixed_buf.map(|first| first + (in_buf / piece) as u16);
    macro_rules! build {
        ($fixed_op:ident, $op:ident, $target:expr) => {
            match fixed {
                Some(index) => opcode::$fixed_op::new($target, ptr, n32, index).offset(at).build(),
                None => opcode::$op::new($target, ptr, n32).offset(at).build(),
            }
        };
    }
    match (dir, s.fixed_file) {
        (Direction::Read, Some(f)) => build!(ReadFixed, Read, types::Fixed(f)),
        (Direction::Read, None) => build!(ReadFixed, Read, types::Fd(s.fd)),
        (Direction::Write, Some(f)) => build!(WriteFixed, Write, types::Fixed(f)),
        (Direction::Write, None) => build!(WriteFixed, Write, types::Fd(s.fd)),
    }
}

/// Hashes up to [`HASH_STEP_BYTES`] of the first stream with bytes ready to hash; false if none had any.
fn hash_step(dir: Direction, streams: &mut [Stream<'_>], block: usize) -> bool {
    for s in streams.iter_mut() {
        let ready = s.hashable_bytes(dir, block);
        let Some(hasher) = s.hasher.as_mut() else { continue };
        if ready > s.hashed_bytes {
            let n = (ready - s.hashed_bytes).min(HASH_STEP_BYTES);
            // SAFETY: these bytes are not being written by the kernel (a write only reads the buffer; a
            // read has completed them) and lie within the buffer.
            hasher.update(unsafe { std::slice::from_raw_parts(s.base.add(s.hashed_bytes), n) });
            s.hashed_bytes += n;
            return true;
        }
    }
    false
}

/// Issues every block of every stream in order, keeping `depth` in flight, and reaps them all, hashing
/// whenever there is something to hash instead of sleeping on the queue. Returns the first error with
/// its segment's index; after an error nothing more is issued, and what is in flight is reaped.
fn run(
    ring: &mut io_uring::IoUring,
    dir: Direction,
    streams: &mut [Stream<'_>],
    block: usize,
    depth: usize,
) -> Result<(), (usize, io::Error)> {
    let total_blocks: usize = streams.iter().map(|s| s.blocks).sum();
    let (mut next_stream, mut next_block) = (0usize, 0usize);
    let (mut submitted, mut completed, mut in_flight) = (0usize, 0usize, 0usize);
    let mut result = Ok(());
    // A request's user data: its stream in the high 24 bits, its block in the low 40.
    const BLOCK_BITS: u32 = 40;
    while completed < total_blocks {
        while submitted < total_blocks && in_flight < depth && result.is_ok() {
            while streams[next_stream].blocks == next_block {
                (next_stream, next_block) = (next_stream + 1, 0);
            }
            let entry = request(dir, &streams[next_stream], next_block, block);
            let tag = ((next_stream as u64) << BLOCK_BITS) | next_block as u64;
            // SAFETY: the buffer outlives the request: every submission is reaped before returning.
            if unsafe { ring.submission().push(&entry.user_data(tag)) }.is_err() {
                break; // queue full: reap first
            }
            next_block += 1;
            submitted += 1;
            in_flight += 1;
        }
        if in_flight == 0 {
            break; // an error stopped the issuing and everything issued is back
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
            return result.and(Err((next_stream.min(streams.len() - 1), e)));
        }
        for cqe in ring.completion() {
            in_flight -= 1;
            completed += 1;
            let (k, i) = ((cqe.user_data() >> BLOCK_BITS) as usize, (cqe.user_data() & ((1 << BLOCK_BITS) - 1)) as usize);
            let s = &mut streams[k];
            let (at, _, want) = s.block_at(i, block);
            let got = cqe.result();
            if got < 0 {
                result = result.and(Err((k, io::Error::from_raw_os_error(-got))));
            } else if got as usize != want {
                result = result.and(Err((k, short(dir, at, got as usize, want))));
            } else {
                s.done[i] = true;
                while s.done_prefix < s.blocks && s.done[s.done_prefix] {
                    s.done_prefix += 1;
                }
            }
        }
        if result.is_err() {
            completed = total_blocks - in_flight; // stop issuing; reap only what is in flight
        }
    }
    result
}
