//! The one place this crate meets the operating system: making bytes and names durable, moving
//! names atomically, and opening and reading files the way each platform allows. Everything else in
//! the crate calls these and is platform-neutral.
//!
//! | concern | Linux | macOS | Windows |
//! |---|---|---|---|
//! | file to stable storage | `fsync` | `F_FULLFSYNC` (`fsync` stops at the drive's cache) | `FlushFileBuffers` |
//! | directory to stable storage | `fsync` of the directory | `F_FULLFSYNC` of the directory | none: the move is written through |
//! | exchange two names | `renameat2(RENAME_EXCHANGE)` | `renamex_np(RENAME_SWAP)` | none |
//! | move or replace a name | `rename` | `rename` | `MoveFileEx(WRITE_THROUGH)` |

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Makes `file`'s data and metadata durable: on macOS through the drive's own cache (F_FULLFSYNC),
/// falling back to `fsync` on filesystems that do not take it (network, FAT).
pub(crate) fn sync_file(file: &File) -> io::Result<()> {
    #[cfg(target_os = "macos")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: plain fcntl and fsync calls on a descriptor the caller owns.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_FULLFSYNC) } == 0 || unsafe { libc::fsync(file.as_raw_fd()) } == 0 {
            return Ok(());
        }
        Err(io::Error::last_os_error())
    }
    #[cfg(not(target_os = "macos"))]
    file.sync_all()
}

/// Opens the file at `path` as [`sync_file`] needs it (Windows flushes only through a handle that may
/// write) and makes it durable.
pub(crate) fn sync_path(path: &Path) -> io::Result<()> {
    let file = if cfg!(windows) { OpenOptions::new().write(true).open(path)? } else { File::open(path)? };
    sync_file(&file)
}

/// Makes the names created, removed or renamed in `dir` durable. Windows has no directory handle to
/// flush; there every move goes through `MoveFileEx` with write-through instead ([`rename`]).
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    return sync_file(&File::open(dir)?);
    #[cfg(windows)]
    {
        let _ = dir;
        Ok(())
    }
}

/// Exchanges the existing names `a` and `b` (files or directories) in one atomic step. `Ok(false)`
/// where neither the platform nor the filesystem can (nothing was changed): the caller then takes
/// its portable sequence.
pub(crate) fn exchange(a: &Path, b: &Path) -> io::Result<bool> {
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    {
        let c = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{}: a NUL byte in the path", p.display())))
        };
        let (ca, cb) = (c(a)?, c(b)?);
        // SAFETY: two NUL-terminated paths that outlive the call.
        #[cfg(target_os = "linux")]
        let rc = unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), libc::RENAME_EXCHANGE) };
        // SAFETY: as above.
        #[cfg(target_os = "macos")]
        let rc = unsafe { libc::renamex_np(ca.as_ptr(), cb.as_ptr(), libc::RENAME_SWAP) };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        // The filesystem (network, FUSE, FAT, HFS+) or an old kernel cannot exchange.
        match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP) => Ok(false),
            _ => Err(e),
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let _ = (a, b);
        Ok(false)
    }
}

/// Renames the file `from` onto `to`, replacing the file there if any, in one atomic step.
pub(crate) fn replace_file(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(windows)]
    return windows::move_file(from, to, true);
    #[cfg(not(windows))]
    std::fs::rename(from, to)
}

/// Renames `from` (a file or a directory) to the free name `to`.
pub(crate) fn rename(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(windows)]
    return windows::move_file(from, to, false);
    #[cfg(not(windows))]
    std::fs::rename(from, to)
}

/// Read-only options that open a FIFO or device without blocking (it is refused once open); where
/// opening never blocks on them, plain read-only options.
pub(crate) fn read_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK only changes how pipes and devices open and read; regular files ignore it.
        options.custom_flags(libc::O_NONBLOCK);
    }
    options
}

/// Fills `buf` from `offset` without moving a shared file position. A file shorter than
/// `offset + buf.len()` gives `UnexpectedEof`; a memory map of the same file would have raised
/// SIGBUS instead.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    return std::os::unix::fs::FileExt::read_exact_at(file, buf, offset);
    #[cfg(windows)]
    return windows::read_exact_at(file, buf, offset);
}

#[cfg(windows)]
mod windows {
    use std::fs::File;
    use std::io;
    use std::os::windows::ffi::OsStrExt;
    use std::path::Path;

    use windows_sys::Win32::Foundation::{ERROR_ACCESS_DENIED, ERROR_SHARING_VIOLATION};
    use windows_sys::Win32::Storage::FileSystem::{MOVEFILE_REPLACE_EXISTING, MOVEFILE_WRITE_THROUGH, MoveFileExW};

    /// `MoveFileEx` with write-through (it returns once the move is on the disk), replacing a file at
    /// `to` if asked. Where it is refused, tried again a few times when another process holds a file
    /// a moment (a virus scanner reading the fresh temporary, a reader of `latest`), then, for a
    /// replacement, std's rename: POSIX semantics where the system has them (a file open with
    /// FILE_SHARE_DELETE is replaced), and paths past MAX_PATH, which this raw call does not prefix.
    pub(super) fn move_file(from: &Path, to: &Path, replace: bool) -> io::Result<()> {
        let wide = |p: &Path| p.as_os_str().encode_wide().chain(std::iter::once(0)).collect::<Vec<u16>>();
        let flags = MOVEFILE_WRITE_THROUGH | if replace { MOVEFILE_REPLACE_EXISTING } else { 0 };
        let (w_from, w_to) = (wide(from), wide(to));
        let mut attempt = 0;
        let refused = loop {
            // SAFETY: two NUL-terminated wide strings that outlive the call.
            if unsafe { MoveFileExW(w_from.as_ptr(), w_to.as_ptr(), flags) } != 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            let held = e.raw_os_error().is_some_and(|c| c == ERROR_ACCESS_DENIED as i32 || c == ERROR_SHARING_VIOLATION as i32);
            attempt += 1;
            if !held || attempt == 5 {
                break e;
            }
            std::thread::sleep(std::time::Duration::from_millis(50 * attempt));
        };
        // std's rename replaces what is at `to`: only where replacing was asked for.
        if replace { std::fs::rename(from, to) } else { Err(refused) }
    }

    pub(super) fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        use std::os::windows::fs::FileExt;
        while !buf.is_empty() {
            match file.seek_read(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
