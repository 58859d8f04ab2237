//! `zerostream bench ...`: each link of the offload path (AdamW, NVMe, h2d, d2h, collectives, kernels)
//! measured beside its ceiling.

use std::path::PathBuf;

use anyhow::Result;
use zerostream::bench::adam::{AdamBenchConfig, HalfOrFull};
use zerostream::bench::kernels::KernelBenchConfig;
use zerostream::bench::transfer::Link;
use zerostream::comm::compress::GradCompression;
use zerostream::device::GpuDevice;
use zerostream::train::{AdamState, Optimizer};
use zerostream::words::exact_size;

use crate::{parse_grad_compression, parse_size, positive_count};

mod all;
mod collectives;
mod drive;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// CPU update throughput (AdamW, LAMB or LARS), and the machine's memory bandwidth (STREAM triad) in
    /// the same run.
    Adam {
        /// Parameters in the shard.
        #[arg(long, default_value_t = 64 << 20)]
        params: usize,
        /// CPU threads (0 = one per core).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Precision of the gradients the update reads. Default: bf16 for adamw, f32 for lamb and lars
        /// (which read only f32).
        #[arg(long, value_enum)]
        grad: Option<HalfOrFull>,
        /// Precision of the parameter copy written for the GPU (`f32` = no copy).
        #[arg(long, value_enum, default_value = "bf16")]
        copy: HalfOrFull,
        /// The moments' format, as `train --adam-state` takes it (bf16: 4 bytes per parameter fewer
        /// moved, plus the widening and the stochastic rounding's noise to compute).
        #[arg(long, value_enum, default_value = "fp32")]
        adam_state: AdamState,
        /// The update rule, as `train --optimizer` takes it: adamw, or lamb and lars (two passes per
        /// step: the norms, then the step; f32 gradients).
        #[arg(long, value_enum, default_value = "adamw")]
        optimizer: Optimizer,
        /// Timed steps; the best is reported.
        #[arg(long, default_value_t = 5, value_parser = positive_count())]
        reps: usize,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// NVMe tier: sequential O_DIRECT write then read of a file, per I/O engine, block size and queue
    /// depth; prints the best configuration (ready for `train`).
    Io(drive::IoArgs),
    /// Host-to-device throughput through wgpu: queue.write_buffer, wgpu's staging memory filled by several threads, the device's upload ring with wgpu's mapped staging buffers (StagingRing) and with host memory the GPU's copy engine reads (HostRing, Vulkan only; training uses whichever `zerostream tune` found faster, else StagingRing), the device's copy from pinned host memory filled before the clock (Pinned, Vulkan only: how training uploads the working copies it keeps in RAM, which the update writes there), and the device's copy alone from wgpu's staging memory filled before the clock (Prestaged: on a discrete GPU that memory may be VRAM, so this can exceed the link).
    H2d(TransferArgs),
    /// Device-to-host throughput through wgpu: one mapped read-back buffer copied out on several threads (Direct), a ring of them (StagingRing), one whose bytes are read where they land (InPlace: how training adds gradients into the accumulator straight out of the mapping), and one into pinned host memory mapped for good (Pinned, Vulkan only: how training reads where `zerostream tune` chose pinned read-backs).
    D2h(TransferArgs),
    /// Whether copies run while kernels do on wgpu's one queue: for each way of uploading, and for the
    /// trainer's gradient download, the copy alone, a run of matmuls of about its length alone, and the
    /// matmuls submitted first with the copy issued behind them (the trainer's order); `hidden` is the
    /// share of the shorter part the pair saved (1: fully overlapped, 0: one after the other). Then,
    /// on Vulkan, the same for a copy each way on each queue the adapter offers beside wgpu's (rows
    /// `queue2`: a second queue of wgpu's family; `transfer-queue`: a copy-only family), or on
    /// wgpu's own queue standing in where it offers none (`stand-in-queue`, which overlaps nothing).
    Overlap(OverlapArgs),
    /// All-gather and reduce-scatter GB/s per rank through the trainer's collectives: in-process ranks
    /// beside a memcpy ceiling, or under mpirun (built with the mpi feature) beside MPI's own
    /// MPI_Allgather and MPI_Reduce_scatter_block on the same sizes.
    Collectives {
        /// In-process ranks, at least 2 (ignored under mpirun, where the world is mpirun's -n).
        #[arg(long, default_value_t = 2)]
        world_size: usize,
        /// Bytes of each rank's slice, comma-separated.
        #[arg(long, default_value = "1MiB,16MiB,64MiB", value_delimiter = ',', value_parser = parse_size)]
        sizes: Vec<u64>,
        /// Timed repetitions per size; the best is reported.
        #[arg(long, default_value_t = 5, value_parser = positive_count())]
        reps: usize,
        /// Also time the reduce-scatter as `train --grad-compression MODE` runs it (none, bf16, int8,
        /// onebit, topk:F): encoded with error feedback, on gradient-like values, with its bytes on the wire;
        /// and `--zero-stage 0`'s all-reduce of the same values (in one phase at 2 ranks, two from 3).
        #[arg(long, value_name = "MODE", value_parser = parse_grad_compression, default_value = "none")]
        grad_compression: GradCompression,
        /// Elements per scale of int8 and onebit, as `train --grad-compression-chunk`.
        #[arg(long, value_name = "N", default_value_t = zerostream::comm::compress::DEFAULT_CHUNK_ELEMS)]
        grad_compression_chunk: usize,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Every kernel of a GPT-2 training step on the GPU, at the shapes of GPT-2 124M and 1.5B, and
    /// Llama-3.2-1B's matrix products: GFLOP/s (matmul, attention) or GB/s (the rest) beside the
    /// adapter's peak and a measured device copy.
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
pub struct TransferArgs {
    /// Transfer sizes, comma-separated.
    #[arg(long, default_value = "1MiB,4MiB,16MiB,64MiB,256MiB", value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Repetitions per size and method; the best is reported.
    #[arg(long, default_value_t = 3, value_parser = positive_count())]
    reps: usize,
    /// Which wgpu adapter (index or part of its name).
    #[arg(long)]
    adapter: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct OverlapArgs {
    /// Bytes of each copy (default: a GPT-2 124M block's fp32 working copy, rounded up).
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    bytes: u64,
    /// Rows of the matmul run beside the copy, C (m, n) = A (m, k) @ B (k, n) (default: GPT-2 124M's
    /// MLP at B=4, T=1024).
    #[arg(long, default_value_t = 4096)]
    m: usize,
    /// Columns of the matmul's C and B.
    #[arg(long, default_value_t = 3072)]
    n: usize,
    /// The matmul's inner dimension.
    #[arg(long, default_value_t = 768)]
    k: usize,
    /// Timed repetitions of each measurement; the best is reported.
    #[arg(long, default_value_t = 3, value_parser = positive_count())]
    reps: usize,
    /// Which wgpu adapter (index or part of its name).
    #[arg(long)]
    adapter: Option<String>,
    /// Print one JSON object per transfer method (and one for the download) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct KernelArgs {
    /// Model shapes, comma-separated: gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl (1.5B) or tiny, each
    /// with every kernel of its step; llama-3.2-1b, llama-3.2-3b or llama-3-8b, with their step's matrix products only.
    #[arg(long, default_value = "gpt2,gpt2-xl,llama-3.2-1b", value_delimiter = ',')]
    models: Vec<String>,
    /// B: sequences per micro-batch.
    #[arg(long, default_value_t = 4, value_parser = crate::positive_count())]
    batch_size: usize,
    /// T: tokens per sequence (at most 1024, the presets' n_positions).
    #[arg(long, default_value_t = 1024, value_parser = crate::positive_count())]
    seq_len: usize,
    /// Timed repetitions per kernel, after one warm-up; the median is reported (0 = as many as fill
    /// about 0.2 s, between 3 and 200).
    #[arg(long, default_value_t = 0)]
    reps: usize,
    /// Only the kernels whose name contains one of these, comma-separated (e.g. matmul,attention), or
    /// the rows a table's kernel column names (e.g. gelu_backward).
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

/// Runs one `zerostream bench` subcommand.
/// Runs a bench; `quiet` leaves out the progress lines of the long ones (adam, kernels, all).
pub fn run(cmd: BenchCommand, quiet: bool) -> Result<()> {
    match cmd {
        BenchCommand::Io(a) => drive::io_command(a),
        BenchCommand::H2d(t) => transfer_command(t, Link::HostToDevice),
        BenchCommand::D2h(t) => transfer_command(t, Link::DeviceToHost),
        BenchCommand::Overlap(o) => overlap_command(o),
        BenchCommand::Collectives { world_size, sizes, reps, grad_compression, grad_compression_chunk, json } => {
            let codec = zerostream::comm::compress::Codec::new(grad_compression, grad_compression_chunk)?;
            collectives::bench_collectives(world_size, &sizes, reps, codec, json)
        }
        BenchCommand::Kernels(k) => kernels_command(k, quiet),
        BenchCommand::All { dir, size, params, adapter, json } => all::bench_all(&dir, size, params, adapter.as_deref(), json, quiet),
        BenchCommand::Adam { params, threads, grad, copy, adam_state, optimizer, reps, json } => {
            let r = zerostream::bench::adam::bench_adam(&AdamBenchConfig {
                params,
                threads,
                grad: grad.unwrap_or(if optimizer == Optimizer::Adamw { HalfOrFull::Bf16 } else { HalfOrFull::F32 }),
                copy,
                moments: adam_state,
                optimizer,
                reps,
                progress: !quiet,
            })?;
            if json {
                println!("{}", r.to_json());
            } else {
                println!(
                    "{}: {} params, {} grads, {} copy, {} moments, {} threads ({}): {:.2} Gparam/s, {} B/param = {:.1} GB/s; triad {:.1} GB/s; {:.0}% of triad{}",
                    r.optimizer.name(),
                    r.params,
                    r.grad,
                    r.copy,
                    r.moments.name(),
                    r.threads,
                    r.isa,
                    r.gparams_per_s,
                    r.bytes_per_param,
                    r.adam_gbps,
                    r.triad_gbps,
                    100.0 * r.fraction_of_triad(),
                    if r.fraction_of_triad() > 1.0 { format!(": above it, because {}", r.above_triad_because()) } else { String::new() }
                );
            }
            Ok(())
        }
    }
}

fn transfer_command(t: TransferArgs, link: Link) -> Result<()> {
    let dev = GpuDevice::open(t.adapter.as_deref(), None)?;
    if !t.json {
        println!("device: {}", zerostream::device::Backend::describe(&dev));
    }
    let runs = zerostream::bench::transfer::bench_transfer(&dev, link, &t.sizes, t.reps, |r| {
        if !t.json {
            println!("{:>8} {:>12}: {:6.2} GB/s", exact_size(r.bytes), format!("{:?}", r.method), r.gbps);
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

fn overlap_command(o: OverlapArgs) -> Result<()> {
    use zerostream::bench::overlap::{OverlapConfig, bench_overlap};
    let cfg = OverlapConfig { bytes: o.bytes, m: o.m, n: o.n, k: o.k, reps: o.reps };
    cfg.check()?;
    let dev = GpuDevice::open(o.adapter.as_deref(), None)?;
    if !o.json {
        println!("device: {}", zerostream::device::Backend::describe(&dev));
        for kind in dev.copy_queue_kinds() {
            println!("copy queue `{}`: {}", kind.name(), kind.describe());
        }
        println!("copies of {} beside matmuls of {} x {} x {} (best of {}):", exact_size(cfg.bytes), cfg.m, cfg.n, cfg.k, cfg.reps);
        println!("{:>18} {:>10} {:>8} {:>12} {:>10} {:>7}", "method", "copy ms", "matmuls", "kernels ms", "both ms", "hidden");
    }
    let mut noisy = false;
    bench_overlap(&dev, &cfg, |r| {
        if o.json {
            println!("{}", r.to_json());
        } else {
            let ms = |s: f64| format!("{:.3}", s * 1e3);
            // Past 100% only by timing noise: said as all of it, marked.
            noisy |= r.hidden() > 1.0;
            let hidden = if r.hidden() > 1.0 { "100%*".to_string() } else { format!("{:.0}%", 100.0 * r.hidden()) };
            println!("{:>18} {:>10} {:>8} {:>12} {:>10} {:>7}", r.method, ms(r.copy_s), r.matmuls, ms(r.kernels_s), ms(r.both_s), hidden);
        }
    })?;
    if noisy {
        println!("* both together timed shorter than the longer part alone (timing noise at this size): all of it hidden");
    }
    Ok(())
}

fn kernels_command(k: KernelArgs, quiet: bool) -> Result<()> {
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
    if !quiet {
        eprintln!(
            "bench kernels: {} (B={}, T={}, models {})",
            zerostream::device::Backend::describe(&dev),
            cfg.batch,
            cfg.seq_len,
            cfg.models.join(",")
        );
    }
    let report = zerostream::bench::kernels::bench_kernels(&dev, &cfg, |r| {
        if !quiet {
            eprintln!("  {} {} {} {} {}: {:.1} us", r.model, r.kernel, r.case, r.precision, r.shape, r.seconds * 1e6)
        }
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
