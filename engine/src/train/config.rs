//! What a training run is configured with: `--precision` and every other setting besides the model
//! and the data.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use serde_json::{Value, json};
use zerostream_offload::{IoConfig, Tier};

use super::schedule::{LrPlan, LrSchedule};
use super::shard::ZeroStage;
use crate::comm::compress::{self, Codec, GradCompression, ParamCompression};
use crate::device::MatmulInputs;

pub use super::choices::{AdamState, Optimizer, Precision};

/// The most micro-batches one step accumulates (`--grad-accum`): the planner walks a step's schedule
/// op by op, so a step of a billion micro-batches would take it hours (about 2^16 x 16 tokens is already
/// a million-token batch a rank).
pub const MAX_GRAD_ACCUM: usize = 1 << 16;

/// Everything a training run is configured with besides the model and the data.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// B: sequences per micro-batch.
    pub batch: usize,
    /// T: tokens per sequence.
    pub seq_len: usize,
    /// Micro-batches per optimizer step, on each rank.
    pub grad_accum: usize,
    /// Optimizer steps, counted from the start of training (a resumed run goes on to this many).
    pub steps: u64,
    /// The learning rate of each step; its `total_steps` should be `steps` for the cosine to end
    /// where the run does.
    pub lr: LrPlan,
    /// AdamW's first- and second-moment decay rates, and the epsilon added to the denominator.
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay, applied to tensors of two or more dimensions only.
    pub weight_decay: f64,
    /// Clip the global gradient L2 norm to this (0 = off).
    pub grad_clip: f64,
    pub precision: Precision,
    /// Device bytes the run may hold at once (None = no limit), which the placement is planned
    /// under; the device opened for the run enforces its own budget (`device::open`'s), so a library
    /// caller gives both the same.
    pub gpu_mem_budget: Option<u64>,
    /// Keep only each block's input and recompute its activations in backward.
    pub recompute: bool,
    pub offload_optimizer: Tier,
    /// Where the step's fp32 gradient accumulator lives (None: with the optimizer state). Only the
    /// place changes, never a bit.
    pub offload_gradients: Option<Tier>,
    pub offload_params: Tier,
    /// `--params-ram-cache`: RAM (bytes) that keeps blocks' working copies from the NVMe tier between
    /// their forward and backward uploads, so they are read once a step, not twice (0: none). Only
    /// where bytes are, never a bit; which blocks it holds: `traffic::cached_working_blocks`.
    pub params_ram_cache_bytes: u64,
    /// `--nvme-dir`: the NVMe tier's directories (empty: none); with several, every tensor there is
    /// striped over all of them.
    pub nvme_dirs: Vec<PathBuf>,
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
    /// Working copies kept in RAM live in pinned host memory where the device offers it
    /// (`Backend::alloc_pinned`), so the update writes them where uploads copy from (`--no-pin-memory`
    /// turns it off). Where bytes live, never what is computed.
    pub pin_memory: bool,
    /// `--copy-queue`: a gpu device moves the big uploads and read-backs on a second Vulkan queue,
    /// beside the kernels (`Backend::set_copy_queue`). Where copies run, never what is computed.
    pub copy_queue: bool,
    /// `--dropout P`: every dropout probability of the model set to P (None: the config's).
    pub dropout: Option<f64>,
    /// `--seed`: of the initialisation, the dropout masks and the sample.
    pub seed: u64,
    /// `--vocab-chunk-rows`: vocabulary ids per chunk of the output projection and the loss (part of
    /// what is computed, like the precision; never of where bytes are: see `model::vocab`).
    pub vocab_chunk_rows: usize,
    /// `--matmul-inputs`: f16 rounds every matmul's operands to f16 (the gpu device's cooperative-matrix
    /// kernel); part of what is computed, like the precision.
    pub matmul_inputs: MatmulInputs,
    /// `--adam-state`: the moments' format; part of what is computed, like the precision.
    pub adam_state: AdamState,
    /// `--grad-compression`: how gradients cross between ranks (with error feedback); part of what is
    /// computed with more than one rank.
    pub grad_compression: GradCompression,
    /// `--grad-compression-chunk`: elements per scale of int8 and onebit.
    pub grad_compression_chunk: usize,
    /// `--grad-compression-warmup`: optimizer steps at the start of training whose gradients cross
    /// uncompressed (the compression starts after them, its residuals from zero).
    pub grad_compression_warmup: u64,
    /// `--freeze-variance`: AdamW's or LAMB's second moment stops changing after the
    /// `grad_compression_warmup` steps (1-bit Adam's frozen variance).
    pub freeze_variance: bool,
    /// `--all-reduce-phases`: stage 0's compressed all-reduce in one phase or two.
    pub all_reduce_phases: crate::comm::AllReducePhases,
    /// `--param-compression`: how the working copy crosses between ranks in its all-gather (every rank
    /// then computes with the decoded copy); part of what is computed with more than one rank.
    pub param_compression: ParamCompression,
    /// `--optimizer`: AdamW, LAMB or LARS (LAMB uses beta1, beta2 and eps; LARS momentum and
    /// trust_coefficient).
    pub optimizer: Optimizer,
    /// `--momentum`: LARS's momentum.
    pub momentum: f64,
    /// `--trust-coefficient`: LARS's eta, which scales its trust ratio.
    pub trust_coefficient: f64,
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
            offload_gradients: None,
            offload_params: Tier::Ram,
            params_ram_cache_bytes: 0,
            nvme_dirs: Vec::new(),
            io: IoConfig::default(),
            verify: true,
            adam_threads: 0,
            zero_stage: ZeroStage::Two,
            sequential: false,
            pin_memory: true,
            copy_queue: false,
            dropout: None,
            seed: 1337,
            vocab_chunk_rows: crate::model::vocab::DEFAULT_CHUNK_ROWS,
            matmul_inputs: MatmulInputs::F32,
            adam_state: AdamState::Fp32,
            grad_compression: GradCompression::None,
            grad_compression_chunk: compress::DEFAULT_CHUNK_ELEMS,
            grad_compression_warmup: 0,
            freeze_variance: false,
            all_reduce_phases: crate::comm::AllReducePhases::Auto,
            param_compression: ParamCompression::None,
            optimizer: Optimizer::Adamw,
            momentum: 0.9,
            trust_coefficient: 0.001,
        }
    }
}

