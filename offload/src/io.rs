//! The NVMe I/O engine: moves whole page-aligned buffers to and from files in blocks of a chosen size
//! with a chosen number in flight.
//!
//! - `uring`: raw io_uring (the `io-uring` crate, Linux only), one ring per thread that uses it — the
//!   sweep gives reads and writes their own threads, hence separate read and write queues. Buffers
//!   are registered with the ring when the memlock limit allows (fixed-buffer reads and writes), else
//!   used as is (`io/uring.rs`). The default on Linux.
//! - `threads`: positioned reads and writes on a pool of worker threads per submitting thread, one
//!   request per worker, `queue_depth` in flight (`io/threads.rs`). Runs on every platform; the
//!   default where io_uring does not exist. (`pread`, its earlier name, is still accepted.)
//! - `mmap`: memcpy through a memory map (memmap2), for comparison; always goes through the page cache.
//!
//! io_uring and threads move a batch of segments (several tensors' files and buffers) as one stream
//! of requests and take the segments' checksums while the disk works (`io/stream.rs`, shared).
//!
//! Files are opened uncached (O_DIRECT on Linux, F_NOCACHE on macOS, unbuffered on Windows: `os.rs`)
//! unless the filesystem refuses it (tmpfs does), in which case buffered I/O is used and
//! [`IoEngine::notes`] says so; so does a fall-back from io_uring to threads.

use std::fs::File;
use std::io;
use std::path::Path;

use crate::aligned::ALIGN_BYTES;
use crate::os;

mod stream;
#[cfg(test)]
mod tests;
mod threads;
#[cfg(target_os = "linux")]
mod uring;
/// io_uring is Linux's: elsewhere [`IoEngine::new`] finds it missing and takes the threads engine.
#[cfg(not(target_os = "linux"))]
mod uring {
    use super::{Direction, Segment, io};

    fn missing() -> io::Error {
        io::Error::new(io::ErrorKind::Unsupported, "io_uring exists only on Linux")
    }

    pub(super) fn probe(_depth: usize) -> io::Result<()> {
        Err(missing())
    }

    /// Reached only if a caller set the engine after [`super::IoEngine::new`] chose another.
    pub(super) fn transfer(_: Direction, _: &mut [Segment<'_>], _: &[u64], _: usize, _: usize) -> Result<(), (usize, io::Error)> {
        Err((0, missing()))
    }
}

/// Which system interface moves the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoEngineKind {
    Uring,
    Threads,
    Mmap,
}

impl IoEngineKind {
    /// Every engine, in the order `bench io` lists them.
    pub const ALL: [IoEngineKind; 3] = [IoEngineKind::Uring, IoEngineKind::Threads, IoEngineKind::Mmap];

    /// This platform's default: io_uring on Linux, the threads engine elsewhere.
    pub const NATIVE: IoEngineKind = if cfg!(target_os = "linux") { IoEngineKind::Uring } else { IoEngineKind::Threads };

    pub fn name(self) -> &'static str {
        match self {
            IoEngineKind::Uring => "uring",
            IoEngineKind::Threads => "threads",
            IoEngineKind::Mmap => "mmap",
        }
    }
}

impl std::str::FromStr for IoEngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uring" | "io_uring" => Ok(IoEngineKind::Uring),
            // `pread` named the threads engine before it moved batches as one stream (and resumed
            // runs' recorded settings may still say so).
            "threads" | "pread" => Ok(IoEngineKind::Threads),
            "mmap" => Ok(IoEngineKind::Mmap),
            other => Err(format!("unknown I/O engine {other:?}: expected uring, threads or mmap")),
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
    /// Ask for uncached I/O (bypass the page cache: O_DIRECT and its kin); refused by some
    /// filesystems, then buffered.
    pub direct: bool,
}

impl Default for IoConfig {
    /// 1 MiB blocks, 32 in flight, uncached, the platform's engine: fio's usual sequential setting.
    fn default() -> Self {
        IoConfig { engine: IoEngineKind::NATIVE, block_bytes: 1 << 20, queue_depth: 32, direct: true }
    }
}

