//! `zerostream train` and `zerostream plan`: their flags, the checks made before any work (ranges,
//! outputs that would overwrite inputs, `--resume` against the checkpoint), the launch on one rank, on
//! in-process ranks or under mpirun, and SIGINT/SIGTERM.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use zerostream::device::{AllocCosts, DeviceChoice};
use zerostream::train::ranks::RankDevice;
use zerostream::train::run::{CheckpointOptions, ModelChoice, RunOptions, RunSummary};
use zerostream::train::{LrPlan, LrSchedule, Precision, SaveDtype, TrainConfig, ZeroStage};
use zerostream_checkpoints::{DataTokenizer, TokenWidth};
use zerostream_offload::{IoConfig, IoEngineKind, Tier};

use crate::{DeviceArgs, parse_size};
use checks::{check_hyperparameters, check_outputs, check_resumed_model, keep_first_run_files};

mod checks;

/// Where a kind of state lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OffloadTarget {
    /// Host RAM.
    Cpu,
    /// Files under --nvme-dir.
    Nvme,
}

impl OffloadTarget {
    fn tier(self) -> Tier {
        match self {
            OffloadTarget::Cpu => Tier::Ram,
            OffloadTarget::Nvme => Tier::Nvme,
        }
    }
}

#[derive(clap::Args)]
pub struct IoArgs {
    /// How NVMe files are read and written: `uring` (io_uring, Linux's default), `threads` (positioned
    /// reads and writes on a pool of threads, several requests in flight: the default elsewhere), or
    /// `mmap` (through the page cache, for comparison).
    #[arg(long, default_value_t = IoEngineKind::NATIVE)]
    io_engine: IoEngineKind,
    /// Bytes per NVMe request (a multiple of 4KiB).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    block_size: u64,
    /// NVMe requests in flight.
    #[arg(long, default_value_t = 32)]
    queue_depth: usize,
    /// Use the page cache instead of uncached I/O (O_DIRECT on Linux, F_NOCACHE on macOS, unbuffered on Windows).
    #[arg(long)]
    buffered: bool,
}

impl IoArgs {
    fn config(&self) -> IoConfig {
        IoConfig { engine: self.io_engine, block_bytes: self.block_size as usize, queue_depth: self.queue_depth, direct: !self.buffered }
    }
}

fn parse_stage(text: &str) -> Result<ZeroStage, String> {
    text.trim().parse::<u8>().ok().and_then(ZeroStage::from_number).ok_or_else(|| format!("expected 1, 2 or 3, got {text:?}"))
}