/// A run's settings by flag name (`lr`, `batch-size`, ...), as the user types them: what a checkpoint
/// records and what resume compares.
pub type Flags = BTreeMap<String, Value>;

/// Flags that change what a run computes: on resume they must match the checkpoint's.
pub const MEANING_FLAGS: &[&str] = &[
    "precision",
    "vocab-chunk-rows",
    "matmul-inputs",
    "adam-state",
    "grad-compression",
    "grad-compression-chunk",
    "grad-compression-warmup",
    "freeze-variance",
    "all-reduce-phases",
    "param-compression",
    "optimizer",
    "momentum",
    "trust-coefficient",
    "batch-size",
    "seq-len",
    "lr",
    "min-lr",
    "warmup-steps",
    "lr-schedule",
    "beta1",
    "beta2",
    "eps",
    "weight-decay",
    "grad-clip",
    "dropout",
];

/// The setting `k` of `f` as one of `E`'s names; where it is missing, `absent` (a checkpoint from
/// before the flag), or an error where every checkpoint has it (None).
fn enum_flag<E: ValueEnum>(f: &Flags, k: &str, absent: Option<E>) -> Result<E> {
    match (f.get(k), absent) {
        (None, Some(e)) => Ok(e),
        (None, None) => bail!("the setting {k} is missing"),
        (Some(v), _) => {
            let name = v.as_str().with_context(|| format!("{k}: expected a string"))?;
            E::from_str(name, true).map_err(|e| anyhow::anyhow!("{k}: {e}"))
        }
    }
}

fn enum_name<E: ValueEnum>(e: E) -> String {
    e.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
}