/// One part of a batched transfer ([`IoEngine::transfer_batch`]): all of `buf` to or from `file` at
/// `offset`, optionally folding the buffer's first bytes into a CRC32 as they are moved.
pub struct Segment<'a> {
    pub file: &'a File,
    pub offset: u64,
    pub buf: &'a mut [u8],
    /// A checksum to feed the first `usize` bytes of `buf` (in order), and how many: written bytes
    /// before they leave, read bytes once they have arrived.
    pub checksum: Option<(&'a mut crc32fast::Hasher, usize)>,
}

/// A batched transfer's failure: the error and the index of the segment it happened in.
#[derive(Debug)]
pub struct BatchError {
    pub segment: usize,
    pub error: io::Error,
}

/// An [`IoConfig`] resolved against what this machine allows.
#[derive(Debug)]
pub struct IoEngine {
    pub config: IoConfig,
    /// One line per fall-back taken ("io_uring unavailable (...): using the threads engine").
    pub notes: Vec<String>,
}

/// The most requests an engine keeps in flight (io_uring's rings are sized by it).
pub const MAX_QUEUE_DEPTH: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

impl IoEngine {
    /// Checks the configuration and probes io_uring; falls back to the threads engine (with a note) if
    /// it cannot be used.
    pub fn new(mut config: IoConfig) -> io::Result<Self> {
        if config.block_bytes == 0 || !config.block_bytes.is_multiple_of(ALIGN_BYTES) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("block size {} bytes: expected a positive multiple of {ALIGN_BYTES}", config.block_bytes),
            ));
        }
        if config.queue_depth == 0 || config.queue_depth > MAX_QUEUE_DEPTH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("queue depth {}: expected 1 to {MAX_QUEUE_DEPTH}", config.queue_depth),
            ));
        }
        let mut notes = Vec::new();
        if config.engine == IoEngineKind::Uring
            && let Err(e) = uring::probe(config.queue_depth)
        {
            notes.push(format!(
                "io_uring unavailable ({e}): using the threads engine (positioned reads and writes on a thread pool) instead"
            ));
            config.engine = IoEngineKind::Threads;
        }
        Ok(IoEngine { config, notes })
    }

    /// Opens (creating if asked) a file for this engine: uncached when configured and allowed. Returns
    /// the file and whether it is uncached.
    pub fn open(&self, path: &Path, create: bool) -> io::Result<(File, bool)> {
        os::open(path, create, false, self.uncached())
    }

    /// Like [`IoEngine::open`], but a symbolic link at `path` itself is refused rather than followed,
    /// so a file planted in a directory we own cannot redirect our writes elsewhere. Links among the
    /// directories leading to `path` are still followed.
    pub fn open_nofollow(&self, path: &Path, create: bool) -> io::Result<(File, bool)> {
        os::open(path, create, true, self.uncached())
    }

    /// Whether files are to be opened uncached: asked for, and not through a memory map.
    fn uncached(&self) -> bool {
        self.config.direct && self.config.engine != IoEngineKind::Mmap
    }

    /// How this platform bypasses the page cache, in words ("O_DIRECT").
    pub fn uncached_name() -> &'static str {
        os::UNCACHED
    }

    /// Transfers all of `buf` to or from `file` at `offset`. Uncached, `buf`, its length and `offset`
    /// must be multiples of 4 KiB (an [`crate::AlignedBuf`]'s padded view is).
    pub fn transfer(&self, dir: Direction, file: &File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut one = [Segment { file, offset, buf, checksum: None }];
        self.transfer_batch(dir, &mut one).map_err(|e| e.error)
    }

    /// Transfers every segment, in order. io_uring and threads move them in one stream of requests (the
    /// queue stays full across segments, and checksums are taken while the disk works); mmap moves one
    /// segment after another and hashes after each. Alignment as for [`IoEngine::transfer`].
    pub fn transfer_batch(&self, dir: Direction, segments: &mut [Segment<'_>]) -> Result<(), BatchError> {
        // Empty segments move nothing (and a stream would have no block to issue for them).
        if segments.iter().any(|s| s.buf.is_empty()) {
            let mut rest: Vec<Segment<'_>> = Vec::new();
            let mut index = Vec::new();
            for (k, s) in segments.iter_mut().enumerate() {
                if !s.buf.is_empty() {
                    let checksum = s.checksum.as_mut().map(|(h, n)| (&mut **h, *n));
                    rest.push(Segment { file: s.file, offset: s.offset, buf: &mut *s.buf, checksum });
                    index.push(k);
                }
            }
            return self.transfer_batch(dir, &mut rest).map_err(|e| BatchError { segment: index[e.segment], error: e.error });
        }
        let totals: Vec<u64> = segments.iter().map(|s| s.buf.len() as u64).collect();
        self.stream(dir, segments, &totals).map_err(|(segment, error)| BatchError { segment, error })
    }

    /// Moves `total_bytes` between `file` at `offset` and `buf` in one stream of requests, reusing `buf`
    /// from its start each time it is used up (what fio does with its buffers): a benchmark's way to
    /// stream a large file through a modest buffer with the queue kept full throughout. `total_bytes`
    /// must be a multiple of the buffer's length and the buffer a multiple of the block size. Reads
    /// overwrite the buffer over and over. The mmap engine moves one buffer at a time.
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
        let mut one = [Segment { file, offset, buf, checksum: None }];
        self.stream(dir, &mut one, &[total_bytes]).map_err(|(_, e)| e)
    }

    /// Moves `totals[k]` bytes of each segment through its buffer (reused from its start when the total
    /// exceeds it) with this engine. Segments are not empty.
    fn stream(&self, dir: Direction, segments: &mut [Segment<'_>], totals: &[u64]) -> Result<(), (usize, io::Error)> {
        let (block, depth) = (self.config.block_bytes, self.config.queue_depth);
        match self.config.engine {
            IoEngineKind::Uring => uring::transfer(dir, segments, totals, block, depth),
            IoEngineKind::Threads => threads::transfer(dir, segments, totals, block, depth),
            IoEngineKind::Mmap => mmap_transfer_all(dir, segments, totals),
        }
    }
}

