//! The NVMe tier's directory ([`NvmeDir`]): created and probed when opened, locked against a second
//! run, its leftover spares removed, the I/O engine and the spare files its shards' writes go into,
//! and the bytes paged through it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::aligned::BufferPool;
use crate::dir_files::{Result, StoreError, io_error, open_error, open_in_dir};
use crate::io::IoEngine;
use crate::os;
use crate::spare_pool::{SparePool, remove_leftovers};

/// The NVMe tier: a directory, an I/O engine and whether to verify checksums.
#[derive(Debug)]
pub struct NvmeDir {
    pub dir: PathBuf,
    pub io: IoEngine,
    pub verify: bool,
    pub rank: usize,
    /// Whether a written spare and its shard trade names in one atomic call where the platform has one
    /// (on by default). Off, every write takes the portable sequence the other platforms use (a hard
    /// link, then a rename over the shard: `shard_file.rs`), which is how tests run it on Linux.
    pub atomic_exchange: bool,
    /// Bytes paged in from and out to this directory's shards (what [`NvmeDir::traffic`] reports).
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    /// The buffers of tensors paged out, reused by the next page-in.
    pub pool: BufferPool,
    /// The spare files shard writes go into, shared by all the shards (removed when this is dropped,
    /// before the lock goes: it comes later in the struct).
    pub(crate) spares: SparePool,
    /// Held for as long as this run uses the directory: a second run given it is refused.
    _lock: File,
}

impl NvmeDir {
    /// Creates `dir` if it is missing, checks that it is a writable directory (by creating and removing
    /// a probe file) that no other run holds, and whether its filesystem accepts uncached I/O; a
    /// refusal is added to `io.notes`. Spare files an earlier run left there are removed.
    pub fn new(dir: &Path, mut io: IoEngine, verify: bool, rank: usize) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("creating the NVMe directory", dir, e))?;
        let meta = std::fs::metadata(dir).map_err(|e| io_error("NVMe directory", dir, e))?;
        if !meta.is_dir() {
            return Err(StoreError(format!("NVMe directory {}: not a directory", dir.display())));
        }
        let lock_path = dir.join(".zerostream.lock");
        // Not truncated (it holds nothing), never a link, locked through std's File::try_lock (flock,
        // or LockFileEx on Windows): the lock goes with the process, however it ends.
        let (lock, _) = os::open(&lock_path, true, true, false).map_err(|e| open_error("NVMe directory lock", &lock_path, e))?;
        if lock.try_lock().is_err() {
            return Err(StoreError(format!(
                "NVMe directory {} is in use by another zerostream run (it holds {}): give each run its own --nvme-dir",
                dir.display(),
                lock_path.display()
            )));
        }
        // Under the lock: no other run is writing them.
        remove_leftovers(dir)?;
        let probe = dir.join(format!(".zerostream-probe-{}", std::process::id()));
        let opened = open_in_dir(&io, "NVMe directory probe", &probe, true);
        let _ = std::fs::remove_file(&probe);
        let (_, direct) = opened?;
        if io.config.direct && !direct && io.config.engine != crate::io::IoEngineKind::Mmap {
            let uncached = IoEngine::uncached_name();
            io.notes.push(format!("{}: the filesystem refuses {uncached}; using buffered I/O (through the page cache)", dir.display()));
        }
        Ok(NvmeDir {
            dir: dir.to_path_buf(),
            io,
            verify,
            rank,
            atomic_exchange: true,
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
            pool: BufferPool::default(),
            spares: SparePool::new(dir),
            _lock: lock,
        })
    }

    /// `bytes` paged in from a shard.
    pub(crate) fn count_read(&self, bytes: u64) {
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` paged out to a shard.
    pub(crate) fn count_written(&self, bytes: u64) {
        self.written_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// (bytes read, bytes written) by every tensor paged in and out through this directory so far.
    pub fn traffic(&self) -> (u64, u64) {
        (self.read_bytes.load(Ordering::Relaxed), self.written_bytes.load(Ordering::Relaxed))
    }

    pub fn shard_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.rank{}.bin", self.rank))
    }
}
