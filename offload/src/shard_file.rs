//! One tensor's file on the NVMe tier, never overwritten while it is the only copy.
//!
//! A shard file is `[data, padded to whole pages][footer: one page]`. The footer says what the data
//! is (magic, format version, length) and, with verification on, holds the data's CRC32. A write goes
//! into a spare file of the same size taken from the directory's pool (`spare_pool.rs`, named
//! `.zerostream-spare-{n}`) and then the spare becomes `{file}` in a step that is atomic: whatever
//! kills the process mid-write, `{file}` names either the old state or the new one, and data and
//! checksum can never disagree because they travel in one file. The previous version is kept under a
//! spare's name and goes back to the pool as a later write's target (of this shard or any other of
//! its size), overwritten in place: its blocks stay allocated, so a steady-state write allocates,
//! frees and discards nothing (a fresh file per write cost half the write rate on ext4 with
//! `discard`, `benches/results/2026-11-23-nvme-vs-fio.md`). The pool keeps a few spares per size, so
//! the extra disk room is a few tensors, not a copy of the state; spares are removed when the
//! directory is dropped (and leftovers, with the `{file}.next` spares of earlier versions, when it or
//! the shard is next opened).
//!
//! How the spare becomes `{file}` depends on the platform ([`ShardFile::install`]): the two names are
//! exchanged in one call where there is one (Linux `renameat2(RENAME_EXCHANGE)`, macOS
//! `renamex_np(RENAME_SWAP)`); elsewhere (Windows, filesystems that refuse the exchange) the old file
//! is given a spare's name by a hard link and the spare is then renamed over `{file}`: two atomic
//! steps, with `{file}` naming a whole version between them ([`ShardFile::install_portably`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::aligned::{ALIGN_BYTES, AlignedBuf, align_up};
use crate::dir_files::{Result, StoreError, io_error, open_in_dir, remove_if_present};
use crate::io::{Direction, Segment};
use crate::nvme_dir::NvmeDir;
use crate::os;
use crate::spare_pool::Spare;

/// The footer's size: one page, so it keeps O_DIRECT's alignment after the page-aligned data.
pub const FOOTER_BYTES: usize = ALIGN_BYTES;
/// The first bytes of every footer.
const MAGIC: [u8; 8] = *b"ZSSHARD\0";
/// Bumped whenever the layout of the file or the footer changes.
const FORMAT_VERSION: u32 = 1;
/// Footer flag: the data's CRC32 is present.
const HAS_CRC: u32 = 1;
/// The footer's fields (little-endian): magic, version, flags, data length, data CRC32, and a CRC32 of
/// those 28 bytes, so a damaged footer is told apart from damaged data. The rest of the page is zero.
const FIELDS_BYTES: usize = 28;

/// The size of a shard file holding `len_bytes` of data.
pub fn file_bytes(len_bytes: usize) -> u64 {
    (align_up(len_bytes) + FOOTER_BYTES) as u64
}

