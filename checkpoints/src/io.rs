//! File access shared by the readers and writers: opening only regular files, positioned reads,
//! a file's size and modification time to notice it changing under a run, and temporary names that
//! can never be an existing file.

use std::fs::{File, Metadata, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use anyhow::{Context, Result, bail};

use crate::os;

/// Opens `path` for reading and refuses anything but a regular file. `what` names the file in errors
/// ("token file", "safetensors file").
///
/// A plain open of a FIFO blocks until a writer comes, and a directory or device is no model or
/// data file: open without blocking, then look at what was opened (not at the path, which could be
/// swapped between a check and the open).
pub(crate) fn open_regular(path: &Path, what: &str) -> Result<(File, Metadata)> {
    // Where no open flag keeps an open from blocking on a FIFO, the path is looked at first too.
    #[cfg(not(unix))]
    refuse_irregular(path, what, &std::fs::metadata(path).with_context(|| format!("{what} {}", path.display()))?)?;
    let file = os::read_options().open(path).with_context(|| format!("opening {what} {}", path.display()))?;
    let meta = file.metadata().with_context(|| format!("{what} {}", path.display()))?;
    refuse_irregular(path, what, &meta)?;
    Ok((file, meta))
}

/// The text of the regular file `path` ([`open_regular`]: a FIFO given as config.json is refused,
/// not waited on for ever).
pub(crate) fn read_regular_text(path: &Path, what: &str) -> Result<String> {
    let (mut file, _) = open_regular(path, what)?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text).with_context(|| format!("reading {what} {}", path.display()))?;
    Ok(text)
}

fn refuse_irregular(path: &Path, what: &str, meta: &Metadata) -> Result<()> {
    if !meta.is_file() {
        let kind = if meta.is_dir() { "a directory" } else { "a pipe, socket or device" };
        bail!("{what} {} is {kind}, not a regular file", path.display());
    }
    Ok(())
}

pub(crate) use crate::os::read_exact_at;

/// A file's size and modification time when it was opened. Compared with the open file's current
/// ones before each read: a file rewritten in place would otherwise hand a run a mix of old and new
/// data. (A file replaced by a rename is not seen: the run keeps reading the file it opened.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Stamp {
    pub len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    pub fn of(meta: &Metadata) -> Self {
        Stamp { len: meta.len(), modified: meta.modified().ok() }
    }

    /// What changed in `file` since this stamp was taken, in words; `None` when nothing did.
    pub fn change(&self, file: &File) -> std::io::Result<Option<String>> {
        let now = Stamp::of(&file.metadata()?);
        Ok(if now.len != self.len {
            Some(format!("it was {} bytes when opened and is {} bytes now", self.len, now.len))
        } else if now.modified != self.modified {
            Some("it was rewritten after it was opened".into())
        } else {
            None
        })
    }
}

/// Creates a new file beside `path` to write it through, named `.{name}.zerostream-{pid}-{n}.tmp`.
/// It is created with `create_new`, so it is never a file that already exists (another run's
/// temporary file, or a user's `x.tmp`): on a clash the next number is tried.
pub(crate) fn create_temp_beside(path: &Path) -> Result<(File, PathBuf)> {
    claim_name_beside(path, "creating a temporary file", |tmp| OpenOptions::new().write(true).create_new(true).open(tmp))
}

/// Calls `claim` with temporary names beside `path` until one is not taken (`claim` fails with
/// `AlreadyExists` on a taken one, as `create_new` and `hard_link` do).
fn claim_name_beside<T>(path: &Path, doing: &str, claim: impl Fn(&Path) -> std::io::Result<T>) -> Result<(T, PathBuf)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().with_context(|| format!("{}: not a file name", path.display()))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // The clock only spreads names apart between processes that share a pid (containers).
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    for _ in 0..1000 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{}.zerostream-{}-{nanos}-{n}.tmp", name.to_string_lossy(), std::process::id()));
        match claim(&tmp) {
            Ok(claimed) => return Ok((claimed, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("writing {}: {doing} in {}", path.display(), dir.display())),
        }
    }
    bail!("writing {}: no free temporary name in {} after 1000 tries", path.display(), dir.display())
}

/// Moves the finished (synced) temporary file `tmp` onto `path`, removing `tmp` (ours) when that fails.
pub(crate) fn rename_into_place(tmp: &Path, path: &Path) -> Result<()> {
    if let Err(e) = os::replace_file(tmp, path) {
        let _ = std::fs::remove_file(tmp);
        return Err(e).with_context(|| format!("writing {}: renaming {} onto it", path.display(), tmp.display()));
    }
    // The rename is durable once the directory is synced. The file is complete either way, so a
    // directory that cannot be synced (some filesystems refuse) is no error.
    if let Some(dir) = tmp.parent() {
        let _ = os::sync_dir(if dir.as_os_str().is_empty() { Path::new(".") } else { dir });
    }
    Ok(())
}

/// Files written whole under temporary names ([`create_temp_beside`]), then renamed into place
/// together by [`StagedFiles::commit`]: a failure while writing or renaming any of them leaves
/// every target as it was, so files that belong together (a token file and its tokenizer record)
/// are never left half old and half new. Temporaries not committed are removed when it drops.
#[derive(Default)]
pub struct StagedFiles {
    /// (temporary, target), in the order they are renamed.
    staged: Vec<(PathBuf, PathBuf)>,
}