/// Reserves `size` bytes for `file` (posix_fallocate or its platform's kin), so writes fill allocated
/// blocks rather than allocating them as they go; where the filesystem cannot preallocate, just sizes
/// it. A full disk is an error of kind `StorageFull`.
pub fn preallocate(file: &File, size: u64) -> io::Result<()> {
    os::preallocate(file, size)
}

fn short(dir: Direction, offset: u64, got: usize, want: usize) -> io::Error {
    let what = if dir == Direction::Read { "read" } else { "write" };
    io::Error::new(io::ErrorKind::UnexpectedEof, format!("short {what}: {got} of {want} bytes at offset {offset}"))
}

/// The mmap engine: each segment in turn (its buffer reused from its start over its total), hashed
/// before it leaves or after it has arrived.
fn mmap_transfer_all(dir: Direction, segments: &mut [Segment<'_>], totals: &[u64]) -> Result<(), (usize, io::Error)> {
    for (k, (s, &total)) in segments.iter_mut().zip(totals).enumerate() {
        if let (Direction::Write, Some((hasher, n))) = (dir, s.checksum.as_mut()) {
            hasher.update(&s.buf[..(*n).min(s.buf.len())]);
        }
        let len = s.buf.len() as u64;
        (0..total / len).try_for_each(|r| mmap_transfer(dir, s.file, s.offset + r * len, s.buf)).map_err(|e| (k, e))?;
        if let (Direction::Read, Some((hasher, n))) = (dir, s.checksum.as_mut()) {
            hasher.update(&s.buf[..(*n).min(s.buf.len())]);
        }
    }
    Ok(())
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
