//! Files inside the NVMe directory, at the bottom of the store's layers: opening one without following
//! a symbolic link at its path, removing one, and [`StoreError`], which names the file and what went
//! wrong (a full disk and a read-only one in words).

use std::fs::File;
use std::io;
use std::path::Path;

use crate::io::IoEngine;
use crate::os;

/// An error of the store, naming the file and what went wrong.
#[derive(Debug)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for StoreError {}

pub type Result<T> = std::result::Result<T, StoreError>;

pub(crate) fn io_error(what: &str, path: &Path, e: io::Error) -> StoreError {
    let why = match e.kind() {
        io::ErrorKind::StorageFull => format!("the disk is full ({e})"),
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => format!("not writable ({e})"),
        _ => e.to_string(),
    };
    StoreError(format!("{what} {}: {why}", path.display()))
}

/// An error opening a file inside the NVMe directory, where a symbolic link is refused.
pub(crate) fn open_error(what: &str, path: &Path, e: io::Error) -> StoreError {
    if os::is_refused_link(&e) {
        return StoreError(format!(
            "{what} {}: it is a symbolic link, and symlinks inside the NVMe directory are not followed; replace it with a regular file or remove it",
            path.display()
        ));
    }
    io_error(what, path, e)
}

/// Opens (creating if asked) a file inside the NVMe directory without following a symlink at its path.
pub(crate) fn open_in_dir(io: &IoEngine, what: &str, path: &Path, create: bool) -> Result<(File, bool)> {
    io.open_nofollow(path, create).map_err(|e| open_error(what, path, e))
}

/// Removes `path` if it is there (a symlink is removed itself, never its target).
pub(crate) fn remove_if_present(what: &str, path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(what, path, e)),
    }
}
