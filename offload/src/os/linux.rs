//! Linux: `O_DIRECT`, `posix_fallocate`, `renameat2(RENAME_EXCHANGE)` and transparent huge pages.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::unix;
pub(super) use super::unix::{file_system_id, free_bytes, is_refused_link, read_at, replace, same_file, write_at};

pub(super) const UNCACHED: &str = "O_DIRECT";

pub(super) fn open(path: &Path, create: bool, no_follow: bool, uncached: bool) -> io::Result<(File, bool)> {
    let flags = unix::no_follow_flag(no_follow);
    if uncached {
        match unix::open_with(path, create, flags | libc::O_DIRECT) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {} // the filesystem refuses O_DIRECT (tmpfs)
            Err(e) => return Err(e),
        }
    }
    Ok((unix::open_with(path, create, flags)?, false))
}

pub(super) fn preallocate(file: &File, size: u64) -> io::Result<()> {
    // SAFETY: a plain system call on a descriptor the caller owns.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) } {
        0 => Ok(()),
        libc::ENOSPC => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        // The filesystem cannot preallocate (or refuses glibc's emulation on an O_DIRECT file): size it.
        _ => file.set_len(size),
    }
}

pub(super) fn exchange(a: &Path, b: &Path) -> io::Result<bool> {
    let (ca, cb) = (unix::c_path(a)?, unix::c_path(b)?);
    // SAFETY: two NUL-terminated paths that outlive the call.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), libc::RENAME_EXCHANGE) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // The filesystem (some network and FUSE ones) or an old kernel cannot exchange.
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => Ok(false),
        _ => Err(e),
    }
}

pub(super) fn advise_huge_pages(ptr: *mut u8, len: usize) {
    // Advice only: refused (no THP support) it changes nothing.
    // SAFETY: the caller's range is one allocation, page-aligned.
    unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
}
