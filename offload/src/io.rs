//! The NVMe I/O engine: moves whole page-aligned buffers to and from files in blocks of a chosen size
//! with a chosen number in flight.
//!
//! - `uring`: raw io_uring (the `io-uring` crate), one ring per thread that uses it — the sweep gives
//!   reads and writes their own threads, hence separate read and write queues. The buffer is registered
//!   with the ring when the memlock limit allows (fixed-buffer reads and writes), else used as is.
//! - `pread`: `queue_depth` threads each issuing pread/pwrite of one block at a time.
//! - `mmap`: memcpy through a memory map (memmap2), for comparison; always goes through the page cache.
//!
//! Files are opened with O_DIRECT unless the filesystem refuses it (tmpfs does), in which case buffered
//! I/O is used and [`IoEngine::notes`] says so; so does a fall-back from io_uring to pread.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::aligned::ALIGN_BYTES;

/// Which system interface moves the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoEngineKind {
    Uring,
    Pread,
    Mmap,
}

impl IoEngineKind {
    pub fn name(self) -> &'static str {
        match self {
            IoEngineKind::Uring => "uring",
            IoEngineKind::Pread => "pread",
            IoEngineKind::Mmap => "mmap",
        }
    }
}

impl std::str::FromStr for IoEngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uring" | "io_uring" => Ok(IoEngineKind::Uring),
            "pread" => Ok(IoEngineKind::Pread),
            "mmap" => Ok(IoEngineKind::Mmap),
            other => Err(format!("unknown I/O engine {other:?}: expected uring, pread or mmap")),
        }
    }
}

impl std::fmt::Display for IoEngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How files are read and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoConfig {
    pub engine: IoEngineKind,
    /// Bytes per request (a multiple of 4 KiB).
    pub block_bytes: usize,
    /// Requests in flight at once.
    pub queue_depth: usize,
    /// Ask for O_DIRECT (bypass the page cache); refused by some filesystems, then buffered.
    pub direct: bool,
}

impl Default for IoConfig {
    /// 1 MiB blocks, 32 in flight, O_DIRECT, io_uring: fio's usual sequential setting.
    fn default() -> Self {
        IoConfig { engine: IoEngineKind::Uring, block_bytes: 1 << 20, queue_depth: 32, direct: true }
    }
}