fn encode_footer(page: &mut [u8], len_bytes: usize, crc: Option<u32>) {
    page.fill(0);
    page[0..8].copy_from_slice(&MAGIC);
    page[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    page[12..16].copy_from_slice(&(if crc.is_some() { HAS_CRC } else { 0 }).to_le_bytes());
    page[16..24].copy_from_slice(&(len_bytes as u64).to_le_bytes());
    page[24..28].copy_from_slice(&crc.unwrap_or(0).to_le_bytes());
    let own = crc32fast::hash(&page[..FIELDS_BYTES]);
    page[28..32].copy_from_slice(&own.to_le_bytes());
}

fn u32_at(page: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(page[at..at + 4].try_into().unwrap())
}

/// Checks a footer read from `path` against the expected length; returns the data's CRC32 if it has one.
fn decode_footer(path: &Path, page: &[u8], len_bytes: usize) -> Result<Option<u32>> {
    let p = path.display();
    if page.iter().all(|&b| b == 0) {
        // What a file created at open but never written holds (fallocate reads back as zeros).
        return Err(StoreError(format!("shard {p}: no footer: it was never completely written")));
    }
    if page[0..8] != MAGIC {
        return Err(StoreError(format!(
            "shard {p}: not a zerostream shard of this format (footer magic {:02x?}): it was written by another version or for another model; remove it or use another directory",
            &page[0..8]
        )));
    }
    if u32_at(page, 28) != crc32fast::hash(&page[..FIELDS_BYTES]) {
        return Err(StoreError(format!("shard {p}: footer checksum mismatch: the footer is corrupt")));
    }
    let version = u32_at(page, 8);
    if version != FORMAT_VERSION {
        return Err(StoreError(format!(
            "shard {p}: format version {version}, this build reads {FORMAT_VERSION}: it was written by another version; remove it or use another directory"
        )));
    }
    let len = u64::from_le_bytes(page[16..24].try_into().unwrap());
    if len != len_bytes as u64 {
        return Err(StoreError(format!(
            "shard {p} holds {len} bytes, expected {len_bytes}: it was written by another version or for another model or configuration; remove it or use another directory"
        )));
    }
    Ok((u32_at(page, 12) & HAS_CRC != 0).then(|| u32_at(page, 24)))
}

/// The shard's current file (another inode after each write).
#[derive(Debug)]
struct Files {
    current: File,
}

/// One tensor's file on the NVMe tier (or, striped over several directories, one stripe's).
#[derive(Debug)]
pub struct ShardFile {
    pub path: PathBuf,
    /// Which of the tier's directories holds it (its spares come from that directory's pool: a spare
    /// takes the shard's name by a rename, which never crosses file systems).
    stripe: usize,
    /// Each write makes another inode current, so reads go through the descriptor of whichever file
    /// the last write left; the lock keeps a read from seeing the exchange half-done.
    files: Mutex<Files>,
    len_bytes: usize,
    pub direct: bool,
}

impl ShardFile {
    /// Opens `{name}.rank{r}.bin`, creating it (zeros: never written) at the page-aligned size of
    /// `len_bytes` plus the footer's page, or reusing its blocks. A file of another size, left by a run
    /// of another shape (a model, a world size, a stripe count), is emptied and sized anew: a tier's
    /// files are a run's scratch, written before they are read (a run's state lives in its
    /// checkpoints), and the directory's lock, held by `nvme`, means no other run is using it. A `.next`
    /// file left by an interrupted write (or a run's spare) is removed: it is never the state (and the
    /// directory's lock, held by `nvme`, means no other run is writing it now). Earlier versions kept
    /// that spare per shard; now spares live in the directory's pool, and this removes an old one.
    pub fn open(nvme: &NvmeDir, name: &str, len_bytes: usize) -> Result<Self> {
        Self::open_stripe(nvme, 0, name, len_bytes)
    }

    /// [`ShardFile::open`] of `name`'s file in directory `stripe` of the tier, holding `len_bytes`.
    pub fn open_stripe(nvme: &NvmeDir, stripe: usize, name: &str, len_bytes: usize) -> Result<Self> {
        let path = nvme.stripe_path(stripe, name);
        nvme.note_opened(&path);
        remove_if_present("removing the unfinished write", &next_path(&path))?;
        let size = file_bytes(len_bytes);
        let (file, direct) = open_in_dir(&nvme.io, "opening shard", &path, true)?;
        let meta = file.metadata().map_err(|e| io_error("reading the size of", &path, e))?;
        if !meta.is_file() {
            return Err(StoreError(format!("shard {}: not a regular file; remove it or use another directory", path.display())));
        }
        let mut actual = meta.len();
        if actual != size && actual != 0 {
            file.set_len(0).map_err(|e| io_error("emptying the earlier run's", &path, e))?;
            actual = 0;
        }
        if actual == 0 {
            // New (or created by a run that died before sizing it, or by a run of another shape):
            // nothing in it to keep.
            if let Err(e) = os::preallocate(&file, size) {
                let _ = std::fs::remove_file(&path);
                return Err(io_error("allocating shard", &path, e));
            }
        }
        Ok(ShardFile { path, stripe, files: Mutex::new(Files { current: file }), len_bytes, direct })
    }

    fn files(&self) -> MutexGuard<'_, Files> {
        // Files have no invariant a panicking holder could have broken.
        self.files.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Writes the buffer (whole pages) and its footer into a spare, then makes the spare the shard.
    /// Until then the current file is untouched; after it the new one is complete.
    pub fn write(&self, nvme: &NvmeDir, buf: &mut AlignedBuf) -> Result<()> {
        assert_eq!(buf.len_bytes(), self.len_bytes, "shard {}: buffer of the wrong size", self.path.display());
        write_all(nvme, &mut [(self, &mut buf.padded_mut()[..align_up(self.len_bytes)])])
    }

    /// Reads the shard into `buf` and checks its footer; with `verify`, checks the data's CRC32.
    pub fn read(&self, nvme: &NvmeDir, buf: &mut AlignedBuf) -> Result<()> {
        assert_eq!(buf.len_bytes(), self.len_bytes, "shard {}: buffer of the wrong size", self.path.display());
        read_all(nvme, &mut [(self, &mut buf.padded_mut()[..align_up(self.len_bytes)])])
    }

    /// The spare files of this shard's directory.
    fn spares<'a>(&self, nvme: &'a NvmeDir) -> &'a crate::spare_pool::SparePool {
        &nvme.stripes[self.stripe].spares
    }

    /// The file the next write goes into: a spare of this shard's size from the directory's pool.
    fn write_target(&self, nvme: &NvmeDir) -> Result<Spare> {
        self.spares(nvme)
            .take(&nvme.io, file_bytes(self.len_bytes))
            .map_err(|e| StoreError(format!("writing shard {}: {e}", self.path.display())))
    }

    /// Makes `target` (the written spare) current, its previous file going back to the pool under a
    /// spare's name: by exchanging the two names in one step where the platform and filesystem can
    /// (and `nvme.atomic_exchange` allows), else by [`ShardFile::install_portably`].
    fn install(&self, nvme: &NvmeDir, files: &mut Files, target: Spare) -> Result<()> {
        if nvme.atomic_exchange {
            match os::exchange(&target.path, &self.path) {
                Ok(true) => {
                    let previous = std::mem::replace(&mut files.current, target.file);
                    self.spares(nvme).give(Spare { file: previous, path: target.path });
                    return Ok(());
                }
                Ok(false) => {} // no exchange here: the portable sequence below
                Err(e) => {
                    self.spares(nvme).give(target);
                    return Err(io_error("replacing shard", &self.path, e));
                }
            }
        }
        self.install_portably(nvme, files, target)
    }

    /// The install without an atomic exchange, in two steps that are each atomic:
    ///
    /// 1. the current file gets a second name, a fresh spare's (a hard link), so that it can be
    ///    reused once `{file}` moves on;
    /// 2. the written spare is renamed over `{file}` (`rename`; `MoveFileEx` with write-through on
    ///    Windows), which replaces the name in one step.
    ///
    /// This is weaker than the exchange only in taking two calls, and it is still safe: `{file}`
    /// names a whole version at every instant, the old one up to step 2 and the new one from it. A
    /// crash between the steps leaves the old state under `{file}` and a second name of it that looks
    /// like a spare; spares are removed when the directory is next opened, and removing a name never
    /// removes a file that another name still holds. Where the filesystem has no hard links (FAT,
    /// some network filesystems), step 1 does nothing and the previous version is freed instead of
    /// reused: slower steady-state writes, the same guarantee.
    fn install_portably(&self, nvme: &NvmeDir, files: &mut Files, target: Spare) -> Result<()> {
        let spares = self.spares(nvme);
        let kept = spares.link_previous(&self.path, &files.current);
        if let Err(e) = os::replace(&target.path, &self.path) {
            if let Some(kept) = kept {
                // Only a second name of the file `{file}` still names: the file stays.
                let _ = std::fs::remove_file(kept);
            }
            spares.give(target);
            return Err(io_error("replacing shard", &self.path, e));
        }
        let previous = std::mem::replace(&mut files.current, target.file);
        if let Some(path) = kept {
            spares.give(Spare { file: previous, path });
        }
        Ok(())
    }
}

