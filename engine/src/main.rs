//! The `zerostream` command line: `devices`, `eval`, `bench`. Each subcommand's flags are resolved and
//! checked here, then handed to the library.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use zerostream::bench::{AdamBenchConfig, HalfOrFull, Link};
use zerostream::bench_io::{self, IoBenchConfig};
use zerostream::bench_kernels::KernelBenchConfig;
use zerostream::device::GpuDevice;
use zerostream::device::{self, DeviceChoice};
use zerostream::train::ranks::RankDevice;
use zerostream::train::run::{ModelChoice, RunOptions};
use zerostream::train::{LrPlan, LrSchedule, Precision, TrainConfig, ZeroStage};
use zerostream_checkpoints::{Tokenizer, write_token_file};
use zerostream_offload::{IoConfig, IoEngineKind, Tier};

#[derive(Parser)]
#[command(name = "zerostream", version, about = "Train models larger than GPU memory: ZeRO-style offload with WGSL kernels on any GPU.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct DeviceArgs {
    /// Where to compute: `auto` takes a real GPU if there is one, else the cpu device; `gpu` takes a
    /// wgpu adapter (software ones such as lavapipe too); `cpu` runs the plain-Rust kernels.
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceChoice,
    /// Which wgpu adapter: its index or part of its name, as `zerostream devices` lists them.
    #[arg(long)]
    adapter: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// List the GPU adapters wgpu finds, with the limits and features zerostream uses.
    Devices {
        /// Print one JSON object per adapter instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Mean loss of a model over the first micro-batches of a token file; prints one JSON line.
    Eval {
        /// A Hugging Face GPT-2 directory: config.json and model.safetensors (or sharded with an index).
        #[arg(long)]
        model: PathBuf,
        /// Token file: llm.c's format (header with magic 20240520) or raw little-endian uint16.
        #[arg(long)]
        data: PathBuf,
        /// B: sequences per micro-batch.
        #[arg(long, default_value_t = 4)]
        batch_size: usize,
        /// T: tokens per sequence (at most the model's n_positions).
        #[arg(long, default_value_t = 64)]
        seq_len: usize,
        /// N: how many micro-batches, from the start of the file (wrapping around).
        #[arg(long, default_value_t = 1)]
        batches: usize,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// Train a GPT-2 with parameters streamed to the device and AdamW on the CPU. With no --model,
    /// --config or --data: a small byte-level GPT-2 on Shakespeare's Hamlet (built in), a few minutes.
    Train(Box<TrainArgs>),
    /// Does it fit? The placement `train` would use with the same flags — host bytes per rank on each
    /// tier, device bytes, block slots — for a model, a batch, a world size and a ZeRO stage, without
    /// loading weights or training. Exits non-zero, with the numbers, when the device budget is too small.
    Plan(Box<TrainArgs>),
    /// Tokenise a text file into a token file `train --data` reads (llm.c's format).
    Prepare {
        /// UTF-8 text to tokenise.
        #[arg(long)]
        text: PathBuf,
        /// Token file to write.
        #[arg(long)]
        out: PathBuf,
        /// `gpt2`: GPT-2's BPE (50257 tokens); `bytes`: one token per byte (256).
        #[arg(long, value_enum, default_value = "gpt2")]
        tokenizer: Tokenizer,
    },
    /// Measure one link of the offload path against its ceiling.
    #[command(subcommand)]
    Bench(BenchCommand),
}

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
struct IoArgs {
    /// How NVMe files are read and written: io_uring, a pread/pwrite thread pool, or mmap.
    #[arg(long, default_value = "uring")]
    io_engine: IoEngineKind,
    /// Bytes per NVMe request (a multiple of 4KiB).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    block_size: u64,
    /// NVMe requests in flight.
    #[arg(long, default_value_t = 32)]
    queue_depth: usize,
    /// Use the page cache instead of O_DIRECT.
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

fn parse_size(text: &str) -> Result<u64, String> {
    device::parse_bytes(text).map_err(|e| e.to_string())
}

#[derive(clap::Args)]
struct TrainArgs {
    /// A Hugging Face GPT-2 directory to start from (config.json + model.safetensors, or sharded).
    #[arg(long, conflicts_with = "config")]
    model: Option<PathBuf>,
    /// Start from random weights: a preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or a config.json.
    #[arg(long)]
    config: Option<String>,
    /// Token file (llm.c's format or raw uint16; see `zerostream prepare`). Default: the built-in Hamlet text.
    #[arg(long)]
    data: Option<PathBuf>,
    /// B: sequences per micro-batch.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// T: tokens per sequence (at most the model's n_positions).
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    /// Micro-batches per optimizer step (gradients accumulate in host RAM).
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
    /// Where fp32 master weights and Adam moments live.
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
    /// Save the trained model as a Hugging Face directory.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Seed of the random initialisation (with --config or the built-in model) and of the sample.
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Tokens of text to sample at the end (0 = none).
    #[arg(long, default_value_t = 300)]
    sample_tokens: usize,
    /// Text the sample continues.
    #[arg(long, default_value = "HAMLET\n")]
    prompt: String,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// CPU AdamW throughput, and the machine's memory bandwidth (STREAM triad) in the same run.
    Adam {
        /// Parameters in the shard.
        #[arg(long, default_value_t = 64 << 20)]
        params: usize,
        /// CPU threads (0 = one per core).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Precision of the gradients the update reads.
        #[arg(long, value_enum, default_value = "bf16")]
        grad: HalfOrFull,
        /// Precision of the parameter copy written for the GPU (`f32` = no copy).
        #[arg(long, value_enum, default_value = "bf16")]
        copy: HalfOrFull,
        /// Timed steps; the best is reported.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// NVMe tier: sequential O_DIRECT write then read of a file, per I/O engine, block size and queue
    /// depth; prints the best configuration (ready for `train`).
    Io {
        /// Directory on the drive to measure (a file is written there and removed).
        #[arg(long)]
        dir: PathBuf,
        /// Bytes written then read per configuration.
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        size: u64,
        /// Block sizes to try, comma-separated.
        #[arg(long, default_value = "256KiB,1MiB,8MiB", value_delimiter = ',', value_parser = parse_size)]
        block_size: Vec<u64>,
        /// Queue depths to try, comma-separated.
        #[arg(long, default_value = "8,32,128", value_delimiter = ',')]
        queue_depth: Vec<usize>,
        /// I/O engines to try, comma-separated: uring, pread, mmap.
        #[arg(long, default_value = "uring", value_delimiter = ',')]
        io_engine: Vec<IoEngineKind>,
        /// Use the page cache instead of O_DIRECT.
        #[arg(long)]
        buffered: bool,
        /// Also run fio (--direct=1 --ioengine=io_uring --bs=1M --iodepth=32) on the same size, if installed.
        #[arg(long)]
        fio: bool,
        /// Draw bandwidth against block size and queue depth into this SVG file.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Host-to-device throughput through wgpu: queue.write_buffer and a ring of mapped staging buffers.
    H2d(TransferArgs),
    /// Device-to-host throughput through wgpu: one mapped read-back buffer and a ring of them.
    D2h(TransferArgs),
    /// All-gather and reduce-scatter GB/s per rank through the trainer's collectives: in-process ranks
    /// beside a memcpy ceiling, or under mpirun (built with the mpi feature) beside MPI's own
    /// MPI_Allgather and MPI_Reduce_scatter_block on the same sizes.
    Collectives {
        /// In-process ranks (ignored under mpirun, where the world is mpirun's -n).
        #[arg(long, default_value_t = 2)]
        world_size: usize,
        /// Bytes of each rank's slice, comma-separated.
        #[arg(long, default_value = "1MiB,16MiB,64MiB", value_delimiter = ',', value_parser = parse_size)]
        sizes: Vec<u64>,
        /// Timed repetitions per size; the best is reported.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Every kernel of a GPT-2 training step on the GPU, at the shapes of GPT-2 124M and 1.5B: GFLOP/s
    /// (matmul, attention) or GB/s (the rest) beside the adapter's peak and a measured device copy.
    Kernels(KernelArgs),
    /// Every link — RAM bandwidth, CPU AdamW, NVMe write and read, h2d, d2h — in one table beside its ceiling.
    All {
        /// Directory for the NVMe measurement (default: the current directory).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Bytes for the NVMe measurement.
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        size: u64,
        /// Parameters for the AdamW measurement.
        #[arg(long, default_value_t = 64 << 20)]
        params: usize,
        /// Which wgpu adapter (index or part of its name).
        #[arg(long)]
        adapter: Option<String>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct TransferArgs {
    /// Transfer sizes, comma-separated.
    #[arg(long, default_value = "1MiB,4MiB,16MiB,64MiB,256MiB", value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Repetitions per size and method; the best is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Which wgpu adapter (index or part of its name).
    #[arg(long)]
    adapter: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct KernelArgs {
    /// Model shapes, comma-separated: gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl (1.5B), or tiny.
    #[arg(long, default_value = "gpt2,gpt2-xl", value_delimiter = ',')]
    models: Vec<String>,
    /// B: sequences per micro-batch.
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    /// T: tokens per sequence (at most 1024, the presets' n_positions).
    #[arg(long, default_value_t = 1024)]
    seq_len: usize,
    /// Timed repetitions per kernel, after one warm-up; the median is reported (0 = as many as fill
    /// about 0.2 s, between 3 and 200).
    #[arg(long, default_value_t = 0)]
    reps: usize,
    /// Only kernels whose name contains one of these, comma-separated (e.g. matmul,attention).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Bytes of the device-to-device copy that measures the memory ceiling.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    copy_size: u64,
    /// Tiny shapes (a 2-layer, 128-wide model, B=2, T=64), 2 repetitions and a 16 MiB copy: seconds on
    /// a software adapter such as lavapipe. Replaces --models, --batch-size, --seq-len, --reps, --copy-size.
    #[arg(long)]
    quick: bool,
    /// Time with the host clock around each repetition's submit-and-wait even where the adapter has
    /// GPU timestamp queries (to cross-check them; includes submission latency).
    #[arg(long)]
    wall_clock: bool,
    /// Which wgpu adapter (index or part of its name).
    #[arg(long)]
    adapter: Option<String>,
    /// Print one JSON object per kernel and shape (and one per model with its step's kernel time).
    #[arg(long)]
    json: bool,
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Devices { json } => {
            let adapters = device::gpu::list_adapters();
            if json {
                for a in &adapters {
                    println!(
                        "{}",
                        serde_json::json!({
                            "index": a.index, "name": a.name, "backend": a.backend,
                            "type": format!("{:?}", a.device_type), "driver": a.driver,
                            "max_storage_binding_bytes": a.max_storage_binding_bytes,
                            "max_buffer_bytes": a.max_buffer_bytes,
                            "max_workgroup_storage_bytes": a.max_workgroup_storage_bytes,
                            "max_invocations_per_workgroup": a.max_invocations_per_workgroup,
                            "shader_f16": a.shader_f16, "timestamp_query": a.timestamp_query, "subgroup": a.subgroup,
                        })
                    );
                }
                return Ok(());
            }
            if adapters.is_empty() {
                println!("no GPU adapters found; `--device auto` will use the cpu device");
            }
            for a in &adapters {
                println!("[{}] {} ({}, {:?}) driver: {}", a.index, a.name, a.backend, a.device_type, a.driver);
                println!(
                    "    max storage binding {} MiB, max buffer {} MiB, workgroup storage {} KiB, {} invocations/workgroup",
                    a.max_storage_binding_bytes >> 20,
                    a.max_buffer_bytes >> 20,
                    a.max_workgroup_storage_bytes >> 10,
                    a.max_invocations_per_workgroup
                );
                println!("    shader-f16: {}, timestamp-query: {}, subgroup: {}", a.shader_f16, a.timestamp_query, a.subgroup);
            }
            println!("cpu: the plain-Rust kernels on {} threads (--device cpu)", rayon::current_num_threads());
            Ok(())
        }
        Command::Eval { model, data, batch_size, seq_len, batches, device } => {
            let dev = device::open(device.device, device.adapter.as_deref(), None)?;
            eprintln!("device: {}", dev.describe());
            let report = zerostream::eval::evaluate_on(&dev, &model, &data, batch_size, seq_len, batches)?;
            println!("{}", report.to_json(&dev.describe()));
            Ok(())
        }
        Command::Train(args) => train(*args),
        Command::Plan(args) => plan(*args),
        Command::Bench(BenchCommand::Io { dir, size, block_size, queue_depth, io_engine, buffered, fio, plot, json }) => {
            let cfg = IoBenchConfig {
                dir: dir.clone(),
                size_bytes: size,
                block_sizes: block_size,
                queue_depths: queue_depth,
                engines: io_engine,
                direct: !buffered,
            };
            let runs = bench_io::bench_io(&cfg, |r| {
                if !json {
                    println!(
                        "{:>5} block {:>8} qd {:>4}{}: write {:6.2} GB/s, read {:6.2} GB/s",
                        r.engine.name(),
                        human_bytes(r.block_bytes),
                        r.queue_depth,
                        if r.direct { "" } else { " (buffered)" },
                        r.write_gbps,
                        r.read_gbps
                    );
                }
            })?;
            let best = bench_io::best(&runs).context("no configuration ran")?;
            let fio_gbps = if fio { bench_io::fio(&dir, size, 1 << 20, 32)? } else { None };
            if fio && fio_gbps.is_none() {
                eprintln!("fio is not installed: no comparison (apt-get install fio)");
            }
            if let Some(path) = &plot {
                bench_io::plot(&runs, path)?;
                eprintln!("plot: {}", path.display());
            }
            if json {
                let mut out = serde_json::json!({ "best": best.to_json(), "runs": runs.iter().map(|r| r.to_json()).collect::<Vec<_>>(), "size": size });
                if let Some((w, r)) = fio_gbps {
                    out["fio"] = serde_json::json!({ "write_gbps": w, "read_gbps": r, "bs": 1 << 20, "iodepth": 32 });
                }
                println!("{out}");
            } else {
                println!(
                    "best: --io-engine {} --block-size {} --queue-depth {} (write {:.2} GB/s, read {:.2} GB/s)",
                    best.engine.name(),
                    human_bytes(best.block_bytes),
                    best.queue_depth,
                    best.write_gbps,
                    best.read_gbps
                );
                if let Some((w, r)) = fio_gbps {
                    println!(
                        "fio (bs 1MiB, iodepth 32): write {w:.2} GB/s, read {r:.2} GB/s; best above is {:.0}% / {:.0}% of it",
                        100.0 * best.write_gbps / w,
                        100.0 * best.read_gbps / r
                    );
                }
            }
            Ok(())
        }
        Command::Bench(BenchCommand::H2d(t)) => transfer_command(t, Link::HostToDevice),
        Command::Bench(BenchCommand::D2h(t)) => transfer_command(t, Link::DeviceToHost),
        Command::Bench(BenchCommand::Collectives { world_size, sizes, reps, json }) => bench_collectives(world_size, &sizes, reps, json),
        Command::Bench(BenchCommand::Kernels(k)) => kernels_command(k),
        Command::Bench(BenchCommand::All { dir, size, params, adapter, json }) => bench_all(&dir, size, params, adapter.as_deref(), json),
        Command::Prepare { text, out, tokenizer } => {
            let content = std::fs::read_to_string(&text).with_context(|| format!("reading --text {}", text.display()))?;
            let tokens = tokenizer.encode(&content)?;
            write_token_file(&out, &tokens)?;
            eprintln!(
                "{}: {} bytes of text -> {} tokens ({tokenizer:?}, vocab {})",
                out.display(),
                content.len(),
                tokens.len(),
                tokenizer.vocab_size()
            );
            Ok(())
        }
        Command::Bench(BenchCommand::Adam { params, threads, grad, copy, reps, json }) => {
            let r = zerostream::bench::bench_adam(&AdamBenchConfig { params, threads, grad, copy, reps })?;
            if json {
                println!("{}", r.to_json());
            } else {
                println!(
                    "adam: {} params, {:?} grads, {:?} copy, {} threads ({}): {:.2} Gparam/s, {} B/param = {:.1} GB/s; triad {:.1} GB/s; {:.0}% of triad",
                    r.params,
                    r.grad,
                    r.copy,
                    r.threads,
                    r.isa,
                    r.gparams_per_s,
                    r.bytes_per_param,
                    r.adam_gbps,
                    r.triad_gbps,
                    100.0 * r.fraction_of_triad()
                );
            }
            Ok(())
        }
    }
}

/// The run `train` would make of these flags: what to load and do, and the training configuration.
/// `plan` needs no data (`needs_data` false).
fn resolve_train(a: &TrainArgs, needs_data: bool) -> Result<(RunOptions, TrainConfig)> {
    if (a.offload_optimizer == OffloadTarget::Nvme || a.offload_params == OffloadTarget::Nvme) && a.nvme_dir.is_none() {
        bail!("--offload-optimizer nvme and --offload-params nvme need --nvme-dir DIR");
    }
    if a.steps == 0 {
        bail!("--steps must be at least 1");
    }
    check_hyperparameters(a)?;
    check_outputs(a)?;
    let model = match (&a.model, &a.config) {
        (Some(dir), _) => ModelChoice::Hf(dir.clone()),
        (None, Some(spec)) => ModelChoice::Config(spec.clone()),
        (None, None) if a.data.is_none() || !needs_data => ModelChoice::Demo,
        (None, None) => bail!("--data needs a model: --model DIR or --config PRESET|FILE"),
    };
    if needs_data && a.data.is_none() && !matches!(model, ModelChoice::Demo) {
        bail!("--model/--config need --data FILE (make one with `zerostream prepare`)");
    }
    let tc = TrainConfig {
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
    };
    let options = RunOptions {
        model,
        data: a.data.clone(),
        seed: a.seed,
        metrics: a.metrics.clone(),
        save: a.save.clone(),
        sample_tokens: a.sample_tokens,
        prompt: a.prompt.replace("\\n", "\n"),
        progress: true,
    };
    Ok((options, tc))
}

/// Refuses optimizer settings that cannot train: each named with the range it must lie in.
fn check_hyperparameters(a: &TrainArgs) -> Result<()> {
    let checks: [(&str, f64, fn(f64) -> bool, &str); 7] = [
        ("--lr", a.lr, |x| x > 0.0, "a finite number > 0"),
        ("--min-lr", a.min_lr, |x| x >= 0.0, "a finite number >= 0"),
        ("--beta1", a.beta1, |x| (0.0..1.0).contains(&x), "in [0, 1)"),
        ("--beta2", a.beta2, |x| (0.0..1.0).contains(&x), "in [0, 1)"),
        ("--eps", a.eps, |x| x > 0.0, "a finite number > 0"),
        ("--weight-decay", a.weight_decay, |x| x >= 0.0, "a finite number >= 0"),
        ("--grad-clip", a.grad_clip, |x| x >= 0.0, "a finite number >= 0 (0 = no clipping)"),
    ];
    for (flag, value, ok, range) in checks {
        if !value.is_finite() || !ok(value) {
            bail!("{flag} {value}: must be {range}");
        }
    }
    Ok(())
}

/// Refuses a `--metrics` file that is one of the run's inputs (it would be truncated), before any work.
fn check_outputs(a: &TrainArgs) -> Result<()> {
    let Some(metrics) = &a.metrics else { return Ok(()) };
    let mut inputs: Vec<PathBuf> = a.data.iter().cloned().collect();
    if let Some(dir) = &a.model {
        inputs.extend(std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()));
    }
    let same = |p: &PathBuf| match (std::fs::canonicalize(p), std::fs::canonicalize(metrics)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    };
    if let Some(input) = inputs.iter().find(|p| same(p)) {
        bail!(
            "--metrics {} is the same file as the input {}: it would be overwritten; choose another path",
            metrics.display(),
            input.display()
        );
    }
    Ok(())
}

/// CPU cores each of `ranks` ranks on this machine gets for AdamW, unless --adam-threads says.
fn adam_threads_per_rank(requested: usize, ranks: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / ranks.max(1)).max(1)
}

fn train(a: TrainArgs) -> Result<()> {
    let (options, mut tc) = resolve_train(&a, true)?;
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
    if world == 1 && devices.len() > 1 {
        bail!("--devices lists {} devices but --world-size is 1: add --world-size {}", devices.len(), devices.len());
    }
    if world == 1 {
        let which = devices.first().cloned().unwrap_or(RankDevice::Default);
        let dev = which.open(a.device.device, a.device.adapter.as_deref(), a.gpu_mem_budget)?;
        zerostream::train::run::run_on(&dev, &options, tc)?;
        return Ok(());
    }
    tc.adam_threads = adam_threads_per_rank(tc.adam_threads, world);
    zerostream::train::ranks::train_in_process(world, &devices, a.device.device, a.device.adapter.as_deref(), &options, tc)?;
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn train_mpi(_: &TrainArgs, _: &[RankDevice], _: &RunOptions, _: TrainConfig) -> Result<()> {
    let n = zerostream::comm::launcher_world_size().unwrap_or(1);
    bail!(
        "started by mpirun as one of {n} processes, but this zerostream was built without MPI support: \
         rebuild with `cargo build --release --features zerostream/mpi` (needs OpenMPI and libclang), \
         or run one process with --world-size N for ranks on this machine"
    )
}

#[cfg(feature = "mpi")]
fn train_mpi(a: &TrainArgs, devices: &[RankDevice], options: &RunOptions, mut tc: TrainConfig) -> Result<()> {
    use zerostream::comm::{Comm, mpi::MpiWorld};
    let mpi = MpiWorld::init().context("initialising MPI")?;
    let (rank, local_rank) = (mpi.rank(), mpi.node_local_rank());
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
    if let Err(e) = result {
        // Stop every rank now rather than leave them waiting in a collective.
        mpi.abort(&format!("rank {rank}: {e:#}"));
    }
    Ok(())
}

fn plan(a: TrainArgs) -> Result<()> {
    let (options, tc) = resolve_train(&a, false)?;
    let world = a.world_size.or_else(zerostream::comm::launcher_world_size).unwrap_or(1).max(1);
    let config = zerostream::train::run::model_config(&options.model)?;
    let placement = zerostream::train::plan(&config, &tc, world)?;
    println!("{}", placement.describe());
    println!("{}", placement.host_summary());
    Ok(())
}

fn bench_collectives(world_size: usize, sizes: &[u64], reps: usize, json: bool) -> Result<()> {
    use zerostream::bench_comm::{CollectiveRun, bench_collectives};
    let launched = zerostream::comm::launcher_world_size().unwrap_or(1);
    let (runs, transport): (Vec<CollectiveRun>, String) = if launched > 1 {
        mpi_bench_collectives(sizes, reps)?
    } else {
        let all = zerostream::train::ranks::in_process(world_size, |comm| {
            let t = comm.describe();
            Ok((bench_collectives(&comm, sizes, reps, |_, _| Ok(Vec::new()))?, t))
        })?;
        all.into_iter().next().expect("rank 0")
    };
    if runs.is_empty() {
        return Ok(()); // not rank 0 under MPI
    }
    let memcpy = zerostream::bench::memcpy_gbps(sizes.iter().copied().max().unwrap_or(1 << 20) as usize, 3);
    if json {
        println!(
            "{}",
            serde_json::json!({ "transport": transport, "memcpy_gbps": memcpy, "runs": runs.iter().map(|r| r.to_json()).collect::<Vec<_>>() })
        );
        return Ok(());
    }
    println!("collectives: {transport}; GB/s per rank = bytes a rank receives from the others / time");
    for r in &runs {
        println!("{:<20} slice {:>8}: {:8.3} ms  {:7.2} GB/s per rank", r.op, human_bytes(r.slice_bytes), 1e3 * r.seconds, r.gbps_per_rank);
    }
    println!("ceiling: host memcpy (one thread) {memcpy:.2} GB/s");
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn mpi_bench_collectives(_: &[u64], _: usize) -> Result<(Vec<zerostream::bench_comm::CollectiveRun>, String)> {
    bail!("started by mpirun, but this zerostream was built without MPI support: rebuild with `--features zerostream/mpi`")
}

/// This process's part of `bench collectives` under mpirun; rank 0 gets the rows, the others none.
#[cfg(feature = "mpi")]
fn mpi_bench_collectives(sizes: &[u64], reps: usize) -> Result<(Vec<zerostream::bench_comm::CollectiveRun>, String)> {
    use zerostream::comm::{Comm, mpi::MpiWorld};
    let mpi = MpiWorld::init().context("initialising MPI")?;
    let raw = mpi.comm();
    let comm = Comm::new(Box::new(mpi.comm()));
    let runs = zerostream::bench_comm::bench_collectives(&comm, sizes, reps, |n, reps| {
        zerostream::bench_comm::mpi_reference(&comm, &raw, n, reps)
    })?;
    let transport = comm.describe();
    Ok((if comm.rank() == 0 { runs } else { Vec::new() }, transport))
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{}GiB", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}

fn transfer_command(t: TransferArgs, link: Link) -> Result<()> {
    let dev = GpuDevice::open(t.adapter.as_deref(), None)?;
    if !t.json {
        println!("device: {}", zerostream::device::Backend::describe(&dev));
    }
    let runs = zerostream::bench::bench_transfer(&dev, link, &t.sizes, t.reps, |r| {
        if !t.json {
            println!("{:>8} {:>12}: {:6.2} GB/s", human_bytes(r.bytes), format!("{:?}", r.method), r.gbps);
        }
    })?;
    let ceiling = zerostream::bench::memcpy_gbps(256 << 20, 3);
    if t.json {
        println!("{}", serde_json::json!({ "runs": runs.iter().map(|r| r.to_json()).collect::<Vec<_>>(), "memcpy_gbps": ceiling }));
    } else {
        println!("host memcpy (one thread): {ceiling:.2} GB/s");
    }
    Ok(())
}

fn kernels_command(k: KernelArgs) -> Result<()> {
    let cfg = if k.quick {
        KernelBenchConfig { only: k.only, wall_clock: k.wall_clock, ..KernelBenchConfig::quick() }
    } else {
        KernelBenchConfig {
            models: k.models,
            batch: k.batch_size,
            seq_len: k.seq_len,
            reps: k.reps,
            only: k.only,
            copy_bytes: k.copy_size,
            wall_clock: k.wall_clock,
        }
    };
    let dev = GpuDevice::open(k.adapter.as_deref(), None)?;
    eprintln!(
        "bench kernels: {} (B={}, T={}, models {})",
        zerostream::device::Backend::describe(&dev),
        cfg.batch,
        cfg.seq_len,
        cfg.models.join(",")
    );
    let report = zerostream::bench_kernels::bench_kernels(&dev, &cfg, |r| {
        eprintln!("  {} {} {} {} {}: {:.1} us", r.model, r.kernel, r.case, r.precision, r.shape, r.seconds * 1e6)
    })?;
    if k.json {
        for r in &report.runs {
            println!("{}", report.run_json(r));
        }
        for s in &report.steps {
            println!("{}", report.step_json(s));
        }
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

fn bench_all(dir: &std::path::Path, size: u64, params: usize, adapter: Option<&str>, json: bool) -> Result<()> {
    let mut rows: Vec<(String, f64, String, f64)> = Vec::new(); // link, GB/s, ceiling name, ceiling GB/s
    let adam =
        zerostream::bench::bench_adam(&AdamBenchConfig { params, threads: 0, grad: HalfOrFull::Bf16, copy: HalfOrFull::Bf16, reps: 3 })?;
    rows.push(("RAM (STREAM triad)".into(), adam.triad_gbps, "triad".into(), adam.triad_gbps));
    rows.push((
        format!("CPU AdamW ({:.2} Gparam/s, {} B/param)", adam.gparams_per_s, adam.bytes_per_param),
        adam.adam_gbps,
        "triad".into(),
        adam.triad_gbps,
    ));
    let io_cfg = IoBenchConfig {
        dir: dir.to_path_buf(),
        size_bytes: size,
        block_sizes: vec![1 << 20],
        queue_depths: vec![32],
        engines: vec![IoEngineKind::Uring],
        direct: true,
    };
    let io = bench_io::bench_io(&io_cfg, |_| {})?;
    let fio = bench_io::fio(dir, size, 1 << 20, 32)?;
    let (fio_name, fio_w, fio_r) = match fio {
        Some((w, r)) => ("fio".to_string(), w, r),
        None => ("fio not installed".to_string(), f64::NAN, f64::NAN),
    };
    let direct = if io[0].direct { "" } else { ", buffered: O_DIRECT refused" };
    rows.push((format!("NVMe write ({}{direct})", dir.display()), io[0].write_gbps, fio_name.clone(), fio_w));
    rows.push((format!("NVMe read ({}{direct})", dir.display()), io[0].read_gbps, fio_name, fio_r));
    match GpuDevice::open(adapter, None) {
        Ok(dev) => {
            let memcpy = zerostream::bench::memcpy_gbps(256 << 20, 3);
            for link in [Link::HostToDevice, Link::DeviceToHost] {
                let runs = zerostream::bench::bench_transfer(&dev, link, &[256 << 20], 2, |_| {})?;
                let best = runs.iter().max_by(|a, b| a.gbps.total_cmp(&b.gbps)).expect("two methods ran");
                let name = if link == Link::HostToDevice { "h2d" } else { "d2h" };
                rows.push((
                    format!("{name} 256MiB {:?} ({})", best.method, zerostream::device::Backend::describe(&dev)),
                    best.gbps,
                    "host memcpy".into(),
                    memcpy,
                ));
            }
        }
        Err(e) => eprintln!("no GPU adapter, h2d and d2h not measured: {e:#}"),
    }
    if json {
        let out: Vec<_> =
            rows.iter().map(|(l, g, c, cg)| serde_json::json!({ "link": l, "gbps": g, "ceiling": c, "ceiling_gbps": cg })).collect();
        println!("{}", serde_json::json!({ "links": out }));
    } else {
        println!("{:<60} {:>9} {:>9}  ceiling", "link", "GB/s", "ceiling");
        for (l, g, c, cg) in &rows {
            println!("{l:<60} {g:>9.2} {cg:>9.2}  {c} ({:.0}%)", 100.0 * g / cg);
        }
    }
    Ok(())
}