/// An [`IoConfig`] resolved against what this machine allows.
#[derive(Debug)]
pub struct IoEngine {
    pub config: IoConfig,
    /// One line per fall-back taken ("io_uring unavailable (...): using pread").
    pub notes: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

impl IoEngine {
    /// Checks the configuration and probes io_uring; falls back to pread (with a note) if it cannot be used.
    pub fn new(mut config: IoConfig) -> io::Result<Self> {
        if config.block_bytes == 0 || !config.block_bytes.is_multiple_of(ALIGN_BYTES) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("block size {} bytes: expected a positive multiple of {ALIGN_BYTES}", config.block_bytes),
            ));
        }
        if config.queue_depth == 0 || config.queue_depth > 4096 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("queue depth {}: expected 1 to 4096", config.queue_depth)));
        }
        let mut notes = Vec::new();
        if config.engine == IoEngineKind::Uring
            && let Err(e) = io_uring::IoUring::new(config.queue_depth.next_power_of_two() as u32)
        {
            notes.push(format!("io_uring unavailable ({e}): using a pread/pwrite thread pool instead"));
            config.engine = IoEngineKind::Pread;
        }
        Ok(IoEngine { config, notes })
    }

    /// Opens (creating if asked) a file for this engine: O_DIRECT when configured and allowed. Returns
    /// the file and whether it is direct.
    pub fn open(&self, path: &Path, create: bool) -> io::Result<(File, bool)> {
        self.open_with_flags(path, create, 0)
    }

    /// Like [`IoEngine::open`], but a symbolic link at `path` itself is refused (O_NOFOLLOW: the open
    /// fails with ELOOP) rather than followed, so a file planted in a directory we own cannot redirect
    /// our writes elsewhere. Links among the directories leading to `path` are still followed.
    pub fn open_nofollow(&self, path: &Path, create: bool) -> io::Result<(File, bool)> {
        self.open_with_flags(path, create, libc::O_NOFOLLOW)
    }

    fn open_with_flags(&self, path: &Path, create: bool, flags: libc::c_int) -> io::Result<(File, bool)> {
        let mut options = OpenOptions::new();
        // `custom_flags` replaces rather than adds, hence O_DIRECT is or-ed in below, not set apart.
        options.read(true).write(true).create(create).custom_flags(flags);
        if self.config.direct && self.config.engine != IoEngineKind::Mmap {
            let mut direct = options.clone();
            direct.custom_flags(flags | libc::O_DIRECT);
            match direct.open(path) {
                Ok(f) => return Ok((f, true)),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {} // the filesystem refuses O_DIRECT
                Err(e) => return Err(e),
            }
        }
        Ok((options.open(path)?, false))
    }

    /// Transfers all of `buf` to or from `file` at `offset`. With O_DIRECT, `buf`, its length and
    /// `offset` must be multiples of 4 KiB (an [`crate::AlignedBuf`]'s padded view is).
    pub fn transfer(&self, dir: Direction, file: &File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        match self.config.engine {
            IoEngineKind::Uring => {
                uring_transfer(dir, file, offset, buf, buf.len() as u64, self.config.block_bytes, self.config.queue_depth)
            }
            IoEngineKind::Pread => pread_transfer(dir, file, offset, buf, self.config.block_bytes, self.config.queue_depth),
            IoEngineKind::Mmap => mmap_transfer(dir, file, offset, buf),
        }
    }

    /// Moves `total_bytes` between `file` at `offset` and `buf` in one stream of requests, reusing `buf`
    /// from its start each time it is used up (what fio does with its buffers): a benchmark's way to
    /// stream a large file through a modest buffer with the queue kept full throughout. `total_bytes`
    /// must be a multiple of the buffer's length and the buffer a multiple of the block size. Reads
    /// overwrite the buffer over and over. Engines other than io_uring move one buffer at a time.
    pub fn transfer_repeated(&self, dir: Direction, file: &File, offset: u64, buf: &mut [u8], total_bytes: u64) -> io::Result<()> {
        let len = buf.len() as u64;
        if len == 0 || !total_bytes.is_multiple_of(len) || !buf.len().is_multiple_of(self.config.block_bytes) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "repeated transfer of {total_bytes} bytes through a buffer of {len}: expected a multiple of the buffer, itself a multiple of the block size {}",
                    self.config.block_bytes
                ),
            ));
        }
        match self.config.engine {
            IoEngineKind::Uring => uring_transfer(dir, file, offset, buf, total_bytes, self.config.block_bytes, self.config.queue_depth),
            _ => (0..total_bytes / len).try_for_each(|k| self.transfer(dir, file, offset + k * len, buf)),
        }
    }
}

/// Reserves `size` bytes for `file` (posix_fallocate), so writes fill allocated blocks rather than
/// allocating them as they go; where the filesystem cannot preallocate, just sizes it.
pub fn preallocate(file: &File, size: u64) -> io::Result<()> {
    // SAFETY: a plain system call on a descriptor the caller owns.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) } {
        0 => Ok(()),
        libc::ENOSPC => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        _ => file.set_len(size),
    }
}

fn short(dir: Direction, offset: u64, got: usize, want: usize) -> io::Error {
    let what = if dir == Direction::Read { "read" } else { "write" };
    io::Error::new(io::ErrorKind::UnexpectedEof, format!("short {what}: {got} of {want} bytes at offset {offset}"))
}