#[derive(clap::Args)]
pub struct TrainArgs {
    /// Flags from a TOML file, one `flag-name = value` per line (`lr = 3e-4`, `precision = "bf16"`,
    /// `recompute = true`); flags on the command line win. With --metrics, the run's resolved
    /// configuration is written beside them as `NAME.config.toml`, which repeats the run.
    #[arg(long)]
    config_file: Option<PathBuf>,
    /// A Hugging Face model directory to start from (GPT2LMHeadModel or LlamaForCausalLM: config.json +
    /// model.safetensors, or sharded).
    #[arg(long, conflicts_with = "config")]
    model: Option<PathBuf>,
    /// Start from random weights: a preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-3.2-1b, llama-3-8b)
    /// or a config.json.
    #[arg(long)]
    config: Option<String>,
    /// Token file (llm.c's uint16 or Llama-3 uint32 format, or raw tokens: see --data-dtype; `zerostream
    /// prepare` writes one). Default: the built-in Hamlet text.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Token width of a raw --data file without llm.c's header: u16 (GPT-2's vocabulary) or u32 (larger
    /// vocabularies, Llama-3's). llm.c's files say their own width.
    #[arg(long, value_enum, default_value = "u16")]
    data_dtype: TokenWidth,
    /// The tokenizer --data was prepared with, written into every saved model directory and checkpoint
    /// (GPT-2's BPE as vocab.json + merges.txt, a tokenizer.json copied, bytes as nothing): `gpt2`,
    /// `bytes` or the path of a tokenizer.json. Default: the record `prepare` leaves beside the token
    /// file (`NAME.tokenizer`); the built-in text has its own word tokenizer.
    #[arg(long)]
    tokenizer: Option<String>,
    /// Held-out token file for the validation loss (and perplexity): in the progress lines, the
    /// metrics rows (`val_loss`) and the summary. `prepare --val-fraction` makes one.
    #[arg(long)]
    val_data: Option<PathBuf>,
    /// Validate before every step that is a multiple of N, on the weights that step starts from (step
    /// 0: the initial model). 0 = only after the last step. Validation data is --val-data, or for the
    /// built-in run (no --data) the last scenes of Hamlet.
    #[arg(long, default_value_t = 100)]
    eval_every: u64,
    /// Micro-batches of --val-data per validation (the first ones, in the order `eval` reads them, so
    /// the number is the one `zerostream eval` gives for the same weights).
    #[arg(long, default_value_t = 4)]
    eval_batches: usize,
    /// B: sequences per micro-batch.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// T: tokens per sequence (at most the model's n_positions).
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    /// Micro-batches per optimizer step (gradients accumulate on the host, where the optimizer state lives).
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// Learning rate at the end of a cosine schedule.
    #[arg(long, default_value_t = 1e-4)]
    min_lr: f64,
    /// Steps of linear warm-up from lr/warmup to lr.
    #[arg(long, default_value_t = 20)]
    warmup_steps: u64,
    /// Learning-rate schedule after warm-up.
    #[arg(long, value_enum, default_value = "cosine")]
    lr_schedule: LrSchedule,
    /// AdamW beta1.
    #[arg(long, default_value_t = 0.9)]
    beta1: f64,
    /// AdamW beta2.
    #[arg(long, default_value_t = 0.95)]
    beta2: f64,
    /// AdamW epsilon.
    #[arg(long, default_value_t = 1e-8)]
    eps: f64,
    /// Decoupled weight decay, applied to tensors of two or more dimensions only.
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f64,
    /// Clip the global gradient L2 norm to this (0 = no clipping).
    #[arg(long, default_value_t = 1.0)]
    grad_clip: f64,
    /// Working precision of the parameters the device computes with: fp32, bf16, or fp16 (with
    /// dynamic loss scaling). Master weights and Adam moments are always fp32.
    #[arg(long, value_enum, default_value = "fp32")]
    precision: Precision,
    #[command(flatten)]
    device: DeviceArgs,
    /// Most device memory the run may hold, e.g. 512MiB or 2GiB (default: no limit). A budget too
    /// small for one block and its activations is refused at start-up with the numbers.
    #[arg(long, value_parser = parse_size)]
    gpu_mem_budget: Option<u64>,
    /// Keep only each block's input and recompute its activations during backward (less device memory).
    #[arg(long)]
    recompute: bool,
    /// Where fp32 master weights, Adam moments and the step's fp32 gradient accumulator live (with nvme,
    /// host RAM holds only the few groups being updated or accumulated).
    #[arg(long, value_enum, default_value = "cpu")]
    offload_optimizer: OffloadTarget,
    /// Where the working copy of the parameters lives between uploads.
    #[arg(long, value_enum, default_value = "cpu")]
    offload_params: OffloadTarget,
    /// Directory for the NVMe tier's files (`{group}.{kind}.rank0.bin`; reused by later runs).
    #[arg(long)]
    nvme_dir: Option<PathBuf>,
    #[command(flatten)]
    io: IoArgs,
    /// Do not checksum NVMe shards (faster; corruption then goes unnoticed).
    #[arg(long)]
    no_verify: bool,
    /// CPU threads for AdamW (0 = one per core).
    #[arg(long, default_value_t = 0)]
    adam_threads: usize,
    /// Ranks in this process, one thread and one device each (data parallel, ZeRO-partitioned state).
    /// Under `mpirun` leave this out: the world size comes from MPI.
    #[arg(long)]
    world_size: Option<usize>,
    /// One device per rank, comma-separated: a GPU adapter's index or name, or `cpu` (e.g. `0,1` or
    /// `cpu,cpu`). Default: every rank opens --device/--adapter. Under mpirun, indexed by the node-local rank.
    #[arg(long)]
    devices: Option<String>,
    /// What is split between ranks: 1 = fp32 master weights and Adam moments; 2 = also the gradients;
    /// 3 = also the working copy of the parameters (gathered before each upload). Default 2.
    #[arg(long, value_parser = parse_stage, default_value = "2")]
    zero_stage: ZeroStage,
    /// Run the strictly sequential schedule (no upload ahead, no download or AdamW overlapped with
    /// compute): slower, and bit-identical to the default overlapped one — for checking that it is.
    #[arg(long)]
    sequential: bool,
    /// Write one JSON object per optimizer step to this file.
    #[arg(long)]
    metrics: Option<PathBuf>,
    /// Write TensorBoard event files to this directory (created if missing; `tensorboard --logdir DIR`
    /// shows them): every number of each step's --metrics row as a scalar (losses, learning rate,
    /// gradient norm, loss scale, tokens/s, busy fractions, the step's time split, bytes per link) and
    /// the resolved configuration as text. Each run, a resumed one too, adds a new file there.
    #[arg(long, value_name = "DIR")]
    tensorboard: Option<PathBuf>,
    /// Save the trained model as a Hugging Face directory (config.json + model.safetensors), written
    /// beside it and moved into place whole. An existing model directory there is replaced; a directory
    /// holding other files is refused.
    #[arg(long)]
    save: Option<PathBuf>,
    /// The saved model's weights (--save and checkpoints): f32, bf16 or f16. Default: the working
    /// precision. The optimizer state in checkpoints is always f32.
    #[arg(long, value_enum)]
    save_dtype: Option<SaveDtype>,
    /// Write checkpoints under this directory (created if missing): step-NNNNNNNN/ with the model, every
    /// rank's optimizer state and the trainer state, written crash-safe; `latest` names the newest. One
    /// is always written at the end and when SIGINT/SIGTERM stops the run.
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Also checkpoint every N optimizer steps (0 = only at the end and when stopped).
    #[arg(long, default_value_t = 0)]
    checkpoint_every: u64,
    /// Keep only the newest K checkpoints (0 = keep all).
    #[arg(long, default_value_t = 0)]
    keep_checkpoints: usize,
    /// Resume from a checkpoint: a step-NNNNNNNN/ directory, or a --checkpoint-dir (its latest). The
    /// model, optimizer state, counters and settings come from it; flags given override harmless
    /// settings (--steps, which counts from the start of training; world size, tiers, budget,
    /// checkpointing), and flags that would change what is computed (precision, batch geometry,
    /// optimizer, schedule, seed) must match it. --data defaults to the checkpoint's; --model or
    /// --config, if given, must name the checkpoint's model (its weights come from the checkpoint).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Seed of the random initialisation (with --config or the built-in model) and of the sample.
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Dropout probability (0 <= P < 1) for every dropout of the model, overriding its config.json
    /// (GPT-2's resid_pdrop, embd_pdrop, attn_pdrop; the published gpt2 asks for 0.1, the presets for 0).
    /// Masks are drawn from the seed, the step and the micro-batch, so they are the same on every device,
    /// at any world size and after a resume. Evaluation, validation and generation never drop.
    #[arg(long)]
    dropout: Option<f64>,
    /// Vocabulary ids per chunk of the output projection and the loss. The device holds one chunk of
    /// the (vocab x width) matrix at a time when --gpu-mem-budget cannot hold it whole, so its minimum
    /// does not grow with the vocabulary. Part of what is computed (the loss is combined chunk by
    /// chunk): a resumed run must keep it; where the matrix lives never changes a result.
    #[arg(long, default_value_t = zerostream::model::vocab::DEFAULT_CHUNK_ROWS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    vocab_chunk_rows: usize,
    /// What every matmul's inputs are rounded to before they are multiplied (sums are f32 either way).
    /// f32 (default): exact inputs, the fp32 kernels. f16: A and B rounded to f16 (nearest even; past
    /// 65504 they become infinity, below ~6e-8 zero) and multiplied on the GPU's cooperative matrices
    /// (tensor cores) where the adapter lists a 16x16x16 f16->f32 configuration (`zerostream devices`
    /// says); a GPU without one refuses, and `--device cpu` rounds the same way on the CPU (no faster
    /// there). It changes the numbers, so a resumed run keeps it.
    #[arg(long, value_enum, default_value_t = zerostream::device::MatmulInputs::F32)]
    matmul_inputs: zerostream::device::MatmulInputs,
    /// Tokens of text to sample at the end (0 = none).
    #[arg(long, default_value_t = 300)]
    sample_tokens: usize,
    /// Text the sample continues.
    #[arg(long, default_value = "HAMLET\n")]
    prompt: String,
}

