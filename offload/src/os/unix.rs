//! What Linux and macOS share: POSIX opens with extra flags, positioned I/O, `rename`, file identity
//! by device and inode, and `statvfs`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` read-write (creating it if asked) with `flags` or-ed into the open's own.
pub(super) fn open_with(path: &Path, create: bool, flags: libc::c_int) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).create(create).custom_flags(flags).open(path)
}

/// `O_NOFOLLOW` when asked: the open then fails with ELOOP on a symbolic link.
pub(super) fn no_follow_flag(no_follow: bool) -> libc::c_int {
    if no_follow { libc::O_NOFOLLOW } else { 0 }
}

pub(super) fn is_refused_link(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

pub(super) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    file.read_at(buf, offset)
}

pub(super) fn write_at(file: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
    file.write_at(buf, offset)
}

/// POSIX `rename` replaces the target atomically.
pub(super) fn replace(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to)
}

pub(super) fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

pub(super) fn file_system_id(dir: &Path) -> io::Result<u64> {
    Ok(std::fs::metadata(dir)?.dev() as u64)
}

pub(super) fn free_bytes(dir: &Path) -> io::Result<u64> {
    let c_path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a statvfs the call fills on success.
    if unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: filled by the successful call above.
    let stat = unsafe { stat.assume_init() };
    // The field types differ between platforms (u32 or u64): widen both.
    #[allow(clippy::unnecessary_cast)]
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// The path as a C string, for the calls std does not wrap.
pub(super) fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{}: a NUL byte in the path", path.display())))
}
