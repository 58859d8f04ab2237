//! The store of training tensors: fixed-size, page-aligned flat buffers, each with a home tier.
//!
//! A [`Stored`] tensor lives either in RAM (always resident) or in a file on NVMe (resident only
//! between [`Stored::page_in`] and [`Stored::page_out`]). Files are named `{name}.rank{r}.bin` and
//! reused by later runs. Each holds the data padded to whole pages, then a one-page footer (magic,
//! format version, length and, with verification on, the data's CRC32), checked on every read.
//!
//! The NVMe tier never overwrites the only copy of a tensor: a write goes to a spare file of the
//! same size (`.zerostream-spare-{n}`, from the directory's pool) which then takes the shard's name
//! atomically, so a process killed mid-write leaves either the old state or the new one
//! (leftover spares are removed when the directory is next opened). The previous version goes back
//! to the pool under the spare's name, a later write's target, overwritten in place. The pool keeps at
//! most [`crate::SPARES_PER_SIZE`] spares of each size, so a run needs disk room for its state plus a
//! few tensors of each size; at rest (the directory dropped), the state alone.
//! Symbolic links inside the directory are never followed (every open there refuses one: O_NOFOLLOW or
//! its platform's kin), so a link planted where a shard or the lock should be cannot redirect writes
//! elsewhere.
//! With several directories (`NvmeDir::striped`), each NVMe tensor is cut into one stripe per
//! directory, page-aligned and as equal as pages allow ([`stripe_ranges`]), each stripe a shard file
//! of its own (same name, its own footer and checksum) moved in the same batch as the others, so every
//! drive carries an equal share of every page-in and page-out. A write installs its stripes one after
//! another once all of them are written: a process killed between two installs leaves a tensor
//! whose stripes are of two versions, each whole and checked; no run reads NVMe state an earlier
//! process left (a start writes the initial state, a resume reads its checkpoint).
//! See [`ShardFile`] for the file itself.

use std::path::Path;

use crate::aligned::AlignedBuf;
pub use crate::dir_files::{Result, StoreError};
pub use crate::nvme_dir::NvmeDir;
use crate::os;
pub use crate::shard_file::ShardFile;

/// Where a tensor lives between uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    Ram,
    Nvme,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Ram => "cpu",
            Tier::Nvme => "nvme",
        }
    }
}

enum Home {
    Ram,
    /// One shard file per stripe, in directory order, covering [`stripe_ranges`] of the data.
    Nvme(Vec<ShardFile>),
}

/// The byte ranges of `len_bytes` that the stripes over `stripes` directories hold: whole pages each
/// (but the last one's end), in order, as equal as pages allow, and none empty (a tensor smaller than
/// `stripes` pages has fewer stripes; an empty one, one empty stripe).
pub fn stripe_ranges(len_bytes: usize, stripes: usize) -> Vec<std::ops::Range<usize>> {
    let per = crate::aligned::align_up(len_bytes.div_ceil(stripes.max(1)));
    if per == 0 {
        return std::iter::once(0..0).collect();
    }
    (0..len_bytes).step_by(per).map(|start| start..(start + per).min(len_bytes)).collect()
}

/// `buf`'s padded pages cut into one slice per stripe (each the stripe's data padded to whole pages).
fn stripe_slices<'a>(buf: &'a mut AlignedBuf, files: &'a [ShardFile]) -> Vec<(&'a ShardFile, &'a mut [u8])> {
    let mut rest = buf.padded_mut();
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        let take = crate::aligned::align_up(file.len_bytes()).min(rest.len());
        let (mine, after) = std::mem::take(&mut rest).split_at_mut(take);
        out.push((file, mine));
        rest = after;
    }
    out
}

/// A flat tensor of `len_bytes` with a home tier. RAM tensors are always resident; NVMe ones hold a
/// buffer only while paged in.
pub struct Stored {
    pub name: String,
    len_bytes: usize,
    home: Home,
    resident: Option<AlignedBuf>,
}

impl Stored {
    /// A zero-filled tensor on `tier` (`nvme` must be given for [`Tier::Nvme`]). On NVMe the file is
    /// created (or reused if it has the right size) and left paged out.
    pub fn new(name: &str, len_bytes: usize, tier: Tier, nvme: Option<&NvmeDir>) -> Result<Self> {
        let (home, resident) = match tier {
            Tier::Ram => (Home::Ram, Some(AlignedBuf::zeroed(len_bytes))),
            Tier::Nvme => {
                let nvme = nvme.ok_or_else(|| StoreError(format!("{name}: the NVMe tier needs a directory (--nvme-dir)")))?;
                let files = stripe_ranges(len_bytes, nvme.stripe_count())
                    .into_iter()
                    .enumerate()
                    .map(|(stripe, range)| ShardFile::open_stripe(nvme, stripe, name, range.len()))
                    .collect::<Result<Vec<_>>>()?;
                (Home::Nvme(files), None)
            }
        };
        Ok(Stored { name: name.to_string(), len_bytes, home, resident })
    }