/// The run `train` would make of these flags: what to load and do, and the training configuration.
/// `plan` needs no data (`needs_data` false).
fn resolve_train(a: &TrainArgs, needs_data: bool, explicit: &BTreeSet<String>) -> Result<(RunOptions, TrainConfig)> {
    if (a.offload_optimizer == OffloadTarget::Nvme || a.offload_params == OffloadTarget::Nvme) && a.nvme_dir.is_none() {
        bail!("--offload-optimizer nvme and --offload-params nvme need --nvme-dir DIR");
    }
    if a.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if a.checkpoint_dir.is_none() && (a.checkpoint_every > 0 || a.keep_checkpoints > 0) {
        bail!("--checkpoint-every and --keep-checkpoints need --checkpoint-dir DIR");
    }
    check_hyperparameters(a)?;
    let model = match (&a.model, &a.config, &a.resume) {
        (_, _, Some(path)) => ModelChoice::Resume(zerostream_checkpoints::checkpoint::resolve_resume(path)?),
        (Some(dir), _, _) => ModelChoice::Hf(dir.clone()),
        (None, Some(spec), _) => ModelChoice::Config(spec.clone()),
        (None, None, None) if a.data.is_none() || !needs_data => ModelChoice::Demo,
        (None, None, None) => bail!("--data needs a model: --model DIR or --config PRESET|FILE"),
    };
    let mut tc = TrainConfig {
        batch: a.batch_size,
        seq_len: a.seq_len,
        grad_accum: a.grad_accum,
        steps: a.steps,
        lr: LrPlan { peak: a.lr, min: a.min_lr, warmup_steps: a.warmup_steps, total_steps: a.steps, schedule: a.lr_schedule },
        beta1: a.beta1,
        beta2: a.beta2,
        eps: a.eps,
        weight_decay: a.weight_decay,
        grad_clip: a.grad_clip,
        precision: a.precision,
        gpu_mem_budget: a.gpu_mem_budget,
        recompute: a.recompute,
        offload_optimizer: a.offload_optimizer.tier(),
        offload_params: a.offload_params.tier(),
        nvme_dir: a.nvme_dir.clone(),
        io: a.io.config(),
        verify: !a.no_verify,
        adam_threads: a.adam_threads,
        zero_stage: a.zero_stage,
        sequential: a.sequential,
        dropout: a.dropout,
        seed: a.seed,
        vocab_chunk_rows: a.vocab_chunk_rows,
        matmul_inputs: a.matmul_inputs,
    };
    let (mut data, mut seed, mut data_dtype) = (a.data.clone(), a.seed, a.data_dtype);
    if let ModelChoice::Resume(dir) = &model {
        let state = zerostream::train::resume::read_state(dir)?;
        check_resumed_model(a, dir)?;
        let world = a.world_size.or_else(zerostream::comm::launcher_world_size).unwrap_or(1);
        tc = zerostream::train::resume::merge(dir, &state, &tc, explicit, a.seed, world)?;
        seed = state.seed;
        // The built-in text has no path; anything else trained on is a file.
        if data.is_none() {
            data = state.settings.get("data").and_then(|d| d.as_str()).map(PathBuf::from);
        }
        if !explicit.contains("data-dtype") && state.settings.get("data-dtype").and_then(|d| d.as_str()) == Some("u32") {
            data_dtype = TokenWidth::U32;
        }
    }
    if needs_data && data.is_none() && !matches!(model, ModelChoice::Demo | ModelChoice::Resume(_)) {
        bail!("--model/--config need --data FILE (make one with `zerostream prepare`)");
    }
    check_outputs(a, &model, data.as_deref())?;
    let options = RunOptions {
        model,
        data,
        data_dtype,
        val_data: a.val_data.clone(),
        eval_every: a.eval_every,
        eval_batches: a.eval_batches,
        seed,
        metrics: a.metrics.clone(),
        tensorboard: None,
        save: a.save.clone(),
        save_dtype: a.save_dtype,
        checkpoints: CheckpointOptions { dir: a.checkpoint_dir.clone(), every: a.checkpoint_every, keep: a.keep_checkpoints },
        tokenizer: a.tokenizer.as_deref().map(|t| DataTokenizer::parse(t, "--tokenizer")).transpose()?,
        stop: None,
        sample_tokens: a.sample_tokens,
        prompt: a.prompt.replace("\\n", "\n"),
        progress: true,
    };
    Ok((options, tc))
}

