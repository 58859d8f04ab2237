//! The one place device bytes are counted: every tensor allocation charges a [`ByteBudget`], and the
//! charge is returned when the tensor is dropped. The peak is what `--gpu-mem-budget` is checked against.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};

/// The gpu device's scratch for the column sums' partials (`gpu/columns.rs`): 1 MiB holds 63 blocks
/// (4032 rows) of sums of a 4096-wide output, less the alignment slack.
pub const GPU_COLUMN_PARTIALS_BYTES: u64 = 1 << 20;

/// The gpu device's scratch for a product's operands rounded to f16 (`--matmul-inputs f16` with a precast
/// or packing cooperative-matrix variant, `gpu/matmul.rs`): 32 Mi halves, A and B of GPT-2 XL's or
/// Llama-3.2-1B's largest products at 1024 tokens and 4 sequences, padded to whole tiles (a piece that
/// needs more runs staged from A and B as they are: the same bits).
pub const GPU_COOP_SCRATCH_BYTES: u64 = 64 << 20;

/// Bytes of each buffer of the gpu device's upload ring (`gpu/staging.rs`): a chunk of a write.
pub const GPU_UPLOAD_CHUNK_BYTES: u64 = 8 << 20;
/// Buffers the upload ring may grow to (512 MiB) while writes outrun the device's copies.
pub const GPU_UPLOAD_RING_MAX_LEN: usize = 64;
/// The most bytes of finished reads' staging buffers the gpu device keeps for reuse (`gpu/memory.rs`), or
/// two buffers of the largest read's size where that is more ([`AllocCosts::spare_readback_bytes`]): room
/// for a block's buffer beside the other sizes' (vocabulary chunks, the head), since a buffer made afresh for
/// each read costs more than the copy itself (Llama-3.2-1B's 232 MiB blocks spent 1.4 s a step waiting
/// on new read-back buffers on an H200, benches/results/2026-11-27-h200-gpu.md). The planner counts these
/// beside the reads in flight, an upper bound: a read takes its buffer from the spares.
pub const GPU_SPARE_READBACK_BYTES: u64 = 256 << 20;

/// What a device charges its budget for each kind of allocation. The devices charge with these and the
/// planner (`train::plan`) counts with them, so the bytes planned are the bytes allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocCosts {
    /// 16-bit tensors are stored two values per 32-bit word (the gpu device), not widened to f32.
    pub packs_16bit: bool,
    /// Token ids and 16-bit values on their way to an f32 tensor pass through device buffers.
    pub stages_uploads: bool,
    /// Bytes the device holds once it has trained a step, whatever the model (the gpu device's
    /// column-sum partials, made by the first backward).
    pub fixed_bytes: u64,
    /// Bytes the device may hold for `--matmul-inputs f16` runs besides (the gpu device's f16 operand
    /// scratch, made by the first precast or packed product).
    pub f16_inputs_bytes: u64,
    /// The device's memory is host RAM (the cpu device): what it holds counts against the machine's RAM.
    pub memory_is_ram: bool,
    /// Host memory the device keeps for moving bytes whatever the model, not charged to its budget:
    /// the gpu device's upload ring at its largest (RAM on a discrete GPU).
    pub host_staging_bytes: u64,
    /// The least host memory of read-back buffers the device keeps for reuse (the gpu device's); see
    /// [`Self::spare_readback_bytes`].
    pub min_spare_readback_bytes: u64,
}

impl AllocCosts {
    /// The gpu device: packed 16-bit tensors, token ids and 16-bit uploads staged on the device.
    pub const GPU: AllocCosts = AllocCosts {
        packs_16bit: true,
        stages_uploads: true,
        fixed_bytes: GPU_COLUMN_PARTIALS_BYTES,
        f16_inputs_bytes: GPU_COOP_SCRATCH_BYTES,
        memory_is_ram: false,
        host_staging_bytes: GPU_UPLOAD_CHUNK_BYTES * GPU_UPLOAD_RING_MAX_LEN as u64,
        min_spare_readback_bytes: GPU_SPARE_READBACK_BYTES,
    };
    /// The cpu device: every tensor f32; token ids and uploads stay in host memory.
    pub const CPU: AllocCosts = AllocCosts {
        packs_16bit: false,
        stages_uploads: false,
        fixed_bytes: 0,
        f16_inputs_bytes: 0,
        memory_is_ram: true,
        host_staging_bytes: 0,
        min_spare_readback_bytes: 0,
    };

