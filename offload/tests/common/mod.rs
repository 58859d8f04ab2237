//! Helpers the NVMe-tier tests share: an NVMe directory on a temporary one, reading a tensor back, and
//! listing the directory's spare files.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};

use zerostream_offload::{IoConfig, IoEngine, IoEngineKind, NvmeDir, SPARE_PREFIX, Stored};

/// The page of footer after a shard's data.
pub const FOOTER: usize = 4096;

/// An NVMe directory in `dir` through `engine` (8 KiB blocks, queue depth 4), checksums verified or not.
pub fn nvme_with(dir: &Path, engine: IoEngineKind, verify: bool) -> NvmeDir {
    let io = IoEngine::new(IoConfig { engine, block_bytes: 8192, queue_depth: 4, ..IoConfig::default() }).unwrap();
    NvmeDir::new(dir, io, verify, 0).unwrap()
}

/// Reads tensor `t` back (and pages it out again, clean).
pub fn read(t: &mut Stored, nv: &NvmeDir) -> Result<Vec<u8>, String> {
    t.page_in(Some(nv)).map_err(|e| e.to_string())?;
    let bytes = t.data().bytes().to_vec();
    t.page_out(Some(nv), false).unwrap();
    Ok(bytes)
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
