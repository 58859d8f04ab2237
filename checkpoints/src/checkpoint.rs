//! The checkpoint directory: `step-NNNNNNNN/` directories (eight digits, the optimizer steps completed)
//! and a `latest` file naming the newest, under one root that a run holds an exclusive lock on.
//!
//! Crash safety comes from the order of operations, not from luck: a checkpoint is written into
//! `.step-NNNNNNNN.partial/`, every file in it made durable (`fsync`; `F_FULLFSYNC` on macOS, where
//! `fsync` stops at the drive's cache; `FlushFileBuffers` on Windows), the directory renamed into
//! place and the root synced (where a directory can be: not on Windows, where moves are written
//! through instead); only then is `latest` replaced, by rename of a synced temporary. An older copy
//! of the same step is exchanged with the new one atomically where the platform can, else moved aside
//! first ([`publish_dir`]). SIGKILL or a power loss at any instant leaves the previous checkpoint
//! whole and `latest` naming a complete one. Leftover `.partial` directories and temporaries are
//! recognised by name and removed when the root is next opened; an old copy moved aside is restored
//! or removed then.
//!
//! What a checkpoint holds is the trainer's business; this module moves directories and checks the
//! manifest of file sizes and CRC32s that lets a reader refuse a truncated or bit-flipped file.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};

use crate::os;
pub use crate::safetensors_stream::FileDigest;
use crate::safetensors_stream::digest_file;

/// The file naming the newest complete checkpoint of a root.
pub const LATEST: &str = "latest";
/// The trainer's state file: present in every complete checkpoint.
pub const STATE_FILE: &str = "trainer_state.json";
const PARTIAL_SUFFIX: &str = ".partial";
/// An old copy moved aside by [`publish_dir`] where names cannot be exchanged: `.{name}.replaced`.
const REPLACED_SUFFIX: &str = ".replaced";
const LOCK_FILE: &str = ".zerostream.lock";

/// `step-00000042`.
pub fn step_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// The step a `step-NNNNNNNN` name stands for.
pub fn parse_step_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    (digits.len() == 8 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
}

/// Makes the names created or renamed in a directory durable, so they survive a power loss (a no-op
/// on Windows, whose moves are written through).
pub fn sync_dir(dir: &Path) -> Result<()> {
    os::sync_dir(dir).with_context(|| format!("syncing directory {}", dir.display()))
}

/// Makes the folder an output `path` (given as `flag`) goes into, where missing; a file in the way is
/// named as such rather than by the OS's "File exists".
pub fn create_parent_dir(flag: &str, path: &Path) -> Result<()> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else { return Ok(()) };
    if let Some(file) = parent.ancestors().find(|a| a.exists()).filter(|a| !a.is_dir()) {
        bail!("{flag} {}: {} is a file, not a directory", path.display(), file.display());
    }
    std::fs::create_dir_all(parent).with_context(|| format!("{flag} {}: creating {}", path.display(), parent.display()))
}