/// What the device `--device` names charges for its allocations, for planning before it is opened:
/// the cpu device's costs for `cpu`, a GPU's otherwise (`auto` falls back to the cpu device only where
/// no GPU is found, and the trainer then plans again with the device it opened).
fn planned_costs(choice: DeviceChoice) -> AllocCosts {
    match choice {
        DeviceChoice::Cpu => AllocCosts::CPU,
        DeviceChoice::Gpu | DeviceChoice::Auto => AllocCosts::GPU,
    }
}

/// Refuses before any work a run whose state would not fit in this machine's RAM or on its NVMe
/// directory's disk (`ranks_here` ranks), or whose device budget the chosen device cannot keep.
fn check_host_ram(a: &TrainArgs, options: &RunOptions, tc: &TrainConfig, world: usize, ranks_here: usize) -> Result<()> {
    let config = zerostream::train::run::model_config(&options.model)?;
    let placement = zerostream::train::plan_on(&config, tc, world, planned_costs(a.device.device))?;
    placement.check_host_ram(ranks_here)?;
    match &tc.nvme_dir {
        Some(dir) => placement.check_nvme_room(dir, ranks_here),
        None => Ok(()),
    }
}

/// SIGINT and SIGTERM set the returned flag (the run finishes its step, checkpoints and stops); a
/// second one ends the process at once.
fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    for (signal, code) in [(SIGINT, 130), (SIGTERM, 143)] {
        // Registered first, so it sees the flag before the second handler sets it: the first signal
        // only sets it, the second exits.
        signal_hook::flag::register_conditional_shutdown(signal, code, stop.clone()).context("installing a signal handler")?;
        signal_hook::flag::register(signal, stop.clone()).context("installing a signal handler")?;
    }
    Ok(stop)
}