/// A shard given twice in one batch would wait on its own lock: a bug in the caller, stopped here.
fn assert_distinct(shards: &[(&ShardFile, &mut [u8])]) {
    for (k, (a, _)) in shards.iter().enumerate() {
        assert!(!shards[..k].iter().any(|(b, _)| std::ptr::eq(*a, *b)), "shard {} given twice in one batch", a.path.display());
    }
}

/// Each shard's data padded to whole pages (`align_up(len_bytes)` bytes), as a batch hands it over.
fn assert_padded_len(shard: &ShardFile, buf: &[u8]) {
    assert_eq!(buf.len(), align_up(shard.len_bytes), "shard {}: buffer of the wrong size", shard.path.display());
}

/// Gives written-or-not spares back to their shards' pools (whatever is in a spare is never read).
fn give_back(nvme: &NvmeDir, shards: &[(&ShardFile, &mut [u8])], targets: Vec<Spare>) {
    shards.iter().zip(targets).for_each(|((shard, _), target)| shard.spares(nvme).give(target));
}

/// Writes every shard's data (each `buf` its padded pages), as [`ShardFile::write`] does, in two
/// batched transfers: all the data (checksummed on the way out), then all the footers; then installs
/// each shard's new file. On an error no shard from the failed one on is changed (each keeps its old
/// state).
pub fn write_all(nvme: &NvmeDir, shards: &mut [(&ShardFile, &mut [u8])]) -> Result<()> {
    assert_distinct(shards);
    let mut locked: Vec<MutexGuard<'_, Files>> = shards.iter().map(|(shard, _)| shard.files()).collect();
    let mut targets: Vec<Spare> = Vec::with_capacity(shards.len());
    for (shard, buf) in shards.iter() {
        assert_padded_len(shard, buf);
        match shard.write_target(nvme) {
            Ok(target) => targets.push(target),
            Err(e) => {
                give_back(nvme, shards, targets);
                return Err(e);
            }
        }
    }
    if let Err(e) = fill_all(nvme, shards, &targets) {
        give_back(nvme, shards, targets);
        return Err(e);
    }
    // No fsync: the guarantee is against the process dying (SIGKILL, OOM, a crash), and the kernel keeps
    // both the written data and the renames (page cache, journal) and flushes them in its own time.
    // Surviving a power loss would take an fsync of the file and the directory per write; without it, a
    // file torn by one is caught by the footer check or, with verify, by the CRC (with verify off, torn
    // data behind an intact footer would go unnoticed).
    let mut installing = shards.iter().zip(locked.iter_mut()).zip(targets);
    for (((shard, _), files), target) in installing.by_ref() {
        if let Err(e) = shard.install(nvme, files, target) {
            installing.for_each(|(((shard, _), _), target)| shard.spares(nvme).give(target));
            return Err(e);
        }
    }
    Ok(())
}

