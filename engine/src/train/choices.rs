//! The enum-valued choices of a run that change its numbers: `--precision` (the working copy and
//! loss scaling), `--adam-state` (the moments' format) and `--optimizer` (the update rule).

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

/// `--adam-state`: the format AdamW's first and second moments are kept in. fp32 is PyTorch's state
/// exactly; bf16 halves it (4 bytes per parameter fewer to hold and, on NVMe, to read and write each
/// step), the update still computed in f32 and the moments rounded stochastically as they are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AdamState {
    Fp32,
    Bf16,
}

impl AdamState {
    /// As the flag takes it.
    pub fn name(self) -> &'static str {
        match self {
            AdamState::Fp32 => "fp32",
            AdamState::Bf16 => "bf16",
        }
    }
    /// Bytes of one moment per parameter.
    pub fn moment_bytes(self) -> usize {
        match self {
            AdamState::Fp32 => 4,
            AdamState::Bf16 => 2,
        }
    }
}

/// `--optimizer`: the update rule the CPU applies to the master weights. LAMB and LARS scale each
/// tensor's step by a trust ratio of its norms (for large batches); see `zerostream_offload::layerwise`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Optimizer {
    Adamw,
    Lamb,
    Lars,
}

impl Optimizer {
    /// As the flag takes it.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Adamw => "adamw",
            Optimizer::Lamb => "lamb",
            Optimizer::Lars => "lars",
        }
    }

    /// What its state is called in summaries ("AdamW moments").
    pub fn state_words(self) -> &'static str {
        match self {
            Optimizer::Adamw => "AdamW moments",
            Optimizer::Lamb => "LAMB moments",
            Optimizer::Lars => "LARS momentum",
        }
    }

    /// The names of the moments it keeps per parameter, as the checkpoint stores them (LAMB's are
    /// Adam's; LARS keeps one momentum buffer).
    pub fn moment_names(self) -> &'static [&'static str] {
        match self {
            Optimizer::Adamw | Optimizer::Lamb => &["adam_m", "adam_v"],
            Optimizer::Lars => &["momentum"],
        }
    }
}
