//! What a training run is configured with: `--precision` and every other setting besides the model
//! and the data.

use std::path::PathBuf;

use zerostream_offload::{IoConfig, Tier};

use super::schedule::{LrPlan, LrSchedule};
use super::shard::ZeroStage;
use crate::device::HalfFormat;

/// `--precision`: what the device computes with. Math is f32 in every mode; the modes differ in the
/// working copy of the parameters (rounded to 16 bits) and, for fp16, in dynamic loss scaling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

impl Precision {
    pub fn working_bytes_per_param(self) -> usize {
        if self == Precision::Fp32 { 4 } else { 2 }
    }
    /// The 16-bit format of the working copy, if it has one.
    pub fn half_format(self) -> Option<HalfFormat> {
        match self {
            Precision::Fp32 => None,
            Precision::Bf16 => Some(HalfFormat::Bf16),
            Precision::Fp16 => Some(HalfFormat::F16),
        }
    }
}

/// Everything a training run is configured with besides the model and the data.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// B: sequences per micro-batch.
    pub batch: usize,
    /// T: tokens per sequence.
    pub seq_len: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    pub steps: u64,
    pub lr: LrPlan,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay, applied to tensors of two or more dimensions only.
    pub weight_decay: f64,
    /// Clip the global gradient L2 norm to this (0 = off).
    pub grad_clip: f64,
    pub precision: Precision,
    /// Device bytes the run may hold at once (None = no limit).
    pub gpu_mem_budget: Option<u64>,
    /// Keep only each block's input and recompute its activations in backward.
    pub recompute: bool,
    pub offload_optimizer: Tier,
    pub offload_params: Tier,
    pub nvme_dir: Option<PathBuf>,
    pub io: IoConfig,
    /// Checksum every NVMe shard on write and check it on read.
    pub verify: bool,
    /// AdamW threads (0 = one per core).
    pub adam_threads: usize,
    /// Which state is split between ranks (with more than one rank).
    pub zero_stage: ZeroStage,
    /// The strictly sequential schedule: no block uploaded ahead, each gradient download finished
    /// before the next backward starts, and each update finished before the step returns. Slower; the
    /// oracle that the overlapped schedule must equal bit for bit.
    pub sequential: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            batch: 4,
            seq_len: 64,
            grad_accum: 1,
            steps: 10,
            lr: LrPlan { peak: 1e-3, min: 0.0, warmup_steps: 0, total_steps: 10, schedule: LrSchedule::Constant },
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            precision: Precision::Fp32,
            gpu_mem_budget: None,
            recompute: false,
            offload_optimizer: Tier::Ram,
            offload_params: Tier::Ram,
            nvme_dir: None,
            io: IoConfig::default(),
            verify: true,
            adam_threads: 0,
            zero_stage: ZeroStage::Two,
            sequential: false,
        }
    }
}