/// The exit code and message of a run stopped by a signal (rank 0's summary).
fn stopped(summary: &RunSummary) -> i32 {
    let Some(step) = summary.stopped_at else { return 0 };
    match &summary.checkpoint {
        Some(path) => {
            eprintln!("stopped by a signal after step {step}; checkpoint {}; continue with --resume {}", path.display(), path.display())
        }
        None => eprintln!("stopped by a signal after step {step}; no --checkpoint-dir was given, so nothing was saved"),
    }
    130
}

/// CPU cores each of `ranks` ranks on this machine gets for AdamW, unless --adam-threads says.
fn adam_threads_per_rank(requested: usize, ranks: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / ranks.max(1)).max(1)
}

/// `resolved`: every flag's value, as a TOML file, written beside the metrics.
pub fn train(a: TrainArgs, explicit: &BTreeSet<String>, resolved: &str) -> Result<i32> {
    let (mut options, mut tc) = resolve_train(&a, true, explicit)?;
    if let ModelChoice::Resume(dir) = &options.model {
        let state = zerostream::train::resume::read_state(dir)?;
        if zerostream::train::resume::is_finished(&state, &tc) {
            return finished_run(dir, state.step, tc.steps, options.save.as_deref());
        }
    }
    if explicit.is_empty() {
        keep_first_run_files(&mut options)?;
    }
    if let Some(metrics) = &options.metrics {
        crate::cli::config_file::write_resolved(metrics, resolved, a.config_file.as_deref())?;
    }
    if let Some(dir) = &a.tensorboard {
        options.tensorboard = Some(zerostream::train::tensorboard::TensorBoard::prepare(dir, resolved)?);
    }
    options.stop = Some(stop_on_signals()?);
    let devices = a.devices.as_deref().map(RankDevice::parse_list).transpose()?.unwrap_or_default();
    let launched = zerostream::comm::launcher_world_size().unwrap_or(1);
    if launched > 1 {
        if a.world_size.is_some() {
            bail!(
                "--world-size cannot be combined with an MPI launch of {launched} processes: under mpirun the world size is mpirun's -n; \
                 leave --world-size out"
            );
        }
        return train_mpi(&a, &devices, &options, tc);
    }
    let world = a.world_size.unwrap_or(1);
    check_host_ram(&a, &options, &tc, world, world)?;
    if world == 1 && devices.len() > 1 {
        bail!("--devices lists {} devices but --world-size is 1: add --world-size {}", devices.len(), devices.len());
    }
    if world == 1 {
        let which = devices.first().cloned().unwrap_or(RankDevice::Default);
        let dev = which.open(a.device.device, a.device.adapter.as_deref(), a.gpu_mem_budget)?;
        let summary = zerostream::train::run::run_on(&dev, &options, tc)?;
        return Ok(stopped(&summary));
    }
    tc.adam_threads = adam_threads_per_rank(tc.adam_threads, world);
    let summaries =
        zerostream::train::ranks::train_in_process(world, &devices, a.device.device, a.device.adapter.as_deref(), &options, tc)?;
    Ok(summaries.first().map_or(0, stopped))
}