impl StagedFiles {
    /// Writes `bytes` to a synced temporary file beside `path`.
    pub fn stage(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        let (mut file, tmp) = create_temp_beside(path)?;
        // Synced before the rename: otherwise a crash can leave `path` renamed but empty.
        if let Err(e) = file.write_all(bytes).and_then(|()| os::sync_file(&file)) {
            drop(file);
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("writing {} (through {})", path.display(), tmp.display()));
        }
        self.staged.push((tmp, path.to_path_buf()));
        Ok(())
    }

    /// Renames every staged file onto its target, in the order staged. A rename that fails (a target
    /// made a directory meanwhile) undoes those before it: a target that was not there is removed, and
    /// each target replaced was first kept under a second name (a hard link, so the rename still
    /// replaces it in one step), put back on failure and removed on success. Where no hard link can be
    /// made (a file system without them, a link or another owner's file under protected hard links)
    /// that target is left new, and the error says so. (A crash part-way leaves the renamed ones new
    /// too: no journal is kept.)
    pub fn commit(mut self) -> Result<()> {
        let mut done: Vec<(PathBuf, Before)> = Vec::new();
        while !self.staged.is_empty() {
            let (tmp, path) = self.staged.remove(0);
            let before = match std::fs::symlink_metadata(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Before::Absent,
                Ok(m) if m.is_file() => match claim_name_beside(&path, "keeping the old file", |aside| std::fs::hard_link(&path, aside)) {
                    Ok(((), aside)) => Before::Kept(aside),
                    Err(_) => Before::Unkept,
                },
                _ => Before::Unkept,
            };
            if let Err(e) = rename_into_place(&tmp, &path) {
                // This target's old file was never replaced: only its second name goes.
                if let Before::Kept(aside) = before {
                    let _ = std::fs::remove_file(aside);
                }
                let mut left_new = Vec::new();
                for (path, before) in done.iter().rev() {
                    let undone = match before {
                        Before::Kept(aside) => os::replace_file(aside, path),
                        Before::Absent => std::fs::remove_file(path),
                        Before::Unkept => Err(std::io::Error::other("no copy of the old file")),
                    };
                    if undone.is_err() {
                        left_new.push(path.display().to_string());
                    }
                }
                if !left_new.is_empty() {
                    return Err(e).with_context(|| format!("{} could not be put back and hold the new contents", left_new.join(", ")));
                }
                return Err(e);
            }
            done.push((path, before));
        }
        for (_, before) in done {
            if let Before::Kept(aside) = before {
                let _ = std::fs::remove_file(aside);
            }
        }
        Ok(())
    }
}

/// What a staged file's target was before the commit renamed onto it.
enum Before {
    /// Nothing: undone by removing the new file.
    Absent,
    /// A file, kept under this second name: undone by renaming it back.
    Kept(PathBuf),
    /// Something that could not be kept: left new.
    Unkept,
}

impl Drop for StagedFiles {
    fn drop(&mut self) {
        for (tmp, _) in &self.staged {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure staging the second file leaves both targets as they were, and no temporary behind.
    #[test]
    fn staged_files_replace_all_or_none() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
        std::fs::write(&a, "old a").unwrap();
        std::fs::write(&b, "old b").unwrap();
        let mut staged = StagedFiles::default();
        staged.stage(&a, b"new a").unwrap();
        // A target in a folder that is not there: its temporary cannot be made.
        assert!(staged.stage(&dir.path().join("gone/c.bin"), b"c").is_err());
        drop(staged);
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "old a");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "no temporary left: {names:?}");
        let mut staged = StagedFiles::default();
        staged.stage(&a, b"new a").unwrap();
        staged.stage(&b, b"new b").unwrap();
        staged.commit().unwrap();
        assert_eq!((std::fs::read_to_string(&a).unwrap(), std::fs::read_to_string(&b).unwrap()), ("new a".into(), "new b".into()));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "no old file kept after a commit");
    }

    /// A rename that fails part-way through a commit (its target became a directory) puts back the
    /// targets renamed before it: a replaced one holds its old bytes again, a new one is gone, and no
    /// temporary or kept old file is left.
    #[test]
    fn a_commit_that_fails_part_way_puts_back_what_it_renamed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, fresh, b) = (dir.path().join("a.bin"), dir.path().join("fresh.bin"), dir.path().join("b.bin"));
        std::fs::write(&a, "old a").unwrap();
        std::fs::write(&b, "old b").unwrap();
        let mut staged = StagedFiles::default();
        staged.stage(&a, b"new a").unwrap();
        staged.stage(&fresh, b"new").unwrap();
        staged.stage(&b, b"new b").unwrap();
        std::fs::remove_file(&b).unwrap();
        std::fs::create_dir(&b).unwrap();
        std::fs::write(b.join("inside"), "x").unwrap();
        let err = format!("{:#}", staged.commit().unwrap_err());
        assert!(err.contains("b.bin"), "{err}");
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "old a");
        assert!(!fresh.exists(), "the new file is removed");
        let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["a.bin", "b.bin"], "no temporary or old file left");
    }

    /// A target that could not be kept (a link, not a file) is not removed when the commit fails
    /// after it: it is left new, and the error says so.
    #[cfg(unix)]
    #[test]
    fn a_target_that_could_not_be_kept_is_left_new_and_said() {
        let dir = tempfile::tempdir().unwrap();
        let (real, link, b) = (dir.path().join("real"), dir.path().join("a.bin"), dir.path().join("b.bin"));
        std::fs::write(&real, "real").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let mut staged = StagedFiles::default();
        staged.stage(&link, b"new a").unwrap();
        staged.stage(&b, b"new b").unwrap();
        std::fs::create_dir(&b).unwrap();
        std::fs::write(b.join("inside"), "x").unwrap();
        let err = format!("{:#}", staged.commit().unwrap_err());
        assert!(err.contains(&format!("{} could not be put back and hold the new contents", link.display())), "{err}");
        assert_eq!((std::fs::read_to_string(&link).unwrap(), std::fs::read_to_string(&real).unwrap()), ("new a".into(), "real".into()));
    }
}
