//! The spare files of one NVMe directory: where shard writes go before they take the shard's name.
//!
//! A shard write fills a spare of the shard's file size and then takes the shard's name
//! (`shard_file.rs`); the shard's previous file is left under a spare's name and comes back here,
//! to be overwritten in place by a later write of that size (its blocks stay allocated, which is what
//! keeps a steady-state write as fast as an overwrite). Spares are pooled by file size, not per
//! shard: all the shards of a size share at most [`SPARES_PER_SIZE`] of them, so the run's extra disk
//! room is a few tensors' worth, not a second copy of the state.
//!
//! Spares are named `.zerostream-spare-{n}` (unique within the run; no shard, which is named
//! `*.rank{r}.bin`, can have such a name). They never hold state: whatever a spare holds is a finished
//! or unfinished write that was never, or is no longer, a shard's current file — or, for a run killed
//! in the middle of the install without an atomic exchange, a second name of a shard's current file,
//! whose removal leaves the file to the shard's name. So leftovers of an earlier run are removed when
//! the directory is opened ([`remove_leftovers`]), and the pool's files are removed when it is dropped
//! (with the [`crate::NvmeDir`] that holds it).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::dir_files::{Result, StoreError, io_error, open_in_dir, remove_if_present};
use crate::io::IoEngine;
use crate::os;

/// The most idle spares kept per file size. A spare is out of the pool only while a write fills it,
/// so this is the number of same-size writes the trainer has in flight at once: the update's write
/// stage writes a group's master, m and v together (3 files of one size), its compute stage writes the
/// group's working copy (1; the same size as those with fp32 weights on one rank), and the trainer's
/// device thread writes a gradient (or its write-behind thread does: one at a time between them) or a
/// gathered working copy beside them (1; gradients are the optimizer state's size). 3 + 1 + 1 = 5. Every block group has the same sizes, so this is the
/// whole bound for the blocks; the head group adds its own sizes. A write beyond the bound still
/// works: it creates a spare, and the spare left over afterwards is removed.
pub const SPARES_PER_SIZE: usize = 5;

/// The prefix of every spare's file name.
pub const SPARE_PREFIX: &str = ".zerostream-spare-";

/// A spare file: open, sized, and named `path` in the directory.
#[derive(Debug)]
pub(crate) struct Spare {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
}

/// The idle spares of one directory, by file size.
#[derive(Debug)]
pub(crate) struct SparePool {
    dir: PathBuf,
    /// The number in the next fresh spare's name.
    next_number: AtomicU64,
    idle: Mutex<HashMap<u64, Vec<Spare>>>,
}

impl SparePool {
    pub(crate) fn new(dir: &Path) -> Self {
        SparePool { dir: dir.to_path_buf(), next_number: AtomicU64::new(0), idle: Mutex::new(HashMap::new()) }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<Spare>>> {
        // The map has no invariant a panicking holder could have broken.
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A spare of `file_bytes`: an idle one whose name still names it (nothing else in the locked
    /// directory should touch it; one that was replaced or removed is dropped, its name left alone),
    /// else a fresh one.
    pub(crate) fn take(&self, io: &IoEngine, file_bytes: u64) -> Result<Spare> {
        loop {
            let Some(spare) = self.idle().get_mut(&file_bytes).and_then(Vec::pop) else { break };
            if os::same_file(&spare.file, &spare.path) {
                return Ok(spare);
            }
        }
        match self.create(io, file_bytes) {
            Err(Created::Full(_)) if self.remove_all_idle() > 0 => {
                // Idle spares of other sizes hold the room this one needs: a write that succeeds
                // without them beats a fast one that cannot start.
                self.create(io, file_bytes).map_err(Created::into_error)
            }
            created => created.map_err(Created::into_error),
        }
    }

    /// The name of the next fresh spare, with nothing left at it.
    fn fresh_path(&self) -> Result<PathBuf> {
        let number = self.next_number.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{SPARE_PREFIX}{number}"));
        remove_if_present("removing a leftover spare", &path)?;
        Ok(path)
    }

    /// Creates a fresh spare, sized (so a full disk shows before any data is written). Whatever is at
    /// its name goes first, and the open refuses a link that appears in between.
    fn create(&self, io: &IoEngine, file_bytes: u64) -> std::result::Result<Spare, Created> {
        let path = self.fresh_path().map_err(Created::Other)?;
        let (file, _) = open_in_dir(io, "creating the spare", &path, true).map_err(Created::Other)?;
        if let Err(e) = os::preallocate(&file, file_bytes) {
            let _ = std::fs::remove_file(&path);
            let full = e.kind() == io::ErrorKind::StorageFull;
            let e = io_error("allocating the spare", &path, e);
            return Err(if full { Created::Full(e) } else { Created::Other(e) });
        }
        Ok(Spare { file, path })
    }

    /// Gives `current`, the file `shard` names, a second name, a fresh spare's (a hard link), so it can
    /// come back to the pool once the shard's name moves to another file (the install without an
    /// atomic exchange, `shard_file.rs`). None where the filesystem has no hard links, or `shard` no
    /// longer names `current`: the previous version is then freed with its descriptor, not reused.
    pub(crate) fn link_previous(&self, shard: &Path, current: &File) -> Option<PathBuf> {
        let path = self.fresh_path().ok()?;
        std::fs::hard_link(shard, &path).ok()?;
        if os::same_file(current, &path) {
            return Some(path);
        }
        // `shard` named something else (a link put there is linked itself, never followed).
        let _ = std::fs::remove_file(&path);
        None
    }
}

/// Why a spare could not be created: the disk is full (room may be freed), or anything else.
enum Created {
    Full(StoreError),
    Other(StoreError),
}

impl Created {
    fn into_error(self) -> StoreError {
        match self {
            Created::Full(e) | Created::Other(e) => e,
        }
    }
}

impl SparePool {
    /// Takes `spare` back, idle; beyond [`SPARES_PER_SIZE`] of its size it is removed instead.
    pub(crate) fn give(&self, spare: Spare) {
        let Ok(meta) = spare.file.metadata() else {
            remove_spare(spare);
            return;
        };
        let mut idle = self.idle();
        let of_size = idle.entry(meta.len()).or_default();
        if of_size.len() < SPARES_PER_SIZE {
            of_size.push(spare);
        } else {
            drop(idle);
            remove_spare(spare);
        }
    }

    /// Removes every idle spare; returns how many there were.
    pub(crate) fn remove_all_idle(&self) -> usize {
        let all: Vec<Spare> = self.idle().drain().flat_map(|(_, spares)| spares).collect();
        let count = all.len();
        all.into_iter().for_each(remove_spare);
        count
    }
}

impl Drop for SparePool {
    /// Removes the idle spares, so a directory at rest holds the shards alone.
    fn drop(&mut self) {
        self.remove_all_idle();
    }
}

/// Unlinks a spare's name if it still names the spare (never another file put there since).
fn remove_spare(spare: Spare) {
    if os::same_file(&spare.file, &spare.path) {
        let _ = std::fs::remove_file(&spare.path);
    }
}

/// Removes what earlier runs (or earlier versions, which wrote `{shard}.next` beside each shard, removed
/// when that shard is opened) left of their spares in `dir`: never state, see the module doc. Called
/// with the directory's lock held, so no other run is writing them.
pub(crate) fn remove_leftovers(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error("listing the NVMe directory", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error("listing the NVMe directory", dir, e))?;
        if entry.file_name().to_string_lossy().starts_with(SPARE_PREFIX) {
            let path = entry.path();
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("removing a leftover spare", &path, e)),
            }
        }
    }
    Ok(())
}
