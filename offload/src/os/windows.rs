//! Windows: unbuffered opens (`FILE_FLAG_NO_BUFFERING`), links refused by opening the link itself,
//! `MoveFileEx` for replacing names, and file identity by volume and file index. There is no atomic
//! exchange of two names: [`exchange`] says so and the caller takes its portable sequence.
//!
//! A handle opened for synchronous I/O serialises the requests made through it, so the threads
//! engine's requests on one file queue one behind another here (requests on different files still
//! overlap); overlapped handles would lift that, and are not used yet.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::fs::{FileExt, OpenOptionsExt};
use std::os::windows::io::AsRawHandle;
use std::path::Path;

use windows_sys::Win32::Foundation::{ERROR_ACCESS_DENIED, ERROR_INVALID_PARAMETER, HANDLE};
use windows_sys::Win32::Storage::FileSystem::{
    BY_HANDLE_FILE_INFORMATION, FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_NO_BUFFERING, FILE_FLAG_OPEN_REPARSE_POINT, GetDiskFreeSpaceExW,
    GetFileInformationByHandle, MOVEFILE_REPLACE_EXISTING, MOVEFILE_WRITE_THROUGH, MoveFileExW,
};

pub(super) const UNCACHED: &str = "FILE_FLAG_NO_BUFFERING";

/// The error [`open`] returns for a symbolic link it was asked not to follow.
#[derive(Debug)]
struct RefusedLink;

impl std::fmt::Display for RefusedLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a symbolic link (not followed)")
    }
}
impl std::error::Error for RefusedLink {}

fn open_with(path: &Path, create: bool, flags: u32) -> io::Result<File> {
    // std opens with FILE_SHARE_DELETE, so the name of a file we hold open can still be replaced.
    OpenOptions::new().read(true).write(true).create(create).custom_flags(flags).open(path)
}

pub(super) fn open(path: &Path, create: bool, no_follow: bool, uncached: bool) -> io::Result<(File, bool)> {
    // FILE_FLAG_OPEN_REPARSE_POINT opens a link itself instead of its target; it is refused below.
    let flags = if no_follow { FILE_FLAG_OPEN_REPARSE_POINT } else { 0 };
    let mut opened = None;
    if uncached {
        match open_with(path, create, flags | FILE_FLAG_NO_BUFFERING) {
            Ok(f) => opened = Some((f, true)),
            Err(e) if e.raw_os_error() == Some(ERROR_INVALID_PARAMETER as i32) => {} // the filesystem refuses it
            Err(e) => return Err(e),
        }
    }
    let (file, uncached) = match opened {
        Some(opened) => opened,
        None => (open_with(path, create, flags)?, false),
    };
    if no_follow && file.metadata()?.file_type().is_symlink() {
        return Err(io::Error::other(RefusedLink));
    }
    Ok((file, uncached))
}

pub(super) fn is_refused_link(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<RefusedLink>())
}

pub(super) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    file.seek_read(buf, offset)
}

pub(super) fn write_at(file: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
    file.seek_write(buf, offset)
}

/// NTFS allocates the clusters up to a new end of file (it is not sparse), so a full disk is
/// reported here.
pub(super) fn preallocate(file: &File, size: u64) -> io::Result<()> {
    file.set_len(size)
}

/// Windows has no call that exchanges two names.
pub(super) fn exchange(_a: &Path, _b: &Path) -> io::Result<bool> {
    Ok(false)
}

fn wide(path: &Path) -> Vec<u16> {
    OsStr::new(path).encode_wide().chain(std::iter::once(0)).collect()
}

pub(super) fn replace(from: &Path, to: &Path) -> io::Result<()> {
    let (w_from, w_to) = (wide(from), wide(to));
    // Write-through: the call returns once the move is on the disk.
    // SAFETY: two NUL-terminated wide strings that outlive the call.
    if unsafe { MoveFileExW(w_from.as_ptr(), w_to.as_ptr(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH) } != 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(ERROR_ACCESS_DENIED as i32) {
        return Err(e);
    }
    // MoveFileEx's classic semantics refuse to replace a file that is open, as a shard's current file
    // is (the store holds it). std's rename asks for POSIX semantics (Windows 10 1607 and later),
    // which replace a file opened with FILE_SHARE_DELETE, as every file here is.
    std::fs::rename(from, to)
}

/// (volume serial number, file index): what tells two files apart on Windows.
fn identity(file: &File) -> Option<(u32, u32, u32)> {
    // SAFETY: plain data, filled by the call.
    let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: a handle we own and a struct that outlives the call.
    let ok = unsafe { GetFileInformationByHandle(file.as_raw_handle() as HANDLE, &mut info) } != 0;
    ok.then_some((info.dwVolumeSerialNumber, info.nFileIndexHigh, info.nFileIndexLow))
}

pub(super) fn same_file(file: &File, path: &Path) -> bool {
    // No access rights (metadata only), the link itself if it is one, directories allowed.
    let at_path = OpenOptions::new().access_mode(0).custom_flags(FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS).open(path);
    match (identity(file), at_path.ok().as_ref().and_then(identity)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

pub(super) fn file_system_id(dir: &Path) -> io::Result<u64> {
    // Metadata only; a directory needs backup semantics to be opened at all.
    let opened = OpenOptions::new().access_mode(0).custom_flags(FILE_FLAG_BACKUP_SEMANTICS).open(dir)?;
    identity(&opened).map(|(volume, _, _)| volume as u64).ok_or_else(io::Error::last_os_error)
}

pub(super) fn free_bytes(dir: &Path) -> io::Result<u64> {
    let mut free_to_caller = 0u64;
    // SAFETY: a NUL-terminated wide path and an output that outlives the call; the totals are not asked for.
    let ok = unsafe { GetDiskFreeSpaceExW(wide(dir).as_ptr(), &mut free_to_caller, std::ptr::null_mut(), std::ptr::null_mut()) };
    if ok == 0 { Err(io::Error::last_os_error()) } else { Ok(free_to_caller) }
}

/// Large pages on Windows need a privilege a training run does not have: no advice to give.
pub(super) fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}