/// The directories as `--nvme-dir` takes them: comma-separated (None for none).
pub fn join_dirs(dirs: &[PathBuf]) -> Option<String> {
    (!dirs.is_empty()).then(|| dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(","))
}

fn split_dirs(joined: &str) -> Vec<PathBuf> {
    joined.split(',').map(PathBuf::from).collect()
}

fn tier_from(name: &str) -> Result<Tier> {
    match name {
        // `ram` as the gradients' flag spells it; `cpu` as the optimizer's and the parameters' do.
        "cpu" | "ram" => Ok(Tier::Ram),
        "nvme" => Ok(Tier::Nvme),
        other => bail!("expected cpu (or ram) or nvme, got {other:?}"),
    }
}

impl TrainConfig {
    /// Where the gradient accumulator lives: `--offload-gradients`, else with the optimizer state.
    pub fn gradients_tier(&self) -> Tier {
        self.offload_gradients.unwrap_or(self.offload_optimizer)
    }

    /// Whether the loss is scaled dynamically ([`super::LossScaler`]): with 16-bit gradients (fp16), and
    /// with f16 matmul inputs, where an unscaled output gradient (about 1 / (tokens x vocab) per logit,
    /// 5e-9 for GPT-2 at B=4, T=1024) would round to zero.
    pub fn loss_scaled(&self) -> bool {
        self.precision == Precision::Fp16 || self.matmul_inputs == MatmulInputs::F16
    }

    /// Bytes per parameter of the optimizer state: the fp32 master weight and the optimizer's moments.
    pub fn state_bytes_per_param(&self) -> usize {
        4 + self.moment_bytes_per_param()
    }

    /// Bytes per parameter of the optimizer's moments (two for AdamW and LAMB, one for LARS).
    pub fn moment_bytes_per_param(&self) -> usize {
        self.optimizer.moment_names().len() * self.adam_state.moment_bytes()
    }

    /// Whether any state lives on the NVMe tier (so `--nvme-dir` is needed).
    pub fn uses_nvme(&self) -> bool {
        [self.offload_optimizer, self.gradients_tier(), self.offload_params].contains(&Tier::Nvme)
    }

    /// Refuses an empty micro-batch or step, or one of more micro-batches than [`MAX_GRAD_ACCUM`]
    /// (checked again by every trainer, whoever made its config).
    pub fn check_batch(&self) -> Result<()> {
        crate::words::require_positive(&[("--batch-size", self.batch), ("--seq-len", self.seq_len), ("--grad-accum", self.grad_accum)])?;
        if self.grad_accum > MAX_GRAD_ACCUM {
            bail!("--grad-accum {}: at most {MAX_GRAD_ACCUM} micro-batches a step (raise --batch-size instead)", self.grad_accum);
        }
        Ok(())
    }

