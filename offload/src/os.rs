//! The one place where the storage code meets the operating system. Everything else in the crate is
//! platform-neutral and goes through these functions; each platform module (`os/linux.rs`,
//! `os/macos.rs`, `os/windows.rs`, with what Linux and macOS share in `os/unix.rs`) implements all
//! of them, so a platform that lacks one fails to build instead of failing at run time.
//!
//! | concern | Linux | macOS | Windows |
//! |---|---|---|---|
//! | uncached open | `O_DIRECT` | `F_NOCACHE` | `FILE_FLAG_NO_BUFFERING` |
//! | no symlink followed | `O_NOFOLLOW` | `O_NOFOLLOW` | open the link itself, refuse it |
//! | reserve a file's blocks | `posix_fallocate` | `F_PREALLOCATE` | set the end of file |
//! | exchange two names atomically | `renameat2(RENAME_EXCHANGE)` | `renamex_np(RENAME_SWAP)` | none |
//! | replace a name | `rename` | `rename` | `MoveFileEx(REPLACE_EXISTING, WRITE_THROUGH)` |
//! | positioned I/O | `pread`/`pwrite` | `pread`/`pwrite` | `ReadFile`/`WriteFile` at an offset |
//!
//! Where a platform has no atomic exchange (or the filesystem refuses it), [`exchange`] says so and
//! the caller uses its portable sequence instead (`shard_file.rs`: link, then rename over).

use std::fs::File;
use std::io;
use std::path::Path;

#[cfg(unix)]
mod unix;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as platform;

#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
use macos as platform;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as platform;

#[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
compile_error!("zerostream-offload's storage runs on Linux, macOS and Windows: add an os/ module for this platform");

/// How the platform bypasses the page cache, in words for notes ("O_DIRECT").
pub(crate) const UNCACHED: &str = platform::UNCACHED;

/// Opens `path` for reading and writing (creating it if asked and missing). With `no_follow`, a
/// symbolic link at `path` itself is refused ([`is_refused_link`] tells the error apart) rather than
/// followed. With `uncached`, the page cache is bypassed where the filesystem allows it. Returns the
/// file and whether it is uncached.
pub(crate) fn open(path: &Path, create: bool, no_follow: bool, uncached: bool) -> io::Result<(File, bool)> {
    platform::open(path, create, no_follow, uncached)
}

/// Whether `e` is [`open`] refusing a symbolic link (`no_follow`).
pub(crate) fn is_refused_link(e: &io::Error) -> bool {
    platform::is_refused_link(e)
}

/// Reads into `buf` from `offset` without moving a shared file position; returns the bytes read (0 at
/// the end of the file). Several threads may call it on one file at once.
pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    platform::read_at(file, buf, offset)
}

/// Writes `buf` at `offset`, as [`read_at`] reads; returns the bytes written.
pub(crate) fn write_at(file: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
    platform::write_at(file, buf, offset)
}

/// Reserves `size` bytes for `file` and sets its length, so a full disk shows up now (an error of
/// kind `StorageFull`) rather than in the middle of a later write. Where the filesystem cannot
/// reserve blocks, only the length is set.
pub(crate) fn preallocate(file: &File, size: u64) -> io::Result<()> {
    platform::preallocate(file, size)
}

/// Exchanges the names `a` and `b` (both exist) in one atomic step. `Ok(false)` when neither the
/// platform nor the filesystem can (nothing was changed): the caller then uses a portable sequence.
pub(crate) fn exchange(a: &Path, b: &Path) -> io::Result<bool> {
    platform::exchange(a, b)
}

/// Renames the file `from` to `to`, replacing whatever file `to` names, in one atomic step: `to`
/// names the old file or the new one, never nothing.
pub(crate) fn replace(from: &Path, to: &Path) -> io::Result<()> {
    platform::replace(from, to)
}

/// Whether `path` (not followed if it is a link) names the open `file`.
pub(crate) fn same_file(file: &File, path: &Path) -> bool {
    platform::same_file(file, path)
}

/// Bytes free for an unprivileged writer on the filesystem holding the existing directory `dir`.
pub(crate) fn free_bytes(dir: &Path) -> io::Result<u64> {
    platform::free_bytes(dir)
}

/// An identity of the file system holding the existing `dir` (its device number; on Windows, its
/// volume's serial number): two directories with the same one share their free space.
pub(crate) fn file_system_id(dir: &Path) -> io::Result<u64> {
    platform::file_system_id(dir)
}

/// Advises the kernel to back `len` bytes at `ptr` (2 MiB-aligned) with huge pages, where it can;
/// advice only, ignored elsewhere.
pub(crate) fn advise_huge_pages(ptr: *mut u8, len: usize) {
    platform::advise_huge_pages(ptr, len)
}
