//! Helpers the NVMe-tier tests share: the setups every test runs under (each I/O engine, each way a
//! written spare takes its shard's name), an NVMe directory on a temporary one, reading a tensor
//! back, and listing the directory's spare files.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};

use zerostream_offload::{IoConfig, IoEngine, IoEngineKind, NvmeDir, SPARE_PREFIX, Stored};

/// The page of footer after a shard's data.
pub const FOOTER: usize = 4096;

/// One way of writing shards: an I/O engine, and how a written spare becomes the shard — exchanged
/// with it in one call (where the platform can: Linux, macOS), or by the portable sequence the other
/// platforms use (a hard link keeps the old file, then a rename over the shard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    pub engine: IoEngineKind,
    pub exchange: bool,
}

impl std::fmt::Display for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} engine, {}", self.engine, if self.exchange { "atomic exchange" } else { "link then rename" })
    }
}

impl Setup {
    /// The setup as one word, for a child process's environment.
    pub fn to_arg(self) -> String {
        format!("{}-{}", self.engine, if self.exchange { "exchange" } else { "rename" })
    }

    pub fn from_arg(text: &str) -> Setup {
        let (engine, install) = text.split_once('-').unwrap_or_else(|| panic!("setup {text:?}: expected ENGINE-exchange|rename"));
        Setup { engine: engine.parse().unwrap(), exchange: install == "exchange" }
    }
}

const fn setup(engine: IoEngineKind, exchange: bool) -> Setup {
    Setup { engine, exchange }
}

/// Whether `engine` runs on this platform (io_uring is Linux's).
fn here(engine: IoEngineKind) -> bool {
    engine != IoEngineKind::Uring || cfg!(target_os = "linux")
}

/// Every engine this platform has, with every install.
pub fn setups() -> Vec<Setup> {
    [true, false].iter().flat_map(|&exchange| IoEngineKind::ALL.map(|engine| setup(engine, exchange))).filter(|s| here(s.engine)).collect()
}

/// The engines that move batches as one stream (io_uring where it exists, threads), with every install.
pub fn streaming() -> Vec<Setup> {
    setups().into_iter().filter(|s| s.engine != IoEngineKind::Mmap).collect()
}

/// An NVMe directory in `dir` through `engine` (8 KiB blocks, queue depth 4), checksums verified or not.
pub fn nvme_with(dir: &Path, engine: IoEngineKind, verify: bool) -> NvmeDir {
    nvme_in(dir, setup(engine, true), verify)
}

/// An NVMe directory in `dir` written as `setup` says (8 KiB blocks, queue depth 4).
pub fn nvme_in(dir: &Path, setup: Setup, verify: bool) -> NvmeDir {
    let io = IoEngine::new(IoConfig { engine: setup.engine, block_bytes: 8192, queue_depth: 4, ..IoConfig::default() }).unwrap();
    // The engine asked for is the engine that runs: a silent fall-back would test another one.
    assert_eq!(io.config.engine, setup.engine, "{setup}: {:?}", io.notes);
    let mut nv = NvmeDir::new(dir, io, verify, 0).unwrap();
    nv.atomic_exchange = setup.exchange;
    nv
}

/// Reads tensor `t` back (and pages it out again, clean).
pub fn read(t: &mut Stored, nv: &NvmeDir) -> Result<Vec<u8>, String> {
    t.page_in(Some(nv)).map_err(|e| e.to_string())?;
    let bytes = t.data().bytes().to_vec();
    t.page_out(Some(nv), false).unwrap();
    Ok(bytes)
}

/// Writes `bytes` as the whole of tensor `t`.
pub fn write(t: &mut Stored, nv: &NvmeDir, bytes: &[u8]) {
    t.page_in_zeroed(Some(nv));
    t.data_mut().bytes_mut().copy_from_slice(bytes);
    t.page_out(Some(nv), true).unwrap();
}

/// The spare files in `dir`, sorted.
pub fn spares(dir: &Path) -> Vec<PathBuf> {
    let mut spares: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with(SPARE_PREFIX))
        .map(|e| e.path())
        .collect();
    spares.sort();
    spares
}

/// Whether two open files, or a file and a path, are one file (device and inode).
#[cfg(unix)]
pub fn same_inode(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}