    /// The most host memory of finished read-back buffers the device keeps for reuse when the largest
    /// read is `largest_read_bytes`: its minimum, or two buffers of that size (none on the cpu device).
    pub fn spare_readback_bytes(&self, largest_read_bytes: u64) -> u64 {
        if self.min_spare_readback_bytes == 0 { 0 } else { self.min_spare_readback_bytes.max(2 * largest_read_bytes) }
    }

    /// An f32 tensor of `len` elements (an empty one still takes a word).
    pub fn tensor_bytes(&self, len: usize) -> u64 {
        4 * len.max(1) as u64
    }

    /// A tensor of `len` 16-bit values (`Backend::alloc_16bit`).
    pub fn tensor_16bit_bytes(&self, len: usize) -> u64 {
        if self.packs_16bit { self.tensor_bytes(len.div_ceil(2)) } else { self.tensor_bytes(len) }
    }

    /// At most the bytes of one `Backend::tokens` call of `n` ids: the ids, the distinct tokens, their
    /// starts and the positions grouped by token (the encoder's backward buckets).
    pub fn tokens_bytes(&self, n: usize) -> u64 {
        if self.stages_uploads { 3 * self.tensor_bytes(n) + self.tensor_bytes(n + 1) } else { 0 }
    }

    /// The device staging of one `Backend::write_16bit` of `len` values into an f32 tensor.
    pub fn upload_16bit_bytes(&self, len: usize) -> u64 {
        if self.stages_uploads { self.tensor_bytes(len.div_ceil(2)) } else { 0 }
    }
}

#[derive(Debug)]
struct Counters {
    budget_bytes: u64,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
}

/// Counts live and peak bytes against a budget. Cloning shares the counters.
#[derive(Clone, Debug)]
pub struct ByteBudget(Arc<Counters>);

/// Bytes held by one allocation; released on drop.
#[derive(Debug)]
pub struct Charge {
    budget: ByteBudget,
    bytes: u64,
}

/// Live and peak bytes, and the budget they are held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocStats {
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub budget_bytes: u64,
}

impl ByteBudget {
    pub fn new(budget_bytes: u64) -> Self {
        ByteBudget(Arc::new(Counters { budget_bytes, live_bytes: AtomicU64::new(0), peak_bytes: AtomicU64::new(0) }))
    }

    /// Charges `bytes` for the allocation named `label`, or fails without charging if the budget would be exceeded.
    pub fn charge(&self, bytes: u64, label: &str) -> Result<Charge> {
        let c = &self.0;
        let mut live = c.live_bytes.load(Ordering::Relaxed);
        loop {
            let new_live = live + bytes;
            if new_live > c.budget_bytes {
                bail!(
                    "device memory budget exceeded allocating {label} ({bytes} bytes): {live} bytes live, budget {} bytes",
                    c.budget_bytes
                );
            }
            match c.live_bytes.compare_exchange_weak(live, new_live, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    c.peak_bytes.fetch_max(new_live, Ordering::Relaxed);
                    return Ok(Charge { budget: self.clone(), bytes });
                }
                Err(actual) => live = actual,
            }
        }
    }

    pub fn stats(&self) -> AllocStats {
        AllocStats {
            live_bytes: self.0.live_bytes.load(Ordering::Relaxed),
            peak_bytes: self.0.peak_bytes.load(Ordering::Relaxed),
            budget_bytes: self.0.budget_bytes,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.0.live_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// The RAM available now, in bytes: MemAvailable from /proc/meminfo on Linux, the system's own count
/// elsewhere (sysinfo: free and reclaimable pages on macOS, GlobalMemoryStatusEx on Windows); None
/// where it cannot be read.
pub fn available_ram_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let mut system = sysinfo::System::new();
        system.refresh_memory();
        Some(system.available_memory()).filter(|&bytes| bytes > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_counted_released_and_held_to_the_budget() {
        let budget = ByteBudget::new(1000);
        let a = budget.charge(600, "a").unwrap();
        let err = budget.charge(500, "b").unwrap_err().to_string();
        assert!(err.contains("b (500 bytes)") && err.contains("600 bytes live"), "{err}");
        drop(a);
        let _c = budget.charge(900, "c").unwrap();
        assert_eq!(budget.stats(), AllocStats { live_bytes: 900, peak_bytes: 900, budget_bytes: 1000 });
    }
}