    /// A RAM tensor in a buffer the caller made (its bytes as they are: [`AlignedBuf`]s start zeroed),
    /// e.g. in host memory a device copies from directly ([`crate::aligned::HostMemory`]).
    pub fn in_ram(name: &str, buf: AlignedBuf) -> Self {
        Stored { name: name.to_string(), len_bytes: buf.len_bytes(), home: Home::Ram, resident: Some(buf) }
    }

    pub fn tier(&self) -> Tier {
        match self.home {
            Home::Ram => Tier::Ram,
            Home::Nvme(_) => Tier::Nvme,
        }
    }
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }
    pub fn is_resident(&self) -> bool {
        self.resident.is_some()
    }

    /// Makes the data resident: reads it from its file (RAM tensors already are).
    pub fn page_in(&mut self, nvme: Option<&NvmeDir>) -> Result<()> {
        Stored::page_in_all(&mut [self], nvme)
    }

    /// Pages in every tensor given, the NVMe ones in one batched read (one stream of requests, so the
    /// disk's queue stays full across them; checksums taken as the data arrives). On an error none of
    /// them is made resident by this call.
    pub fn page_in_all(tensors: &mut [&mut Stored], nvme: Option<&NvmeDir>) -> Result<()> {
        let wanted: Vec<usize> =
            (0..tensors.len()).filter(|&k| tensors[k].resident.is_none() && matches!(tensors[k].home, Home::Nvme(_))).collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let nvme = nvme.expect("an NVMe tensor pages in through its directory");
        let mut bufs: Vec<AlignedBuf> = wanted.iter().map(|&k| nvme.pool.take(tensors[k].len_bytes)).collect();
        let mut batch: Vec<(&ShardFile, &mut [u8])> = Vec::new();
        for (&k, buf) in wanted.iter().zip(bufs.iter_mut()) {
            match &tensors[k].home {
                Home::Nvme(files) => batch.extend(stripe_slices(buf, files)),
                Home::Ram => unreachable!("only NVMe tensors are wanted"),
            }
        }
        let read = crate::shard_file::read_all(nvme, &mut batch);
        drop(batch);
        if let Err(e) = read {
            bufs.into_iter().for_each(|buf| nvme.pool.give(buf));
            return Err(e);
        }
        for (&k, buf) in wanted.iter().zip(bufs) {
            nvme.count_read(buf.len_bytes() as u64);
            tensors[k].resident = Some(buf);
        }
        Ok(())
    }

    /// Makes the data resident without reading it: zero-filled (an NVMe tensor; its contents are about to
    /// be overwritten), or as it is (a RAM tensor).
    pub fn page_in_zeroed(&mut self, nvme: Option<&NvmeDir>) {
        if self.resident.is_none() {
            self.resident = Some(match nvme {
                Some(nvme) => nvme.pool.take_zeroed(self.len_bytes),
                None => AlignedBuf::zeroed(self.len_bytes),
            });
        }
    }

    /// Writes a resident NVMe tensor to its file and keeps it resident, clean (a later page-out need not
    /// write it again); a RAM tensor, or one paged out, is left as it is.
    pub fn write_back(&mut self, nvme: Option<&NvmeDir>) -> Result<()> {
        let (Home::Nvme(files), Some(buf)) = (&self.home, self.resident.as_mut()) else { return Ok(()) };
        let nvme = nvme.expect("an NVMe tensor writes through its directory");
        let bytes = buf.len_bytes() as u64;
        crate::shard_file::write_all(nvme, &mut stripe_slices(buf, files))?;
        nvme.count_written(bytes);
        Ok(())
    }

    /// Writes an NVMe tensor back (if `dirty`) and drops its buffer; RAM tensors stay as they are.
    pub fn page_out(&mut self, nvme: Option<&NvmeDir>, dirty: bool) -> Result<()> {
        Stored::page_out_all(&mut [self], nvme, dirty)
    }

    /// Pages out every tensor given, the NVMe ones written (if `dirty`) in one batched write. Their
    /// buffers go back to the pool whatever happens; on an error a tensor's file holds its old state
    /// or, for those before the failed one, its new state.
    pub fn page_out_all(tensors: &mut [&mut Stored], nvme: Option<&NvmeDir>, dirty: bool) -> Result<()> {
        let mut leaving: Vec<(&[ShardFile], AlignedBuf)> = Vec::new();
        for t in tensors.iter_mut() {
            if let Home::Nvme(files) = &t.home
                && let Some(buf) = t.resident.take()
            {
                leaving.push((files, buf));
            }
        }
        if leaving.is_empty() {
            return Ok(());
        }
        let Some(nvme) = nvme else {
            assert!(!dirty, "an NVMe tensor pages out through its directory");
            return Ok(());
        };
        let written = if dirty {
            let mut batch: Vec<(&ShardFile, &mut [u8])> = leaving.iter_mut().flat_map(|(files, buf)| stripe_slices(buf, files)).collect();
            crate::shard_file::write_all(nvme, &mut batch)
        } else {
            Ok(())
        };
        let bytes: u64 = leaving.iter().map(|(_, buf)| buf.len_bytes() as u64).sum();
        leaving.into_iter().for_each(|(_, buf)| nvme.pool.give(buf));
        written?;
        if dirty {
            nvme.count_written(bytes);
        }
        Ok(())
    }

    /// The resident data. Panics if an NVMe tensor is not paged in (a bug in the caller's sequencing).
    pub fn data(&self) -> &AlignedBuf {
        self.resident.as_ref().unwrap_or_else(|| panic!("{} used while paged out", self.name))
    }
    pub fn data_mut(&mut self) -> &mut AlignedBuf {
        let name = &self.name;
        self.resident.as_mut().unwrap_or_else(|| panic!("{name} used while paged out"))
    }
}

