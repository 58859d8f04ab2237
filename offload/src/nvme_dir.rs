//! The NVMe tier's directories ([`NvmeDir`]): one, or several the state is striped over (each tensor
//! cut into one page-aligned stripe per directory, so every drive moves an equal share of every
//! transfer, all in flight at once). Each is created and probed when opened, locked against a second
//! run, its leftover spares removed and given its own pool of spare files (a write's spare must live
//! beside the shard it replaces); they share the I/O engine, the buffer pool and the byte counts.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::aligned::BufferPool;
use crate::dir_files::{Result, StoreError, io_error, open_error, open_in_dir};
use crate::io::IoEngine;
use crate::os;
use crate::spare_pool::{SparePool, remove_leftovers};

/// The NVMe tier: its directories, an I/O engine and whether to verify checksums.
#[derive(Debug)]
pub struct NvmeDir {
    /// The directories, in stripe order: stripe `i` of every tensor lives in `stripes[i]`.
    pub(crate) stripes: Vec<StripeDir>,
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
    /// Every shard file opened through this tier: what [`NvmeDir::remove_unopened`] keeps.
    opened: std::sync::Mutex<std::collections::BTreeSet<PathBuf>>,
}

/// One directory of the tier.
#[derive(Debug)]
pub(crate) struct StripeDir {
    pub(crate) dir: PathBuf,
    /// The spare files writes of this directory's shards go into (removed when this is dropped,
    /// before the lock goes: it comes later in the struct).
    pub(crate) spares: SparePool,
    /// Held for as long as this run uses the directory: a second run given it is refused.
    _lock: File,
}

impl StripeDir {
    /// Creates `dir` if it is missing, checks that it is a writable directory (by creating and removing
    /// a probe file) that no other run holds, and whether its filesystem accepts uncached I/O; a
    /// refusal is added to `io.notes`. Spare files an earlier run left there are removed.
    fn open(dir: &Path, io: &mut IoEngine) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("creating the NVMe directory", dir, e))?;
        let meta = std::fs::metadata(dir).map_err(|e| io_error("NVMe directory", dir, e))?;
        if !meta.is_dir() {
            return Err(StoreError(format!("NVMe directory {}: not a directory", dir.display())));
        }
        let lock_path = dir.join(".zerostream.lock");
        // Not truncated (it holds nothing), never a link, locked through std's File::try_lock (flock,
        // or LockFileEx on Windows): the lock goes with the process, however it ends.
        let (lock, _) = os::open(&lock_path, true, true, false).map_err(|e| open_error("NVMe directory lock", &lock_path, e))?;
        if !lock_patiently(&lock) {
            return Err(StoreError(format!(
                "NVMe directory {} is in use by another zerostream run (it holds {}): give each run its own --nvme-dir",
                dir.display(),
                lock_path.display()
            )));
        }
        // Under the lock: no other run is writing them.
        remove_leftovers(dir)?;
        let probe = dir.join(format!(".zerostream-probe-{}", std::process::id()));
        let opened = open_in_dir(io, "NVMe directory probe", &probe, true);
        let _ = std::fs::remove_file(&probe);
        let (_, direct) = opened?;
        if io.config.direct && !direct && io.config.engine != crate::io::IoEngineKind::Mmap {
            let uncached = IoEngine::uncached_name();
            io.notes.push(format!("{}: the filesystem refuses {uncached}; using buffered I/O (through the page cache)", dir.display()));
        }
        Ok(StripeDir { dir: dir.to_path_buf(), spares: SparePool::new(dir), _lock: lock })
    }
}

impl NvmeDir {
    /// The tier in one directory: see [`NvmeDir::striped`].
    pub fn new(dir: &Path, io: IoEngine, verify: bool, rank: usize) -> Result<Self> {
        Self::striped(&[dir.to_path_buf()], io, verify, rank)
    }

    /// The tier striped over `dirs` (one or more; each on its own drive, in practice). Each is created
    /// if missing and must be a writable directory no other run holds; one given twice is refused.
    pub fn striped(dirs: &[PathBuf], mut io: IoEngine, verify: bool, rank: usize) -> Result<Self> {
        if dirs.is_empty() {
            return Err(StoreError("the NVMe tier needs a directory (--nvme-dir)".into()));
        }
        // The same directory twice (under any spelling) would lock against itself: say what it is.
        let mut seen: Vec<PathBuf> = Vec::with_capacity(dirs.len());
        for dir in dirs {
            std::fs::create_dir_all(dir).map_err(|e| io_error("creating the NVMe directory", dir, e))?;
            let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
            if seen.contains(&canonical) {
                return Err(StoreError(format!("NVMe directory {} is given twice: give each directory once", dir.display())));
            }
            seen.push(canonical);
        }
        let stripes = dirs.iter().map(|dir| StripeDir::open(dir, &mut io)).collect::<Result<Vec<_>>>()?;
        Ok(NvmeDir {
            stripes,
            io,
            verify,
            rank,
            atomic_exchange: true,
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
            pool: BufferPool::default(),
            opened: Default::default(),
        })
    }

    /// Notes a shard file this run uses.
    pub(crate) fn note_opened(&self, path: &Path) {
        self.opened.lock().unwrap_or_else(|p| p.into_inner()).insert(path.to_path_buf());
    }

    /// Removes the shard files (`*.rank{r}.bin`, this rank's) in this tier's directories that no tensor opened: left by a run
    /// of another shape (another model's groups), never read (a run writes its shards before reading
    /// them) and, under the directories' locks, no other run's. Returns (files, bytes) removed, so the
    /// space they held is this run's, as the start-up check of the room counted it.
    pub fn remove_unopened(&self) -> Result<(usize, u64)> {
        let opened = self.opened.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (mut files, mut bytes) = (0, 0);
        let suffix = format!(".rank{}.bin", self.rank);
        for stripe in &self.stripes {
            let entries = std::fs::read_dir(&stripe.dir).map_err(|e| io_error("listing the NVMe directory", &stripe.dir, e))?;
            for entry in entries.flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                let shard = name.ends_with(&suffix) && !name.starts_with(crate::spare_pool::SPARE_PREFIX);
                let Ok(meta) = entry.metadata() else { continue };
                if !shard || !meta.is_file() || opened.contains(&path) {
                    continue;
                }
                std::fs::remove_file(&path).map_err(|e| io_error("removing an earlier run's shard", &path, e))?;
                files += 1;
                bytes += meta.len();
            }
        }
        Ok((files, bytes))
    }

    /// How many directories the tensors are striped over.
    pub fn stripe_count(&self) -> usize {
        self.stripes.len()
    }

    /// The directories, in stripe order.
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.stripes.iter().map(|s| s.dir.as_path())
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

    /// The file of tensor `name`'s first stripe (its only one with one directory).
    pub fn shard_path(&self, name: &str) -> PathBuf {
        self.stripe_path(0, name)
    }

    /// The file of tensor `name`'s stripe `stripe`.
    pub fn stripe_path(&self, stripe: usize, name: &str) -> PathBuf {
        self.stripes[stripe].dir.join(format!("{name}.rank{}.bin", self.rank))
    }
}

/// `try_lock`, tried again for half a second before giving up: a lock its holder just released lingers
/// while a child process that holder's process was starting still has a copy of the descriptor
/// (between its fork and its exec), so a run that follows another in one process could find it held.
fn lock_patiently(file: &File) -> bool {
    for _ in 0..20 {
        if file.try_lock().is_ok() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    file.try_lock().is_ok()
}
