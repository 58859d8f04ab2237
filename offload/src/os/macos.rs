//! macOS: `F_NOCACHE` (no `O_DIRECT` there), `F_PREALLOCATE` (no `posix_fallocate`) and
//! `renamex_np(RENAME_SWAP)` (no `renameat2`).

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::unix;
pub(super) use super::unix::{file_system_id, free_bytes, is_refused_link, read_at, replace, same_file, write_at};

pub(super) const UNCACHED: &str = "F_NOCACHE";

pub(super) fn open(path: &Path, create: bool, no_follow: bool, uncached: bool) -> io::Result<(File, bool)> {
    let file = unix::open_with(path, create, unix::no_follow_flag(no_follow))?;
    // F_NOCACHE is a property of the open file, set after the open: its data then bypasses the unified
    // buffer cache (our buffers and offsets are page-aligned, as uncached transfers want them).
    // SAFETY: a plain fcntl on a descriptor we own.
    let uncached = uncached && unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) } == 0;
    Ok((file, uncached))
}

pub(super) fn preallocate(file: &File, size: u64) -> io::Result<()> {
    let have = file.metadata()?.len();
    if size > have {
        // Blocks beyond the physical end of the file: contiguous if the filesystem can, else anywhere.
        let mut store = libc::fstore_t {
            fst_flags: libc::F_ALLOCATECONTIG | libc::F_ALLOCATEALL,
            fst_posmode: libc::F_PEOFPOSMODE,
            fst_offset: 0,
            fst_length: (size - have) as libc::off_t,
            fst_bytesalloc: 0,
        };
        // SAFETY: fcntl reads and fills the fstore_t, which outlives the calls.
        let mut rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_PREALLOCATE, &mut store) };
        if rc == -1 {
            store.fst_flags = libc::F_ALLOCATEALL;
            // SAFETY: as above.
            rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_PREALLOCATE, &mut store) };
        }
        if rc == -1 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOSPC) {
                return Err(e);
            }
            // The filesystem cannot preallocate: the length alone is set below.
        }
    }
    file.set_len(size)
}

pub(super) fn exchange(a: &Path, b: &Path) -> io::Result<bool> {
    let (ca, cb) = (unix::c_path(a)?, unix::c_path(b)?);
    // SAFETY: two NUL-terminated paths that outlive the call.
    if unsafe { libc::renamex_np(ca.as_ptr(), cb.as_ptr(), libc::RENAME_SWAP) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // APFS swaps; HFS+, network and FAT filesystems may not.
        Some(libc::ENOTSUP) | Some(libc::EINVAL) | Some(libc::ENOSYS) => Ok(false),
        _ => Err(e),
    }
}

/// macOS has no transparent huge pages to ask for.
pub(super) fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}
