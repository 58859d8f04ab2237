//! Host-side training state: the CPU AdamW (and LAMB and LARS), the store of training tensors on their RAM or NVMe tier,
//! the I/O engine that moves NVMe shards, and the pipelined sweep that overlaps the two. This crate
//! knows nothing of GPUs: the engine hands it slices of host memory.

pub mod adam;
pub mod aligned;
mod dir_files;
pub mod io;
pub mod layerwise;
pub mod membw;
mod nvme_dir;
mod os;
mod shard_file;
mod spare_pool;
pub mod square_sums;
pub mod store;
pub mod sweep;

pub use adam::{AdamConfig, AdamW, Grads, Isa, MAX_THREADS, MomentNoise, Moments, ParamCopy};
pub use aligned::{ALIGN_BYTES, AlignedBuf, BufferPool, HostMemory};
pub use io::{Direction, IoConfig, IoEngine, IoEngineKind};
pub use layerwise::{Layerwise, LayerwiseConfig, Rule};
pub use spare_pool::{SPARE_PREFIX, SPARES_PER_SIZE};
pub use store::{NvmeDir, StoreError, Stored, Tier, by_file_system, free_bytes, shard_bytes_in};
pub use sweep::pipelined_sweep;