    /// Refuses settings that cannot train, each named by its flag with the range it must lie in.
    pub fn check(&self) -> Result<()> {
        if self.steps == 0 {
            bail!("--steps must be at least 1");
        }
        self.check_batch()?;
        if self.uses_nvme() && self.nvme_dirs.is_empty() {
            bail!("--offload-optimizer nvme, --offload-gradients nvme and --offload-params nvme need --nvme-dir DIR");
        }
        // Checked with or without an NVMe tier: a bad value must not wait for the state's first write.
        let align = zerostream_offload::ALIGN_BYTES;
        if self.io.block_bytes == 0 || !self.io.block_bytes.is_multiple_of(align) {
            bail!("--block-size {}: expected a positive multiple of {align} bytes", self.io.block_bytes);
        }
        let max_depth = zerostream_offload::io::MAX_QUEUE_DEPTH;
        if self.io.queue_depth == 0 || self.io.queue_depth > max_depth {
            bail!("--queue-depth {}: expected 1 to {max_depth}", self.io.queue_depth);
        }
        if self.adam_threads > zerostream_offload::MAX_THREADS {
            bail!("--adam-threads {}: at most {} (0: one per core)", self.adam_threads, zerostream_offload::MAX_THREADS);
        }
        /// A flag, its value, whether the value is in range, and the range in words.
        type Check<'a> = (&'a str, f64, fn(f64) -> bool, &'a str);
        let checks: [Check; 9] = [
            ("--lr", self.lr.peak, |x| x > 0.0, "a finite number > 0"),
            ("--min-lr", self.lr.min, |x| x >= 0.0, "a finite number >= 0"),
            ("--beta1", self.beta1, |x| (0.0..1.0).contains(&x), "in [0, 1)"),
            ("--beta2", self.beta2, |x| (0.0..1.0).contains(&x), "in [0, 1)"),
            ("--eps", self.eps, |x| x > 0.0, "a finite number > 0"),
            ("--weight-decay", self.weight_decay, |x| x >= 0.0, "a finite number >= 0"),
            ("--grad-clip", self.grad_clip, |x| x >= 0.0, "a finite number >= 0 (0 = no clipping)"),
            ("--momentum", self.momentum, |x| (0.0..1.0).contains(&x), "in [0, 1)"),
            ("--trust-coefficient", self.trust_coefficient, |x| x > 0.0, "a finite number > 0"),
        ];
        for (flag, value, ok, range) in checks {
            if !value.is_finite() || !ok(value) {
                bail!("{flag} {value}: must be {range}");
            }
        }
        if self.lr.schedule == LrSchedule::Cosine && self.lr.min > self.lr.peak {
            bail!("--min-lr {} is above --lr {}: the cosine schedule would raise the rate as it goes", self.lr.min, self.lr.peak);
        }
        Codec::new(self.grad_compression, self.grad_compression_chunk)?;
        if self.optimizer != Optimizer::Adamw && self.adam_state != AdamState::Fp32 {
            bail!(
                "--optimizer {} with --adam-state {}: the layer-wise optimizers keep fp32 moments (their two passes \
                 would step with the rounded moments); use --adam-state fp32",
                enum_name(self.optimizer),
                self.adam_state.name()
            );
        }
        if self.freeze_variance && self.optimizer == Optimizer::Lars {
            bail!("--freeze-variance with --optimizer lars: LARS keeps no second moment to freeze; use adamw or lamb");
        }
        if self.freeze_variance && self.grad_compression_warmup == 0 {
            bail!(
                "--freeze-variance needs --grad-compression-warmup STEPS >= 1: the variance freezes when the warm-up \
                 ends, and is learned during it"
            );
        }
        if self.param_compression == ParamCompression::Bf16 && self.precision == Precision::Fp16 {
            bail!(
                "--param-compression bf16 with --precision fp16: the fp16 working copy already crosses in 2 bytes a \
                 word, so bf16 would send as many bytes and drop 3 bits of each; use none or int8"
            );
        }
        if self.grad_compression != GradCompression::None && self.loss_scaled() {
            bail!(
                "--grad-compression {} with {}: a loss-scaled step whose gradient overflowed is skipped, but its \
                 overflow would stay in the error-feedback residual; use --precision bf16 or fp32 with --matmul-inputs f32",
                self.grad_compression,
                if self.precision == Precision::Fp16 { "--precision fp16" } else { "--matmul-inputs f16" }
            );
        }
        Ok(())
    }