/// Writes `text` to `path` through a fsynced temporary beside it and a rename: readers see the old
/// file or the new one, never a mix.
pub fn write_file_atomic(path: &Path, text: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).context("a file name")?;
    let tmp = dir.join(format!(".{name}.{}{PARTIAL_SUFFIX}", std::process::id()));
    let mut f =
        File::options().write(true).create(true).truncate(true).open(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    if let Err(e) = f.write_all(text).and_then(|()| os::sync_file(&f)) {
        // Not left to fill the disk that refused it.
        drop(f);
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {} (through {})", path.display(), tmp.display()));
    }
    drop(f);
    os::replace_file(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    sync_dir(dir)
}

/// A checkpoint root this run writes into, locked against other runs.
pub struct CheckpointRoot {
    pub dir: PathBuf,
    /// What [`CheckpointRoot::open`] removed: directories and files of saves that were interrupted.
    pub removed_leftovers: Vec<PathBuf>,
    /// Checkpoints [`CheckpointRoot::open`] put back under their names: old copies that a save,
    /// interrupted while replacing them without an atomic exchange, had moved aside.
    pub restored: Vec<PathBuf>,
    /// The root's checkpoints after the one this run resumed from: a line the earlier run went on
    /// with and this one leaves. Each is replaced if this run saves its step, and never counted or
    /// removed by [`CheckpointRoot::prune`].
    pub left_behind: Vec<u64>,
    /// The step resumed from, where it is one of this root's: the root's checkpoints up to it are
    /// this run's past.
    resumed_step: Option<u64>,
    /// The steps this run has saved here.
    written: Mutex<BTreeSet<u64>>,
    _lock: File,
}

impl CheckpointRoot {
    /// Opens (creating it if missing) the root `dir` for writing: takes its lock, so a second run
    /// given the same directory is refused, and cleans up after interrupted saves. `resumed_from`:
    /// the checkpoint this run resumed from, if any. A root holding checkpoints is refused unless
    /// that checkpoint is one of them: a run that did not come from there would replace and prune
    /// another run's.
    pub fn open(dir: &Path, resumed_from: Option<&Path>) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating --checkpoint-dir {}", dir.display()))?;
        if !dir.is_dir() {
            bail!("--checkpoint-dir {}: not a directory", dir.display());
        }
        let lock_path = dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("--checkpoint-dir {}: cannot create {} (is it writable?)", dir.display(), lock_path.display()))?;
        // std's lock (flock, LockFileEx on Windows) goes with the process however it ends.
        if !lock_patiently(&lock) {
            bail!(
                "--checkpoint-dir {} is in use by another zerostream run (it holds {}): give each run its own directory",
                dir.display(),
                lock_path.display()
            );
        }
        let (removed_leftovers, restored) = clean_up_interrupted_saves(dir)?;
        let resumed_step = check_root_takes(dir, resumed_from)?;
        let held = list_checkpoints(dir)?;
        let left_behind = held.iter().map(|(s, _)| *s).filter(|s| resumed_step.is_some_and(|r| *s > r)).collect();
        Ok(CheckpointRoot {
            dir: dir.to_path_buf(),
            removed_leftovers,
            restored,
            left_behind,
            resumed_step,
            written: Mutex::new(BTreeSet::new()),
            _lock: lock,
        })
    }

    /// The directory a checkpoint of `step` is written into before [`CheckpointRoot::commit`]; ranks
    /// that do not hold the root compute it with [`partial_dir`].
    pub fn begin(&self, step: u64) -> Result<PathBuf> {
        let partial = partial_dir(&self.dir, step);
        if partial.exists() {
            std::fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
        }
        std::fs::create_dir(&partial).with_context(|| format!("creating {}", partial.display()))?;
        Ok(partial)
    }

    /// Makes the checkpoint written into `partial` the step's, then the latest: fsyncs its files and
    /// itself, moves it into place and replaces `latest`.
    pub fn commit(&self, step: u64, partial: &Path) -> Result<PathBuf> {
        let target = self.dir.join(step_name(step));
        // An older copy of this step (a run resumed from an earlier checkpoint went past it before)
        // is replaced whole.
        publish_dir(partial, &target)?;
        self.written.lock().unwrap_or_else(|e| e.into_inner()).insert(step);
        write_file_atomic(&self.dir.join(LATEST), format!("{}\n", step_name(step)).as_bytes())?;
        Ok(target)
    }

    /// Removes all but the `keep` newest checkpoints of this run's line (0 keeps all): those up to
    /// the one it resumed from, and those it wrote. The ones it left behind (after the step it
    /// resumed from, not yet replaced) are neither counted nor removed.
    pub fn prune(&self, keep: usize) -> Result<Vec<PathBuf>> {
        if keep == 0 {
            return Ok(Vec::new());
        }
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let ours = |s: u64| written.contains(&s) || self.resumed_step.is_some_and(|r| s <= r);
        let steps: Vec<(u64, PathBuf)> = list_checkpoints(&self.dir)?.into_iter().filter(|(s, _)| ours(*s)).collect();
        let excess = steps.len().saturating_sub(keep);
        let mut removed = Vec::new();
        for (step, path) in steps.into_iter().take(excess) {
            // Out of the list first, whole (a removal that stops half-way must not leave a checkpoint
            // that lists as complete); what the removal leaves, the next open clears as a leftover.
            let going = partial_dir(&self.dir, step);
            if going.exists() {
                let _ = std::fs::remove_dir_all(&going);
            }
            std::fs::rename(&path, &going).with_context(|| format!("removing old checkpoint {}", path.display()))?;
            let _ = std::fs::remove_dir_all(&going);
            removed.push(path);
        }
        Ok(removed)
    }
}

