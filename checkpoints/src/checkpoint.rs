//! The checkpoint directory: `step-NNNNNNNN/` directories (eight digits, the optimizer steps completed)
//! and a `latest` file naming the newest, under one root that a run holds an exclusive lock on.
//!
//! Crash safety comes from the order of operations, not from luck: a checkpoint is written into
//! `.step-NNNNNNNN.partial/`, every file in it fsynced, the directory renamed into place (exchanged
//! atomically with an older copy of the same step, if there is one) and the root fsynced; only then
//! is `latest` replaced, by rename of a fsynced temporary. SIGKILL at any instant leaves the previous
//! checkpoint whole and `latest` naming a complete one. Leftover `.partial` directories and
//! temporaries are recognised by name and removed when the root is next opened.
//!
//! What a checkpoint holds is the trainer's business; this module moves directories and checks the
//! manifest of file sizes and CRC32s that lets a reader refuse a truncated or bit-flipped file.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub use crate::safetensors_stream::FileDigest;
use crate::safetensors_stream::digest_file;

/// The file naming the newest complete checkpoint of a root.
pub const LATEST: &str = "latest";
/// The trainer's state file: present in every complete checkpoint.
pub const STATE_FILE: &str = "trainer_state.json";
const PARTIAL_SUFFIX: &str = ".partial";
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

/// Fsyncs a directory, so the names created or renamed in it survive a power loss.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing directory {}", dir.display()))
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
    f.write_all(text).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    sync_dir(dir)
}

/// A checkpoint root this run writes into, locked against other runs.
pub struct CheckpointRoot {
    pub dir: PathBuf,
    /// What [`CheckpointRoot::open`] removed: directories and files of saves that were interrupted.
    pub removed_leftovers: Vec<PathBuf>,
    _lock: File,
}

impl CheckpointRoot {
    /// Opens (creating it if missing) the root `dir` for writing: takes its lock, so a second run
    /// given the same directory is refused, and removes what interrupted saves left behind.
    pub fn open(dir: &Path) -> Result<Self> {
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
        if lock.try_lock().is_err() {
            bail!(
                "--checkpoint-dir {} is in use by another zerostream run (it holds {}): give each run its own directory",
                dir.display(),
                lock_path.display()
            );
        }
        let mut removed_leftovers = Vec::new();
        for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(PARTIAL_SUFFIX) {
                let path = entry.path();
                let kind = entry.file_type()?;
                if kind.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) }
                    .with_context(|| format!("removing the leftover of an interrupted save {}", path.display()))?;
                removed_leftovers.push(path);
            }
        }
        Ok(CheckpointRoot { dir: dir.to_path_buf(), removed_leftovers, _lock: lock })
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
        write_file_atomic(&self.dir.join(LATEST), format!("{}\n", step_name(step)).as_bytes())?;
        Ok(target)
    }

    /// Removes all but the `keep` newest checkpoints at or before `current` (0 keeps all). Later
    /// steps, left by an earlier run that went further, are not touched.
    pub fn prune(&self, keep: usize, current: u64) -> Result<Vec<PathBuf>> {
        if keep == 0 {
            return Ok(Vec::new());
        }
        let mut steps: Vec<(u64, PathBuf)> = list_checkpoints(&self.dir)?.into_iter().filter(|(s, _)| *s <= current).collect();
        steps.sort();
        let excess = steps.len().saturating_sub(keep);
        let mut removed = Vec::new();
        for (_, path) in steps.into_iter().take(excess) {
            std::fs::remove_dir_all(&path).with_context(|| format!("removing old checkpoint {}", path.display()))?;
            removed.push(path);
        }
        Ok(removed)
    }
}

/// Moves the completely written directory `partial` to `target`: fsyncs its files and itself, renames
/// it into place — or, when `target` exists, exchanges the two atomically and removes the old one, now
/// under the partial name — and fsyncs the parent.
pub fn publish_dir(partial: &Path, target: &Path) -> Result<()> {
    for entry in std::fs::read_dir(partial).with_context(|| format!("listing {}", partial.display()))? {
        let path = entry?.path();
        File::open(&path).and_then(|f| f.sync_all()).with_context(|| format!("syncing {}", path.display()))?;
    }
    sync_dir(partial)?;
    let parent = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if target.exists() {
        exchange(partial, target)?;
        sync_dir(parent)?;
        std::fs::remove_dir_all(partial).with_context(|| format!("removing the replaced {}", partial.display()))?;
    } else {
        std::fs::rename(partial, target).with_context(|| format!("renaming {} to {}", partial.display(), target.display()))?;
    }
    sync_dir(parent)
}

/// `.step-NNNNNNNN.partial` under `root`.
pub fn partial_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!(".{}{PARTIAL_SUFFIX}", step_name(step)))
}