    /// Every setting under its flag name, with the value as typed on the command line.
    pub fn to_flags(&self) -> Flags {
        let mut f = Flags::new();
        let mut put = |k: &str, v: Value| {
            f.insert(k.to_string(), v);
        };
        put("batch-size", json!(self.batch));
        put("seq-len", json!(self.seq_len));
        put("grad-accum", json!(self.grad_accum));
        put("steps", json!(self.steps));
        put("lr", json!(self.lr.peak));
        put("min-lr", json!(self.lr.min));
        put("warmup-steps", json!(self.lr.warmup_steps));
        put("lr-schedule", json!(enum_name(self.lr.schedule)));
        put("beta1", json!(self.beta1));
        put("beta2", json!(self.beta2));
        put("eps", json!(self.eps));
        put("weight-decay", json!(self.weight_decay));
        put("grad-clip", json!(self.grad_clip));
        put("precision", json!(enum_name(self.precision)));
        put("gpu-mem-budget", json!(self.gpu_mem_budget));
        put("recompute", json!(self.recompute));
        put("offload-optimizer", json!(self.offload_optimizer.name()));
        put("offload-gradients", json!(self.offload_gradients.map(Tier::name)));
        put("offload-params", json!(self.offload_params.name()));
        put("params-ram-cache", json!(self.params_ram_cache_bytes));
        put("nvme-dir", json!(join_dirs(&self.nvme_dirs)));
        put("io-engine", json!(self.io.engine.name()));
        put("block-size", json!(self.io.block_bytes));
        put("queue-depth", json!(self.io.queue_depth));
        put("buffered", json!(!self.io.direct));
        put("no-verify", json!(!self.verify));
        put("adam-threads", json!(self.adam_threads));
        put("zero-stage", json!(self.zero_stage.number()));
        put("sequential", json!(self.sequential));
        put("no-pin-memory", json!(!self.pin_memory));
        put("copy-queue", json!(self.copy_queue));
        put("dropout", json!(self.dropout));
        put("seed", json!(self.seed));
        put("vocab-chunk-rows", json!(self.vocab_chunk_rows));
        put("matmul-inputs", json!(enum_name(self.matmul_inputs)));
        put("adam-state", json!(enum_name(self.adam_state)));
        put("grad-compression", json!(self.grad_compression.to_string()));
        put("grad-compression-chunk", json!(self.grad_compression_chunk));
        put("grad-compression-warmup", json!(self.grad_compression_warmup));
        put("freeze-variance", json!(self.freeze_variance));
        put("all-reduce-phases", json!(enum_name(self.all_reduce_phases)));
        put("param-compression", json!(self.param_compression.name()));
        put("optimizer", json!(enum_name(self.optimizer)));
        put("momentum", json!(self.momentum));
        put("trust-coefficient", json!(self.trust_coefficient));
        f
    }