/// Removes what interrupted saves left in the root `dir` (`.partial` directories and temporaries),
/// and settles old copies that a portable replacement moved aside ([`restore_replaced`]). Returns
/// (what was removed, which checkpoints were restored). Called under the root's lock.
fn clean_up_interrupted_saves(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let (mut removed, mut restored) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with('.') && name.ends_with(PARTIAL_SUFFIX) {
            let kind = entry.file_type()?;
            if kind.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) }
                .with_context(|| format!("removing the leftover of an interrupted save {}", path.display()))?;
            removed.push(path);
        } else if let Some(original) = name.strip_prefix('.').and_then(|n| n.strip_suffix(REPLACED_SUFFIX)) {
            let target = dir.join(original);
            match restore_replaced(&target)? {
                Some(Restored::OldCopyBack) => restored.push(target),
                Some(Restored::OldCopyRemoved) => removed.push(path),
                None => {}
            }
        }
    }
    Ok((removed, restored))
}

/// Moves the completely written directory `partial` to `target`: makes its files and itself durable,
/// renames it into place — or, when `target` exists, exchanges the two atomically and removes the
/// old one, now under the partial name; where names cannot be exchanged, replaces it in three steps
/// ([`replace_dir_portably`]) — and syncs the parent.
pub fn publish_dir(partial: &Path, target: &Path) -> Result<()> {
    publish_dir_by(partial, target, true)
}

/// [`publish_dir`], with the atomic exchange allowed or not (`false`: the portable sequence, which
/// the tests run on platforms that have the exchange).
fn publish_dir_by(partial: &Path, target: &Path, exchange_allowed: bool) -> Result<()> {
    // A replacement of this target that a crash interrupted is settled first.
    restore_replaced(target)?;
    for entry in std::fs::read_dir(partial).with_context(|| format!("listing {}", partial.display()))? {
        let path = entry?.path();
        os::sync_path(&path).with_context(|| format!("syncing {}", path.display()))?;
    }
    sync_dir(partial)?;
    let parent = parent_of(target);
    if !target.exists() {
        os::rename(partial, target).with_context(|| format!("renaming {} to {}", partial.display(), target.display()))?;
    } else if exchange_allowed
        && os::exchange(partial, target).with_context(|| format!("exchanging {} and {}", partial.display(), target.display()))?
    {
        sync_dir(parent)?;
        std::fs::remove_dir_all(partial).with_context(|| format!("removing the replaced {}", partial.display()))?;
    } else {
        replace_dir_portably(partial, target)?;
    }
    sync_dir(parent)
}

/// Replaces the directory `target` with `partial` where the two names cannot be exchanged in one
/// step (Windows; filesystems that refuse `RENAME_EXCHANGE`/`RENAME_SWAP`), in three steps, each an
/// atomic rename or removal, each made durable before the next:
///
/// 1. the old copy moves aside, to `.{name}.replaced` beside it;
/// 2. the new copy takes the name;
/// 3. the old copy is removed.
///
/// Weaker than the exchange: between steps 1 and 2 the name is missing. Still safe: the old copy is
/// whole under its aside name throughout, and [`restore_replaced`] (run when the root is opened, and
/// before the next publication to the same target) puts it back if the name is still missing, or
/// removes it if step 2 was done. The new copy, still `.partial` if the crash came before step 2,
/// is removed like any interrupted save. A crash loses at most the copy being written, never one
/// already saved.
fn replace_dir_portably(partial: &Path, target: &Path) -> Result<()> {
    let (aside, parent) = (replaced_path(target)?, parent_of(target));
    os::rename(target, &aside).with_context(|| format!("moving {} aside to {}", target.display(), aside.display()))?;
    sync_dir(parent)?;
    os::rename(partial, target).with_context(|| format!("renaming {} to {}", partial.display(), target.display()))?;
    sync_dir(parent)?;
    std::fs::remove_dir_all(&aside).with_context(|| format!("removing the replaced {}", aside.display()))
}