fn pread_transfer(dir: Direction, file: &File, offset: u64, buf: &mut [u8], block: usize, depth: usize) -> io::Result<()> {
    let blocks = buf.len().div_ceil(block);
    let next = AtomicUsize::new(0);
    let base = buf.as_mut_ptr() as usize;
    let len = buf.len();
    let worker = || -> io::Result<()> {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= blocks {
                return Ok(());
            }
            let start = i * block;
            let n = block.min(len - start);
            // SAFETY: each block index is taken by exactly one thread, so the ranges are disjoint
            // sub-slices of `buf`, which outlives the scope.
            let piece = unsafe { std::slice::from_raw_parts_mut((base + start) as *mut u8, n) };
            let at = offset + start as u64;
            match dir {
                Direction::Read => {
                    let mut done = 0;
                    while done < n {
                        match file.read_at(&mut piece[done..], at + done as u64)? {
                            0 => return Err(short(dir, at, done, n)),
                            k => done += k,
                        }
                    }
                }
                Direction::Write => file.write_all_at(piece, at)?,
            }
        }
    };
    let threads = depth.min(blocks);
    if threads <= 1 {
        return worker();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        handles.into_iter().try_for_each(|h| h.join().expect("pread worker panicked"))
    })
}

fn mmap_transfer(dir: Direction, file: &File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: the file is ours for the duration of the copy; nobody truncates it meanwhile.
    let mut map = unsafe { memmap2::MmapOptions::new().offset(offset).len(buf.len()).map_mut(file)? };
    match dir {
        Direction::Read => buf.copy_from_slice(&map),
        Direction::Write => {
            map.copy_from_slice(buf);
            map.flush()?;
        }
    }
    Ok(())
}

/// Buffers at most this large are registered as one entry (the kernel's limit is 1 GiB).
const REGISTERED_PIECE_BYTES: usize = 512 << 20;
/// Entries in each ring's sparse buffer table: buffers of up to 8 GiB are registered whole.
const REGISTERED_PIECES: u32 = 16;

/// One thread's io_uring with a sparse table of one file and [`REGISTERED_PIECES`] buffers, registered
/// once when the ring is made; each transfer fills the tables (an update: no quiescing of the ring) and
/// clears them when it ends, so no page stays pinned beyond the transfer that used it.
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
        let file_table = ring.submitter().register_files_sparse(1).is_ok();
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

/// Where block `i` of a transfer of `total` bytes lies: its file offset, its offset in the buffer (the
/// buffer is reused from its start when `total` exceeds it) and its length.
fn block_at(i: usize, offset: u64, total: u64, buf_len: usize, block: usize) -> (u64, usize, usize) {
    let start = i as u64 * block as u64;
    let n = (block as u64).min(total - start) as usize;
    (offset + start, (start % buf_len as u64) as usize, n)
}