/// Bytes free for an unprivileged writer on the file system that holds `path` (or its nearest existing
/// ancestor, for a directory still to be made).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    os::free_bytes(nearest_existing(path))
}

/// Groups `paths` (existing or not: each stands for its nearest existing ancestor) by the file system
/// holding them, in the order each group's first path comes; a path whose file system cannot be told
/// is a group of its own. The groups share free space within, not between.
pub fn by_file_system<P: AsRef<Path>>(paths: &[P]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Option<u64>, Vec<usize>)> = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let id = os::file_system_id(nearest_existing(path.as_ref())).ok();
        match groups.iter_mut().find(|(other, _)| id.is_some() && *other == id) {
            Some((_, members)) => members.push(i),
            None => groups.push((id, vec![i])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

/// `path`, or its nearest ancestor that exists (`.` for a relative path none of whose parents do).
fn nearest_existing(path: &Path) -> &Path {
    let mut at = path;
    while !at.exists() {
        at = at.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    }
    at
}

/// Bytes of the shard files (`*.bin`) in `dir`'s `rank{r}/` subdirectories for the `world`'s ranks:
/// what a new run in `dir` overwrites or removes (`NvmeDir::remove_unopened`) rather than adds. Those
/// of ranks past the world's are another run's, left as they are, and not counted.
pub fn shard_bytes_in(dir: &Path, world: usize) -> u64 {
    let files_in = |d: &Path| -> u64 {
        std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".bin"))
            .filter_map(|e| e.metadata().ok().filter(|m| m.is_file()).map(|m| m.len()))
            .sum()
    };
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("rank").and_then(|r| r.parse::<usize>().ok()).is_some_and(|r| r < world) && e.path().is_dir()
        })
        .map(|e| files_in(&e.path()))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use crate::io::{IoConfig, IoEngine};

    fn nvme(dir: &Path, verify: bool) -> NvmeDir {
        NvmeDir::new(dir, IoEngine::new(IoConfig { block_bytes: 8192, queue_depth: 4, ..IoConfig::default() }).unwrap(), verify, 0).unwrap()
    }

    /// Paths in one file system (made or still to be made) fall in one group; another file system's
    /// path in its own, in the order first seen.
    #[test]
    fn paths_are_grouped_by_the_file_system_that_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b/not/made"));
        std::fs::create_dir(&a).unwrap();
        assert_eq!(by_file_system(&[&a, &b]), [vec![0, 1]]);
        #[cfg(target_os = "linux")]
        assert_eq!(by_file_system(&[a.as_path(), Path::new("/proc"), &b]), [vec![0, 2], vec![1]]);
    }

    #[test]
    fn a_directory_in_use_by_another_run_is_refused_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let first = nvme(dir.path(), true);
        let io = IoEngine::new(IoConfig::default()).unwrap();
        let err = NvmeDir::new(dir.path(), io, true, 0).unwrap_err();
        assert!(err.0.contains("in use by another zerostream run"), "{}", err.0);
        drop(first);
        nvme(dir.path(), true); // the lock goes with the run
    }

    #[test]
    fn a_write_back_keeps_the_data_resident_and_counts_its_bytes_once() {
        let dir = tempfile::tempdir().unwrap();
        let nv = nvme(dir.path(), true);
        let mut t = Stored::new("h.1.working", 5_000, Tier::Nvme, Some(&nv)).unwrap();
        t.write_back(Some(&nv)).unwrap(); // paged out: nothing to write
        assert_eq!(nv.traffic(), (0, 0));
        t.page_in_zeroed(Some(&nv));
        t.data_mut().as_mut_slice::<u16>().iter_mut().enumerate().for_each(|(i, x)| *x = i as u16);
        t.write_back(Some(&nv)).unwrap();
        assert!(t.is_resident(), "kept for its next reader");
        t.page_out(Some(&nv), false).unwrap();
        let (read, written) = nv.traffic();
        assert_eq!((read, written), (0, 5_000), "written once, read never");
        let mut again = Stored::new("h.1.working", 5_000, Tier::Nvme, Some(&nv)).unwrap();
        again.page_in(Some(&nv)).unwrap();
        assert!(again.data().as_slice::<u16>().iter().enumerate().all(|(i, &x)| x == i as u16));
    }

    #[test]
    fn nvme_tensors_round_trip_and_files_are_reused() {
        let dir = tempfile::tempdir().unwrap();
        let nv = nvme(dir.path(), true);
        let mut t = Stored::new("h.0.master", 10_000, Tier::Nvme, Some(&nv)).unwrap();
        assert!(!t.is_resident());
        // 10,000 bytes padded to three pages, and the footer's page.
        assert_eq!(std::fs::metadata(nv.shard_path("h.0.master")).unwrap().len(), 12288 + 4096);
        t.page_in_zeroed(Some(&nv));
        t.data_mut().as_mut_slice::<f32>().iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        t.page_out(Some(&nv), true).unwrap();
        assert!(!t.is_resident());
        // A new run reuses the file and reads back what was written.
        let mut again = Stored::new("h.0.master", 10_000, Tier::Nvme, Some(&nv)).unwrap();
        again.page_in(Some(&nv)).unwrap();
        assert!(again.data().as_slice::<f32>().iter().enumerate().all(|(i, &x)| x == i as f32));
    }

    #[test]
    fn corruption_and_missing_checksums_are_named_errors_and_another_size_is_sized_anew() {
        let dir = tempfile::tempdir().unwrap();
        let nv = nvme(dir.path(), true);
        let mut t = Stored::new("m", 4096, Tier::Nvme, Some(&nv)).unwrap();
        // Never written: no footer, so it cannot read back as valid.
        let err = t.page_in(Some(&nv)).unwrap_err().to_string();
        assert!(err.contains("never completely written") && err.contains("m.rank0.bin"), "{err}");
        t.page_in_zeroed(Some(&nv));
        t.data_mut().bytes_mut().fill(7);
        t.page_out(Some(&nv), true).unwrap();
        // Flip one byte behind the store's back.
        let path = nv.shard_path("m");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[100] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = t.page_in(Some(&nv)).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch") && err.contains("m.rank0.bin"), "{err}");
        // Another size (a run of another shape): the scratch file is sized anew, and holds what is written.
        drop(t);
        let mut other = Stored::new("m", 3 * 4096, Tier::Nvme, Some(&nv)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * 4096 + 4096, "the data's pages and the footer's");
        other.page_in_zeroed(Some(&nv));
        other.data_mut().bytes_mut().fill(9);
        other.page_out(Some(&nv), true).unwrap();
        other.page_in(Some(&nv)).unwrap();
        assert!(other.data().bytes().iter().all(|&b| b == 9));
    }

    #[test]
    #[cfg(target_os = "linux")] // /dev/full is Linux's
    fn a_full_disk_is_named_as_such() {
        use crate::dir_files::io_error;
        use crate::io::Direction;
        // /dev/full fails every write with ENOSPC.
        for engine in [crate::io::IoEngineKind::Uring, crate::io::IoEngineKind::Threads] {
            let io = IoEngine::new(IoConfig { engine, direct: false, ..IoConfig::default() }).unwrap();
            let path = Path::new("/dev/full");
            let (file, _) = io.open(path, false).unwrap();
            let mut buf = AlignedBuf::zeroed(4096);
            let e = io.transfer(Direction::Write, &file, 0, buf.padded_mut()).unwrap_err();
            let err = io_error("writing shard", path, e).to_string();
            assert!(err.contains("disk is full") && err.contains("/dev/full"), "{engine}: {err}");
        }
    }

    #[test]
    fn missing_directories_are_created_and_uncreatable_ones_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/rank0");
        nvme(&deep, true);
        assert!(deep.is_dir());
        // A regular file cannot have children, and (on Linux) procfs refuses new directories.
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        let mut refused = vec![file.join("child"), file.clone()];
        if cfg!(target_os = "linux") {
            refused.push(PathBuf::from("/proc/zerostream-nvme"));
        }
        for path in &refused {
            let io = IoEngine::new(IoConfig::default()).unwrap();
            let err = NvmeDir::new(path, io, false, 0).unwrap_err().to_string();
            assert!(err.contains(&*path.to_string_lossy()), "{err}");
        }
        let err = Stored::new("x", 16, Tier::Nvme, None).err().unwrap().to_string();
        assert!(err.contains("--nvme-dir"), "{err}");
    }
}