/// What [`restore_replaced`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restored {
    /// The old copy was put back under the target's name (the crash came before the new copy's rename).
    OldCopyBack,
    /// The old copy was removed (the new copy had taken the name).
    OldCopyRemoved,
}

/// Settles a replacement of `target` by [`replace_dir_portably`] that a crash interrupted: if the old
/// copy is still aside (`.{name}.replaced`), it goes back under `target`'s name when that is missing,
/// else it is removed. `None` when there is nothing aside.
pub fn restore_replaced(target: &Path) -> Result<Option<Restored>> {
    let aside = replaced_path(target)?;
    if std::fs::symlink_metadata(&aside).is_err() {
        return Ok(None);
    }
    if std::fs::symlink_metadata(target).is_ok() {
        std::fs::remove_dir_all(&aside).with_context(|| format!("removing {}, replaced by {}", aside.display(), target.display()))?;
        return Ok(Some(Restored::OldCopyRemoved));
    }
    os::rename(&aside, target).with_context(|| format!("restoring {} from {}", target.display(), aside.display()))?;
    sync_dir(parent_of(target))?;
    Ok(Some(Restored::OldCopyBack))
}

/// Where [`replace_dir_portably`] moves `target`'s old copy: `.{name}.replaced` beside it.
fn replaced_path(target: &Path) -> Result<PathBuf> {
    let name = target.file_name().with_context(|| format!("{}: not a directory name", target.display()))?;
    Ok(parent_of(target).join(format!(".{}{REPLACED_SUFFIX}", name.to_string_lossy())))
}

/// The directory holding `path` ("." for a bare name).
fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Refuses the root `dir` (if it exists) to a run not resumed from one of the checkpoints it holds:
/// that run would replace and prune another run's. Returns the step resumed from where it is one of
/// the root's. Read-only: checked before any work, and again by [`CheckpointRoot::open`] under the lock.
pub fn check_root_takes(dir: &Path, resumed_from: Option<&Path>) -> Result<Option<u64>> {
    let resumed_step = resumed_from.and_then(|c| step_in_root(dir, c));
    let held = if dir.is_dir() { list_checkpoints(dir)? } else { Vec::new() };
    if let (Some((first, _)), Some((last, _)), None) = (held.first(), held.last(), resumed_step) {
        let what = if first == last { step_name(*first) } else { format!("{} to {}", step_name(*first), step_name(*last)) };
        let came_from = match resumed_from {
            Some(c) => format!("this run resumed from {}, not from one of them", c.display()),
            None => "this run starts afresh".to_string(),
        };
        bail!(
            "--checkpoint-dir {} already holds checkpoints ({what}) and {came_from}: continue that run with --resume {}, \
             or give this run a directory of its own (nothing there is replaced or removed)",
            dir.display(),
            dir.display()
        );
    }
    Ok(resumed_step)
}

/// The step of `checkpoint` where it is a `step-NNNNNNNN` directory directly under `root`, both paths
/// resolved first (a relative and an absolute spelling agree; a link to a step directory is the step's).
fn step_in_root(root: &Path, checkpoint: &Path) -> Option<u64> {
    let resolved = checkpoint.canonicalize().ok()?;
    let step = parse_step_name(resolved.file_name()?.to_str()?)?;
    (resolved.parent()? == root.canonicalize().ok()?).then_some(step)
}

/// `.step-NNNNNNNN.partial` under `root`.
pub fn partial_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!(".{}{PARTIAL_SUFFIX}", step_name(step)))
}