/// Moves `total` bytes between `file` at `offset` and `buf`, in blocks of `block` with `depth` in
/// flight; `buf` is reused from its start when `total` is a multiple of its length larger than it.
fn uring_transfer(dir: Direction, file: &File, offset: u64, buf: &mut [u8], total: u64, block: usize, depth: usize) -> io::Result<()> {
    use io_uring::{opcode, types};
    let entries = depth.next_power_of_two() as u32;
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|r| r.entries != entries) {
            *slot = Some(Ring::new(entries)?);
        }
        let Ring { ring, file_table, buffer_table, .. } = slot.as_mut().unwrap();
        let fd = file.as_raw_fd();
        let fixed_file = *file_table && ring.submitter().register_files_update(0, &[fd]).is_ok();
        // The buffer in pieces of at most REGISTERED_PIECE_BYTES, each a whole number of blocks.
        let piece = (REGISTERED_PIECE_BYTES / block).max(1) * block;
        let pieces = buf.len().div_ceil(piece);
        let iovs: Vec<libc::iovec> = (0..pieces)
            .map(|k| {
                let start = k * piece;
                // SAFETY: start < buf.len().
                libc::iovec { iov_base: unsafe { buf.as_mut_ptr().add(start) }.cast(), iov_len: piece.min(buf.len() - start) }
            })
            .collect();
        // SAFETY: the buffer stays alive and unmoved until the table is cleared below, before returning.
        let fixed_buf = *buffer_table
            && pieces <= REGISTERED_PIECES as usize
            && unsafe { ring.submitter().register_buffers_update(0, &iovs, None) }.is_ok();
        let blocks = total.div_ceil(block as u64) as usize;
        let (mut submitted, mut completed, mut in_flight) = (0usize, 0usize, 0usize);
        let mut result = Ok(());
        while completed < blocks {
            while submitted < blocks && in_flight < depth {
                let (at, in_buf, n) = block_at(submitted, offset, total, buf.len(), block);
                // SAFETY: in_buf + n <= buf.len().
                let ptr = unsafe { buf.as_mut_ptr().add(in_buf) };
                let (n32, index) = (n as u32, (in_buf / piece) as u16);
                let entry = match (dir, fixed_file, fixed_buf) {
                    (Direction::Read, true, true) => opcode::ReadFixed::new(types::Fixed(0), ptr, n32, index).offset(at).build(),
                    (Direction::Read, false, true) => opcode::ReadFixed::new(types::Fd(fd), ptr, n32, index).offset(at).build(),
                    (Direction::Read, true, false) => opcode::Read::new(types::Fixed(0), ptr, n32).offset(at).build(),
                    (Direction::Read, false, false) => opcode::Read::new(types::Fd(fd), ptr, n32).offset(at).build(),
                    (Direction::Write, true, true) => opcode::WriteFixed::new(types::Fixed(0), ptr, n32, index).offset(at).build(),
                    (Direction::Write, false, true) => opcode::WriteFixed::new(types::Fd(fd), ptr, n32, index).offset(at).build(),
                    (Direction::Write, true, false) => opcode::Write::new(types::Fixed(0), ptr, n32).offset(at).build(),
                    (Direction::Write, false, false) => opcode::Write::new(types::Fd(fd), ptr, n32).offset(at).build(),
                };
                // SAFETY: the buffer outlives the request: we reap every submission before returning.
                if unsafe { ring.submission().push(&entry.user_data(submitted as u64)) }.is_err() {
                    break; // queue full: reap first
                }
                submitted += 1;
                in_flight += 1;
            }
            // One system call submits the whole batch and waits for the first completion.
            if let Err(e) = submit_and_wait(ring, 1) {
                result = result.and(Err(e));
                break;
            }
            for cqe in ring.completion() {
                in_flight -= 1;
                completed += 1;
                let (at, _, want) = block_at(cqe.user_data() as usize, offset, total, buf.len(), block);
                let got = cqe.result();
                if got < 0 {
                    result = result.and(Err(io::Error::from_raw_os_error(-got)));
                } else if got as usize != want {
                    result = result.and(Err(short(dir, at, got as usize, want)));
                }
            }
            if result.is_err() {
                submitted = blocks; // stop issuing; drain what is in flight
                if in_flight == 0 {
                    break;
                }
            }
        }
        while in_flight > 0 {
            // Nothing returns while the kernel may still write into `buf`: only a broken ring stops this.
            submit_and_wait(ring, 1).expect("io_uring failed with requests in flight");
            in_flight -= ring.completion().count();
        }
        // Nothing of this call stays registered: the pages are unpinned and the file is released now.
        if fixed_buf {
            let empty = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; pieces];
            // SAFETY: empty entries clear the table.
            if unsafe { ring.submitter().register_buffers_update(0, &empty, None) }.is_err() {
                *slot = None; // dropping the ring unregisters everything
            }
        }
        if fixed_file
            && let Some(r) = slot.as_mut()
            && r.ring.submitter().register_files_update(0, &[-1]).is_err()
        {
            *slot = None;
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aligned::AlignedBuf;

    #[test]
    fn every_engine_round_trips_bytes_at_odd_block_counts() {
        let dir = tempfile::tempdir().unwrap();
        for engine in [IoEngineKind::Uring, IoEngineKind::Pread, IoEngineKind::Mmap] {
            let io = IoEngine::new(IoConfig { engine, block_bytes: 8192, queue_depth: 3, direct: true }).unwrap();
            let path = dir.path().join(format!("f-{engine}"));
            let (file, _) = io.open(&path, true).unwrap();
            let len = 5 * 8192 + 4096; // 5 whole blocks and a partial one
            file.set_len(len as u64 + 4096).unwrap();
            let mut out = AlignedBuf::zeroed(len);
            for (i, b) in out.bytes_mut().iter_mut().enumerate() {
                *b = (i * 7 % 251) as u8;
            }
            io.transfer(Direction::Write, &file, 4096, out.padded_mut()).unwrap();
            let mut back = AlignedBuf::zeroed(len);
            io.transfer(Direction::Read, &file, 4096, back.padded_mut()).unwrap();
            assert!(out.bytes() == back.bytes(), "{engine}: bytes differ after a round trip");
        }
    }

    #[test]
    fn a_read_past_the_end_is_a_short_read_error() {
        let dir = tempfile::tempdir().unwrap();
        for engine in [IoEngineKind::Uring, IoEngineKind::Pread] {
            let io = IoEngine::new(IoConfig { engine, block_bytes: 4096, queue_depth: 2, direct: true }).unwrap();
            let (file, _) = io.open(&dir.path().join("short"), true).unwrap();
            file.set_len(4096).unwrap();
            let mut buf = AlignedBuf::zeroed(3 * 4096);
            let err = io.transfer(Direction::Read, &file, 0, buf.padded_mut()).unwrap_err();
            assert!(err.to_string().contains("short read"), "{engine}: {err}");
        }
    }

    #[test]
    fn a_repeated_transfer_streams_the_buffer_over_the_whole_range() {
        let dir = tempfile::tempdir().unwrap();
        for engine in [IoEngineKind::Uring, IoEngineKind::Pread] {
            let io = IoEngine::new(IoConfig { engine, block_bytes: 8192, queue_depth: 4, direct: true }).unwrap();
            let (file, _) = io.open(&dir.path().join(format!("r-{engine}")), true).unwrap();
            let (chunk, repeats) = (3 * 8192, 5u64);
            preallocate(&file, 4096 + chunk as u64 * repeats).unwrap();
            let mut out = AlignedBuf::zeroed(chunk);
            for (i, b) in out.bytes_mut().iter_mut().enumerate() {
                *b = (i * 13 % 251) as u8;
            }
            io.transfer_repeated(Direction::Write, &file, 4096, out.padded_mut(), chunk as u64 * repeats).unwrap();
            let mut whole = AlignedBuf::zeroed(chunk * repeats as usize);
            io.transfer(Direction::Read, &file, 4096, whole.padded_mut()).unwrap();
            for (k, copy) in whole.bytes().chunks(chunk).enumerate() {
                assert!(copy == out.bytes(), "{engine}: repeat {k} differs");
            }
            let mut back = AlignedBuf::zeroed(chunk);
            io.transfer_repeated(Direction::Read, &file, 4096, back.padded_mut(), chunk as u64 * repeats).unwrap();
            assert!(back.bytes() == out.bytes(), "{engine}: repeated read");
            let err = io.transfer_repeated(Direction::Read, &file, 0, back.padded_mut(), chunk as u64 + 8192).unwrap_err();
            assert!(err.to_string().contains("multiple of the buffer"), "{err}");
        }
    }

    #[test]
    fn bad_block_sizes_and_depths_are_refused() {
        let bad = IoEngine::new(IoConfig { block_bytes: 1000, ..IoConfig::default() }).unwrap_err();
        assert!(bad.to_string().contains("multiple of 4096"), "{bad}");
        let bad = IoEngine::new(IoConfig { queue_depth: 0, ..IoConfig::default() }).unwrap_err();
        assert!(bad.to_string().contains("queue depth"), "{bad}");
    }
}