    /// The configuration [`TrainConfig::to_flags`] wrote (a checkpoint's); errors name the flag.
    pub fn from_flags(f: &Flags) -> Result<Self> {
        let get = |k: &str| f.get(k).with_context(|| format!("the setting {k} is missing"));
        let uint = |k: &str| get(k)?.as_u64().with_context(|| format!("{k}: expected a whole number"));
        let float = |k: &str| get(k)?.as_f64().with_context(|| format!("{k}: expected a number"));
        let flag = |k: &str| get(k)?.as_bool().with_context(|| format!("{k}: expected true or false"));
        let text = |k: &str| get(k)?.as_str().map(str::to_string).with_context(|| format!("{k}: expected a string"));
        let precision = enum_flag(f, "precision", None)?;
        let schedule = enum_flag(f, "lr-schedule", None)?;
        let steps = uint("steps")?;
        let stage = ZeroStage::from_number(uint("zero-stage")? as u8).context("zero-stage: expected 0, 1, 2 or 3")?;
        Ok(TrainConfig {
            batch: uint("batch-size")? as usize,
            seq_len: uint("seq-len")? as usize,
            grad_accum: uint("grad-accum")? as usize,
            steps,
            lr: LrPlan { peak: float("lr")?, min: float("min-lr")?, warmup_steps: uint("warmup-steps")?, total_steps: steps, schedule },
            beta1: float("beta1")?,
            beta2: float("beta2")?,
            eps: float("eps")?,
            weight_decay: float("weight-decay")?,
            grad_clip: float("grad-clip")?,
            precision,
            gpu_mem_budget: get("gpu-mem-budget")?.as_u64(),
            recompute: flag("recompute")?,
            offload_optimizer: tier_from(&text("offload-optimizer")?).context("offload-optimizer")?,
            // Checkpoints from before --offload-gradients kept the gradients with the optimizer state.
            offload_gradients: match f.get("offload-gradients").and_then(Value::as_str) {
                Some(t) => Some(tier_from(t).context("offload-gradients")?),
                None => None,
            },
            offload_params: tier_from(&text("offload-params")?).context("offload-params")?,
            // Checkpoints from before --params-ram-cache read the working copy twice.
            params_ram_cache_bytes: f.get("params-ram-cache").and_then(Value::as_u64).unwrap_or(0),
            nvme_dirs: get("nvme-dir")?.as_str().map(split_dirs).unwrap_or_default(),
            io: io_from_flags(f)?,
            verify: !flag("no-verify")?,
            adam_threads: uint("adam-threads")? as usize,
            zero_stage: stage,
            sequential: flag("sequential")?,
            // Checkpoints from before --no-pin-memory: pinned, the default.
            pin_memory: f.get("no-pin-memory").is_none() || !flag("no-pin-memory")?,
            // Checkpoints from before --copy-queue: wgpu's queue.
            copy_queue: f.get("copy-queue").is_some() && flag("copy-queue")?,
            // Checkpoints from before dropout existed trained without it.
            dropout: f.get("dropout").and_then(Value::as_f64),
            seed: uint("seed")?,
            // Checkpoints from before the chunked loss: the default chunks.
            vocab_chunk_rows: f
                .get("vocab-chunk-rows")
                .and_then(Value::as_u64)
                .map_or(crate::model::vocab::DEFAULT_CHUNK_ROWS, |n| n as usize),
            // Checkpoints from before --matmul-inputs multiplied f32 inputs.
            matmul_inputs: enum_flag(f, "matmul-inputs", Some(MatmulInputs::F32))?,
            // Checkpoints from before --adam-state kept fp32 moments.
            adam_state: enum_flag(f, "adam-state", Some(AdamState::Fp32))?,
            // Checkpoints from before --grad-compression exchanged f32.
            grad_compression: match f.get("grad-compression") {
                None => GradCompression::None,
                Some(_) => text("grad-compression")?.parse()?,
            },
            grad_compression_chunk: f
                .get("grad-compression-chunk")
                .and_then(Value::as_u64)
                .map_or(compress::DEFAULT_CHUNK_ELEMS, |n| n as usize),
            // Checkpoints from before --grad-compression-warmup compressed from the first step.
            grad_compression_warmup: f.get("grad-compression-warmup").and_then(Value::as_u64).unwrap_or(0),
            // Checkpoints from before --freeze-variance updated it every step.
            freeze_variance: f.get("freeze-variance").and_then(Value::as_bool).unwrap_or(false),
            // Checkpoints from before --all-reduce-phases chose as auto does now.
            all_reduce_phases: enum_flag(f, "all-reduce-phases", Some(crate::comm::AllReducePhases::Auto))?,
            // Checkpoints from before --param-compression gathered the working copy exactly.
            param_compression: enum_flag(f, "param-compression", Some(ParamCompression::None))?,
            // Checkpoints from before --optimizer trained with AdamW.
            optimizer: enum_flag(f, "optimizer", Some(Optimizer::Adamw))?,
            momentum: f.get("momentum").and_then(Value::as_f64).unwrap_or(0.9),
            trust_coefficient: f.get("trust-coefficient").and_then(Value::as_f64).unwrap_or(0.001),
        })
    }
}

/// The NVMe I/O settings among a checkpoint's flags.
fn io_from_flags(f: &Flags) -> Result<IoConfig> {
    let get = |k: &str| f.get(k).with_context(|| format!("the setting {k} is missing"));
    let uint = |k: &str| get(k)?.as_u64().with_context(|| format!("{k}: expected a whole number"));
    let engine = get("io-engine")?.as_str().context("io-engine: expected a string")?;
    Ok(IoConfig {
        engine: engine.parse().map_err(|e: String| anyhow::anyhow!("io-engine: {e}"))?,
        block_bytes: uint("block-size")? as usize,
        queue_depth: uint("queue-depth")? as usize,
        direct: !get("buffered")?.as_bool().context("buffered: expected true or false")?,
    })
}

#[cfg(test)]
mod tests;