/// The complete checkpoints under `root` (those with a state file), by step.
pub fn list_checkpoints(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root).with_context(|| format!("listing {}", root.display()))? {
        let entry = entry?;
        if let Some(step) = entry.file_name().to_str().and_then(parse_step_name)
            && entry.path().join(STATE_FILE).is_file()
        {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// What `--resume PATH` names: a checkpoint (a directory with a state file), or a root, meaning the
/// checkpoint its `latest` names.
pub fn resolve_resume(path: &Path) -> Result<PathBuf> {
    if !path.is_dir() {
        let what = if path.exists() { "not a directory" } else { "no such directory" };
        bail!("--resume {}: {what} (expected a checkpoint step-NNNNNNNN/ or a --checkpoint-dir)", path.display());
    }
    if path.join(STATE_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join(LATEST);
    if latest.is_file() {
        let name = std::fs::read_to_string(&latest).with_context(|| format!("reading {}", latest.display()))?;
        let name = name.trim();
        if parse_step_name(name).is_none() {
            bail!("{}: expected a checkpoint name like step-00000010, found {name:?}{}", latest.display(), complete_ones(path));
        }
        let dir = path.join(name);
        if !dir.join(STATE_FILE).is_file() {
            bail!("{} names {name}, which is missing or incomplete{}", latest.display(), complete_ones(path));
        }
        return Ok(dir);
    }
    match list_checkpoints(path)?.pop() {
        Some((_, dir)) => Ok(dir),
        None => bail!("--resume {}: neither a checkpoint (no {STATE_FILE}) nor a checkpoint directory holding one", path.display()),
    }
}

/// Where `root`'s `latest` is broken, the complete checkpoints beside it and how to name one.
fn complete_ones(root: &Path) -> String {
    let complete = match list_checkpoints(root) {
        Ok(complete) => complete,
        Err(e) => return format!("; listing the others failed: {e:#}"),
    };
    // The latest few: a long run keeps many.
    const SAID: usize = 5;
    let names: Vec<String> = complete.iter().rev().take(SAID).rev().map(|(step, _)| step_name(*step)).collect();
    let more = if complete.len() > SAID { format!("{} more, then ", complete.len() - SAID) } else { String::new() };
    match complete.last() {
        None => "; the folder holds no complete checkpoint".into(),
        Some((_, last)) => format!("; complete checkpoints there: {more}{} (name one, e.g. {})", names.join(", "), last.display()),
    }
}

/// The model directory `--model PATH` means: PATH itself, or — given a checkpoint root (no
/// config.json of its own) — the checkpoint its `latest` names, whose model files `eval` and
/// `generate` read as any Hugging Face directory's. A root whose `latest` is broken is refused with
/// what is wrong with it; any other path is given back for the model's reader to name what it lacks.
pub fn model_dir(path: &Path) -> Result<PathBuf> {
    if path.join("config.json").exists() || !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    if !path.join(LATEST).exists() && list_checkpoints(path)?.is_empty() {
        return Ok(path.to_path_buf());
    }
    resolve_resume(path).with_context(|| format!("--model {}: a checkpoint directory", path.display()))
}

/// Checks every file of a checkpoint against the manifest written with it: present, of the recorded
/// size, and with the recorded CRC32. Names the first file that is not, and what is wrong with it.
pub fn verify_files(dir: &Path, manifest: &BTreeMap<String, FileDigest>) -> Result<()> {
    for (name, want) in manifest {
        let path = dir.join(name);
        if !path.is_file() {
            bail!("checkpoint {}: file {name} is missing", dir.display());
        }
        let got = digest_file(&path)?;
        if got.bytes != want.bytes {
            bail!("checkpoint {}: {name} is {} bytes, the manifest says {} (truncated or replaced)", dir.display(), got.bytes, want.bytes);
        }
        if got.crc32 != want.crc32 {
            bail!(
                "checkpoint {}: {name} has CRC32 {:08x}, the manifest says {:08x}: the file is corrupt",
                dir.display(),
                got.crc32,
                want.crc32
            );
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests;