/// Writes the shards' data (whole pages, checksummed as it goes with verify on) and then their
/// footers into `targets` (their spares, already sized).
fn fill_all(nvme: &NvmeDir, shards: &mut [(&ShardFile, &mut [u8])], targets: &[Spare]) -> Result<()> {
    let mut hashers: Vec<crc32fast::Hasher> = shards.iter().map(|_| crc32fast::Hasher::new()).collect();
    let mut segments: Vec<Segment<'_>> = shards
        .iter_mut()
        .zip(targets)
        .zip(hashers.iter_mut())
        .map(|(((shard, buf), target), hasher)| Segment {
            file: &target.file,
            offset: 0,
            buf: &mut buf[..],
            checksum: nvme.verify.then_some((hasher, shard.len_bytes)),
        })
        .collect();
    if let Err(e) = nvme.io.transfer_batch(Direction::Write, &mut segments) {
        let (shard, target) = (&shards[e.segment].0.path, &targets[e.segment].path);
        return Err(io_error(&format!("writing shard {} into its spare", shard.display()), target, e.error));
    }
    drop(segments);
    let mut footers: Vec<AlignedBuf> = shards.iter().map(|_| AlignedBuf::zeroed(FOOTER_BYTES)).collect();
    for (((shard, _), footer), hasher) in shards.iter().zip(footers.iter_mut()).zip(hashers) {
        encode_footer(footer.padded_mut(), shard.len_bytes, nvme.verify.then(|| hasher.finalize()));
    }
    let mut segments: Vec<Segment<'_>> = shards
        .iter()
        .zip(targets)
        .zip(footers.iter_mut())
        .map(|(((shard, _), target), footer)| Segment {
            file: &target.file,
            offset: align_up(shard.len_bytes) as u64,
            buf: footer.padded_mut(),
            checksum: None,
        })
        .collect();
    nvme.io.transfer_batch(Direction::Write, &mut segments).map_err(|e| {
        let (shard, target) = (&shards[e.segment].0.path, &targets[e.segment].path);
        io_error(&format!("writing the footer of shard {} into its spare", shard.display()), target, e.error)
    })
}