/// A resumed run whose checkpoint is at `--steps` already (a preemption loop re-running its command
/// after the last save, say): nothing to train, so it ends at once with success, after writing
/// `--save` from the checkpoint's model if that is asked for and missing (rank 0 only under mpirun).
fn finished_run(dir: &Path, step: u64, steps: u64, save: Option<&Path>) -> Result<i32> {
    eprintln!(
        "train: the checkpoint {} is at step {step} and --steps is {steps} (counted from the start of training): nothing left to train",
        dir.display()
    );
    let rank0 = ["OMPI_COMM_WORLD_RANK", "PMI_RANK"].iter().find_map(|v| std::env::var(v).ok()).is_none_or(|r| r.trim() == "0");
    let Some(save) = save.filter(|_| rank0) else { return Ok(0) };
    if save.exists() {
        eprintln!("train: --save {} exists already; left as it is", save.display());
        return Ok(0);
    }
    // The checkpoint is a model directory plus the optimizer's and trainer's state: copy the model's
    // files aside, then rename them into place (a crash leaves no half-written --save).
    let partial = save.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).with_context(|| format!("removing the leftover {}", partial.display()))?;
    }
    std::fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let state_file = name.starts_with("optimizer.rank") || name == zerostream_checkpoints::checkpoint::STATE_FILE;
        if path.is_file() && !state_file {
            std::fs::copy(&path, partial.join(&name)).with_context(|| format!("copying {} into {}", path.display(), partial.display()))?;
        }
    }
    std::fs::rename(&partial, save).with_context(|| format!("renaming {} to {}", partial.display(), save.display()))?;
    eprintln!("train: saved the checkpoint's model to {}", save.display());
    Ok(0)
}

#[cfg(not(feature = "mpi"))]
fn train_mpi(_: &TrainArgs, _: &[RankDevice], _: &RunOptions, _: TrainConfig) -> Result<i32> {
    let n = zerostream::comm::launcher_world_size().unwrap_or(1);
    bail!(
        "started by mpirun as one of {n} processes, but this zerostream was built without MPI support: \
         rebuild with `cargo build --release --features zerostream/mpi` (needs OpenMPI and libclang), \
         or run one process with --world-size N for ranks on this machine"
    )
}

#[cfg(feature = "mpi")]
fn train_mpi(a: &TrainArgs, devices: &[RankDevice], options: &RunOptions, mut tc: TrainConfig) -> Result<i32> {
    use zerostream::comm::{Comm, mpi::MpiWorld};
    let mpi = MpiWorld::init().context("initialising MPI")?;
    let (rank, local_rank) = (mpi.rank(), mpi.node_local_rank());
    if let Err(e) = check_host_ram(a, options, &tc, mpi.size(), mpi.node_local_size()) {
        mpi.abort(&format!("rank {rank}: {e:#}"));
    }
    tc.adam_threads = adam_threads_per_rank(tc.adam_threads, mpi.node_local_size());
    let which = match devices.get(local_rank) {
        Some(d) => d.clone(),
        None if !devices.is_empty() => {
            bail!("--devices lists {} devices, but this node runs at least {} ranks", devices.len(), local_rank + 1)
        }
        None => zerostream::train::ranks::default_device_for_local_rank(local_rank, a.device.device, a.device.adapter.as_deref()),
    };
    let comm = Comm::new(Box::new(mpi.comm()));
    let opened = which.open(a.device.device, a.device.adapter.as_deref(), a.gpu_mem_budget);
    let result = opened.and_then(|dev| zerostream::train::run::run_rank_on(&dev, options, tc, comm));
    match result {
        Ok(summary) => Ok(if rank == 0 { stopped(&summary) } else { i32::from(summary.stopped_at.is_some()) * 130 }),
        // Stop every rank now rather than leave them waiting in a collective.
        Err(e) => mpi.abort(&format!("rank {rank}: {e:#}")),
    }
}

pub fn plan(a: TrainArgs, explicit: &BTreeSet<String>) -> Result<()> {
    let (options, tc) = resolve_train(&a, false, explicit)?;
    let world = a.world_size.or_else(zerostream::comm::launcher_world_size).unwrap_or(1).max(1);
    let config = zerostream::train::run::model_config(&options.model)?;
    let placement = zerostream::train::plan_on(&config, &tc, world, planned_costs(a.device.device))?;
    println!("{}", placement.describe());
    println!("{}", placement.host_summary());
    Ok(())
}