/// Swaps two directories atomically (Linux renameat2 RENAME_EXCHANGE); where the filesystem cannot,
/// moves the old one aside first (a crash between the two renames then leaves the step missing, never
/// half-written).
fn exchange(a: &Path, b: &Path) -> Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let (ca, cb) = (CString::new(a.as_os_str().as_bytes())?, CString::new(b.as_os_str().as_bytes())?);
    // SAFETY: both are valid NUL-terminated paths; renameat2 only reads them.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), libc::RENAME_EXCHANGE) };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP)) {
        return Err(e).with_context(|| format!("exchanging {} and {}", a.display(), b.display()));
    }
    let aside = a.with_extension("old.partial");
    std::fs::rename(b, &aside).with_context(|| format!("moving {} aside", b.display()))?;
    std::fs::rename(a, b).with_context(|| format!("renaming {} to {}", a.display(), b.display()))?;
    std::fs::rename(&aside, a).with_context(|| format!("renaming {} to {}", aside.display(), a.display()))
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
        bail!("--resume {}: no such directory (expected a checkpoint step-NNNNNNNN/ or a --checkpoint-dir)", path.display());
    }
    if path.join(STATE_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join(LATEST);
    if latest.is_file() {
        let name = std::fs::read_to_string(&latest).with_context(|| format!("reading {}", latest.display()))?;
        let name = name.trim();
        if parse_step_name(name).is_none() {
            bail!("{}: expected a checkpoint name like step-00000010, found {name:?}", latest.display());
        }
        let dir = path.join(name);
        if !dir.join(STATE_FILE).is_file() {
            bail!("{} names {name}, which is missing or incomplete", latest.display());
        }
        return Ok(dir);
    }
    match list_checkpoints(path)?.pop() {
        Some((_, dir)) => Ok(dir),
        None => bail!("--resume {}: neither a checkpoint (no {STATE_FILE}) nor a checkpoint directory holding one", path.display()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_checkpoint(root: &CheckpointRoot, step: u64, body: &str) -> PathBuf {
        let p = root.begin(step).unwrap();
        std::fs::write(p.join(STATE_FILE), body).unwrap();
        root.commit(step, &p).unwrap()
    }

    #[test]
    fn commits_move_into_place_update_latest_and_replace_old_copies() {
        let dir = tempfile::tempdir().unwrap();
        let root = CheckpointRoot::open(&dir.path().join("ck")).unwrap();
        let a = fake_checkpoint(&root, 1, "one");
        fake_checkpoint(&root, 2, "two");
        assert_eq!(a.file_name().unwrap(), "step-00000001");
        assert_eq!(resolve_resume(&root.dir).unwrap(), root.dir.join("step-00000002"));
        // Resumed from step 1, the run writes step 2 again: the new copy replaces the old.
        fake_checkpoint(&root, 2, "two again");
        assert_eq!(std::fs::read_to_string(root.dir.join("step-00000002").join(STATE_FILE)).unwrap(), "two again");
        fake_checkpoint(&root, 3, "three");
        let removed = root.prune(2, 3).unwrap();
        assert_eq!(removed, vec![root.dir.join("step-00000001")]);
        let names: Vec<_> = std::fs::read_dir(&root.dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert!(names.iter().all(|n| !n.ends_with(PARTIAL_SUFFIX)), "{names:?}");
        assert_eq!(list_checkpoints(&root.dir).unwrap().len(), 2);
    }

    #[test]
    fn a_second_run_is_refused_and_leftovers_are_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let root = CheckpointRoot::open(dir.path()).unwrap();
        let err = CheckpointRoot::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("in use by another zerostream run"), "{err}");
        let interrupted = root.begin(7).unwrap();
        std::fs::write(interrupted.join("model.safetensors"), b"half").unwrap();
        drop(root);
        let root = CheckpointRoot::open(dir.path()).unwrap();
        assert_eq!(root.removed_leftovers, vec![interrupted.clone()]);
        assert!(!interrupted.exists());
        let err = resolve_resume(dir.path()).unwrap_err().to_string();
        assert!(err.contains("neither a checkpoint"), "{err}");
    }

    #[test]
    fn manifests_catch_truncation_corruption_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"hello world").unwrap();
        let manifest = BTreeMap::from([("a".to_string(), digest_file(&dir.path().join("a")).unwrap())]);
        verify_files(dir.path(), &manifest).unwrap();
        std::fs::write(dir.path().join("a"), b"hello worle").unwrap();
        assert!(verify_files(dir.path(), &manifest).unwrap_err().to_string().contains("corrupt"));
        std::fs::write(dir.path().join("a"), b"hello").unwrap();
        assert!(verify_files(dir.path(), &manifest).unwrap_err().to_string().contains("truncated"));
        std::fs::remove_file(dir.path().join("a")).unwrap();
        assert!(verify_files(dir.path(), &manifest).unwrap_err().to_string().contains("missing"));
    }

    #[test]
    fn step_names_round_trip() {
        assert_eq!(step_name(42), "step-00000042");
        assert_eq!(parse_step_name("step-00000042"), Some(42));
        assert_eq!(parse_step_name("step-42"), None);
        assert_eq!(parse_step_name("step-0000004x"), None);
    }
}
