//! The NVMe I/O engine: moves whole page-aligned buffers to and from files in blocks of a chosen size
//! with a chosen number in flight.
//!
//! - `uring`: raw io_uring (the `io-uring` crate), one ring per thread that uses it — the sweep gives
//!   reads and writes their own threads, hence separate read and write queues. Buffers are registered
//!   with the ring when the memlock limit allows (fixed-buffer reads and writes), else used as is. A
//!   batch of segments (several tensors' files and buffers) goes out as one stream of requests, its
//!   checksums taken while the disk works (`io/uring.rs`).
//! - `pread`: `queue_depth` threads each issuing pread/pwrite of one block at a time; a batch one
//!   segment after another.
//! - `mmap`: memcpy through a memory map (memmap2), for comparison; always goes through the page cache.
//!
//! Files are opened with O_DIRECT unless the filesystem refuses it (tmpfs does), in which case buffered
//! I/O is used and [`IoEngine::notes`] says so; so does a fall-back from io_uring to pread.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::aligned::ALIGN_BYTES;

mod uring;

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
        let mut one = [Segment { file, offset, buf, checksum: None }];
        self.transfer_batch(dir, &mut one).map_err(|e| e.error)
    }

    /// Transfers every segment, in order. io_uring moves them in one stream of requests (the queue stays
    /// full across segments, and checksums are taken while the disk works); the other engines move one
    /// segment after another and hash after each. Alignment as for [`IoEngine::transfer`].
    pub fn transfer_batch(&self, dir: Direction, segments: &mut [Segment<'_>]) -> Result<(), BatchError> {
        let segments_moved = |segments: &mut [Segment<'_>]| -> Result<(), BatchError> {
            for (k, s) in segments.iter_mut().enumerate() {
                if let (Direction::Write, Some((hasher, n))) = (dir, s.checksum.as_mut()) {
                    hasher.update(&s.buf[..(*n).min(s.buf.len())]);
                }
                let moved = match self.config.engine {
                    IoEngineKind::Pread => pread_transfer(dir, s.file, s.offset, s.buf, self.config.block_bytes, self.config.queue_depth),
                    _ => mmap_transfer(dir, s.file, s.offset, s.buf),
                };
                moved.map_err(|error| BatchError { segment: k, error })?;
                if let (Direction::Read, Some((hasher, n))) = (dir, s.checksum.as_mut()) {
                    hasher.update(&s.buf[..(*n).min(s.buf.len())]);
                }
            }
            Ok(())
        };
        // Empty segments move nothing (and io_uring would have no block to issue for them).
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
        match self.config.engine {
            IoEngineKind::Uring => {
                let totals: Vec<u64> = segments.iter().map(|s| s.buf.len() as u64).collect();
                uring::transfer(dir, segments, &totals, self.config.block_bytes, self.config.queue_depth)
                    .map_err(|(segment, error)| BatchError { segment, error })
            }
            _ => segments_moved(segments),
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
            IoEngineKind::Uring => {
                let mut one = [Segment { file, offset, buf, checksum: None }];
                uring::transfer(dir, &mut one, &[total_bytes], self.config.block_bytes, self.config.queue_depth).map_err(|(_, e)| e)
            }
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
    fn a_batch_moves_every_segment_and_checksums_what_it_moved() {
        let dir = tempfile::tempdir().unwrap();
        for engine in [IoEngineKind::Uring, IoEngineKind::Pread, IoEngineKind::Mmap] {
            // Depth 3 with 2-page blocks: the queue spans segment boundaries.
            let io = IoEngine::new(IoConfig { engine, block_bytes: 8192, queue_depth: 3, direct: true }).unwrap();
            // Awkward sizes (a page, blocks and a partial one, empty), two segments in one file.
            let lens = [4096usize, 5 * 8192 + 4096, 0, 3 * 4096, 8192];
            let offsets = [0u64, 0, 0, 8192, 0];
            let which_file = [0usize, 1, 2, 0, 3];
            let files: Vec<File> = (0..4).map(|f| io.open(&dir.path().join(format!("{engine}-{f}")), true).unwrap().0).collect();
            files.iter().for_each(|f| preallocate(f, 64 * 4096).unwrap());
            let mut out: Vec<AlignedBuf> = lens.iter().map(|&n| AlignedBuf::zeroed(n)).collect();
            for (k, b) in out.iter_mut().enumerate() {
                b.bytes_mut().iter_mut().enumerate().for_each(|(i, x)| *x = (i * 7 + k * 31) as u8);
            }
            // Checksums over less than the buffer (what a shard does: its unpadded length).
            let hash_lens: Vec<usize> = lens.iter().map(|&n| n.saturating_sub(100)).collect();
            // One batch over all the buffers in `direction`; returns each segment's checksum.
            let transfer = |direction: Direction, bufs: &mut [AlignedBuf]| -> Vec<crc32fast::Hasher> {
                let mut hashers: Vec<crc32fast::Hasher> = lens.iter().map(|_| crc32fast::Hasher::new()).collect();
                let mut segments: Vec<Segment<'_>> = bufs
                    .iter_mut()
                    .zip(hashers.iter_mut())
                    .enumerate()
                    .map(|(k, (b, h))| Segment {
                        file: &files[which_file[k]],
                        offset: offsets[k],
                        buf: b.padded_mut(),
                        checksum: Some((h, hash_lens[k])),
                    })
                    .collect();
                io.transfer_batch(direction, &mut segments).unwrap();
                drop(segments);
                hashers
            };
            let written = transfer(Direction::Write, &mut out);
            let mut back: Vec<AlignedBuf> = lens.iter().map(|&n| AlignedBuf::zeroed(n)).collect();
            let read = transfer(Direction::Read, &mut back);
            for k in 0..lens.len() {
                assert!(back[k].bytes() == out[k].bytes(), "{engine}: segment {k} round trip");
                let want = crc32fast::hash(&out[k].bytes()[..hash_lens[k]]);
                assert_eq!(written[k].clone().finalize(), want, "{engine}: segment {k}'s checksum on the way out");
                assert_eq!(read[k].clone().finalize(), want, "{engine}: segment {k}'s checksum on the way in");
            }
            // A short read in the third segment is named by its index (mmap cannot tell: it faults).
            if engine == IoEngineKind::Mmap {
                continue;
            }
            let short_file = io.open(&dir.path().join(format!("{engine}-short")), true).unwrap().0;
            short_file.set_len(4096).unwrap();
            let mut bufs = [AlignedBuf::zeroed(8192), AlignedBuf::zeroed(8192), AlignedBuf::zeroed(2 * 8192)];
            let [a, b, c] = &mut bufs;
            let mut segments = [
                Segment { file: &files[0], offset: 0, buf: a.padded_mut(), checksum: None },
                Segment { file: &files[1], offset: 0, buf: b.padded_mut(), checksum: None },
                Segment { file: &short_file, offset: 0, buf: c.padded_mut(), checksum: None },
            ];
            let err = io.transfer_batch(Direction::Read, &mut segments).unwrap_err();
            assert_eq!(err.segment, 2, "{engine}: {}", err.error);
            assert!(err.error.to_string().contains("short read"), "{engine}: {}", err.error);
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