/// Reads every shard into its buffer (its padded pages), as [`ShardFile::read`] does, in one batched
/// transfer (each shard's footer and data, the data checksummed as it arrives with verify on), then
/// checks each footer and checksum in turn; the first shard that fails is named.
pub fn read_all(nvme: &NvmeDir, shards: &mut [(&ShardFile, &mut [u8])]) -> Result<()> {
    assert_distinct(shards);
    let locked: Vec<MutexGuard<'_, Files>> = shards.iter().map(|(shard, _)| shard.files()).collect();
    let mut footers: Vec<AlignedBuf> = shards.iter().map(|_| AlignedBuf::zeroed(FOOTER_BYTES)).collect();
    let mut hashers: Vec<crc32fast::Hasher> = shards.iter().map(|_| crc32fast::Hasher::new()).collect();
    let mut segments: Vec<Segment<'_>> = Vec::with_capacity(2 * shards.len());
    for ((((shard, buf), files), footer), hasher) in shards.iter_mut().zip(&locked).zip(footers.iter_mut()).zip(hashers.iter_mut()) {
        assert_padded_len(shard, buf);
        let data_bytes = align_up(shard.len_bytes);
        segments.push(Segment { file: &files.current, offset: data_bytes as u64, buf: footer.padded_mut(), checksum: None });
        let checksum = nvme.verify.then_some((hasher, shard.len_bytes));
        segments.push(Segment { file: &files.current, offset: 0, buf: &mut buf[..], checksum });
    }
    let moved = nvme.io.transfer_batch(Direction::Read, &mut segments);
    drop(segments);
    drop(locked);
    if let Err(e) = moved {
        let what = if e.segment % 2 == 0 { "reading the footer of shard" } else { "reading shard" };
        return Err(io_error(what, &shards[e.segment / 2].0.path, e.error));
    }
    for (((shard, _), footer), hasher) in shards.iter().zip(&footers).zip(hashers) {
        let want = decode_footer(&shard.path, footer.padded(), shard.len_bytes)?;
        if nvme.verify {
            let Some(want) = want else {
                return Err(StoreError(format!(
                    "shard {}: written without a checksum (verification was off), so it cannot be verified; write it again with verification on, or turn it off",
                    shard.path.display()
                )));
            };
            let got = hasher.finalize();
            if want != got {
                return Err(StoreError(format!(
                    "shard {}: checksum mismatch (footer says {want:08x}, data gives {got:08x}): the data is corrupt",
                    shard.path.display()
                )));
            }
        }
    }
    Ok(())
}

/// Where earlier versions wrote `path`'s spare (removed when the shard is opened).
pub fn next_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".next");
    PathBuf::from(p)
}
