//! `zerostream bench ...`: each link of the offload path (AdamW, NVMe, h2d, d2h, collectives, kernels)
//! measured beside its ceiling.

use std::path::PathBuf;

use anyhow::{Result, bail};
use zerostream::bench::adam::{AdamBenchConfig, HalfOrFull};
use zerostream::bench::io::{self as bench_io, IoBenchConfig};
use zerostream::bench::kernels::KernelBenchConfig;
use zerostream::bench::transfer::Link;
use zerostream::comm::compress::{Codec, GradCompression};
use zerostream::device::GpuDevice;
use zerostream::device::transfer::TransferMethod;
use zerostream::train::{AdamState, Optimizer};
use zerostream_offload::IoEngineKind;

use crate::{parse_grad_compression, parse_size};

/// `bench io`'s engines when none are named: io_uring and the portable threads engine where both exist.
const BENCH_ENGINES: &str = if cfg!(target_os = "linux") { "uring,threads" } else { "threads" };

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
        /// Precision of the gradients the update reads.
        #[arg(long, value_enum, default_value = "bf16")]
        grad: HalfOrFull,
        /// Precision of the parameter copy written for the GPU (`f32` = no copy).
        #[arg(long, value_enum, default_value = "bf16")]
        copy: HalfOrFull,
        /// The moments' format, as `train --adam-state` takes it (bf16: 4 bytes per parameter fewer
        /// moved, plus the widening and the stochastic rounding's noise to compute).
        #[arg(long, value_enum, default_value = "fp32")]
        adam_state: AdamState,
        /// The update rule, as `train --optimizer` takes it: adamw, or lamb and lars (two passes per
        /// step: the norms, then the step; f32 gradients, so with `--grad f32`).
        #[arg(long, value_enum, default_value = "adamw")]
        optimizer: Optimizer,
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
        /// Directory on the drive to measure (a file is written there and removed; a directory this
        /// creates is removed again).
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
        /// I/O engines to try, comma-separated: uring (Linux), threads (portable), mmap. By default
        /// every engine this platform has besides mmap, side by side.
        #[arg(long, default_value = BENCH_ENGINES, value_delimiter = ',')]
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
    /// Host-to-device throughput through wgpu: queue.write_buffer, wgpu's staging memory filled by several threads, the device's upload ring of mapped staging buffers (what training uses), and the device's copy alone from staging memory filled before the clock (Prestaged: the bound a host-side change could reach).
    H2d(TransferArgs),
    /// Device-to-host throughput through wgpu: one mapped read-back buffer and a ring of them.
    D2h(TransferArgs),
    /// Whether copies run while kernels do on wgpu's one queue: for each way of uploading, and for the
    /// trainer's gradient download, the copy alone, a run of matmuls of about its length alone, and the
    /// matmuls submitted first with the copy issued behind them (the trainer's order); `hidden` is the
    /// share of the shorter part the pair saved (1: fully overlapped, 0: one after the other).
    Overlap(OverlapArgs),
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
        /// Also time the reduce-scatter as `train --grad-compression MODE` runs it (none, bf16, int8,
        /// onebit, topk:F): encoded with error feedback, on gradient-like values, with its bytes on the wire.
        #[arg(long, value_name = "MODE", value_parser = parse_grad_compression, default_value = "none")]
        grad_compression: GradCompression,
        /// Elements per scale of int8 and onebit, as `train --grad-compression-chunk`.
        #[arg(long, value_name = "N", default_value_t = zerostream::comm::compress::DEFAULT_CHUNK_ELEMS)]
        grad_compression_chunk: usize,
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
pub struct TransferArgs {
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
    #[arg(long, default_value_t = 3)]
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

/// Runs one `zerostream bench` subcommand.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Io { dir, size, block_size, queue_depth, io_engine, buffered, fio, plot, json } => {
            let _made = bench_io::BenchDir::open(&dir)?; // held to the end: fio writes there too
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
                        "{:>7} {:<8} block {:>8} qd {:>4}: write {:6.2} GB/s, read {:6.2} GB/s",
                        r.engine.name(),
                        r.kind(),
                        human_bytes(r.block_bytes),
                        r.queue_depth,
                        r.write_gbps,
                        r.read_gbps
                    );
                }
            })?;
            // The page cache and O_DIRECT measure different things: a best of each, never one across both.
            let best_direct = bench_io::best(&runs, true);
            let best_buffered = bench_io::best(&runs, false);
            // fio runs with O_DIRECT, at the block size and depth of the best O_DIRECT configuration.
            let fio_gbps = match (fio, best_direct) {
                (true, Some(b)) => bench_io::fio(&dir, size, b.block_bytes, b.queue_depth)?,
                (true, None) => {
                    eprintln!("no O_DIRECT configuration ran (the filesystem refused it): fio, which uses O_DIRECT, not run");
                    None
                }
                (false, _) => None,
            };
            if fio && best_direct.is_some() && fio_gbps.is_none() {
                eprintln!("fio is not installed: no comparison (apt-get install fio)");
            }
            if let Some(path) = &plot {
                bench_io::plot(&runs, path)?;
                eprintln!("plot: {}", path.display());
            }
            if json {
                let mut out = serde_json::json!({ "runs": runs.iter().map(|r| r.to_json()).collect::<Vec<_>>(), "size": size });
                if let Some(b) = best_direct {
                    out["best_direct"] = b.to_json();
                }
                if let Some(b) = best_buffered {
                    out["best_buffered"] = b.to_json();
                }
                if let (Some((w, r)), Some(b)) = (fio_gbps, best_direct) {
                    out["fio"] = serde_json::json!({ "write_gbps": w, "read_gbps": r, "bs": b.block_bytes, "iodepth": b.queue_depth });
                }
                println!("{out}");
            } else {
                for best in [best_direct, best_buffered].into_iter().flatten() {
                    println!(
                        "best {}: --io-engine {} --block-size {} --queue-depth {} (write {:.2} GB/s, read {:.2} GB/s){}",
                        best.kind(),
                        best.engine.name(),
                        human_bytes(best.block_bytes),
                        best.queue_depth,
                        best.write_gbps,
                        best.read_gbps,
                        if best.direct { "" } else { " through the page cache: not the drive's speed" }
                    );
                }
                for (run, base) in bench_io::beside(&runs, IoEngineKind::Uring) {
                    println!(
                        "{} / uring, {} block {} qd {}: write {:.2}x, read {:.2}x",
                        run.engine,
                        run.kind(),
                        human_bytes(run.block_bytes),
                        run.queue_depth,
                        run.write_gbps / base.write_gbps,
                        run.read_gbps / base.read_gbps
                    );
                }
                if let (Some((w, r)), Some(b)) = (fio_gbps, best_direct) {
                    println!(
                        "fio (O_DIRECT, io_uring, bs {}, iodepth {}): write {w:.2} GB/s, read {r:.2} GB/s; best O_DIRECT above is {:.0}% / {:.0}% of it",
                        human_bytes(b.block_bytes),
                        b.queue_depth,
                        100.0 * b.write_gbps / w,
                        100.0 * b.read_gbps / r
                    );
                }
            }
            Ok(())
        }
        BenchCommand::H2d(t) => transfer_command(t, Link::HostToDevice),
        BenchCommand::D2h(t) => transfer_command(t, Link::DeviceToHost),
        BenchCommand::Overlap(o) => overlap_command(o),
        BenchCommand::Collectives { world_size, sizes, reps, grad_compression, grad_compression_chunk, json } => {
            let codec = zerostream::comm::compress::Codec::new(grad_compression, grad_compression_chunk)?;
            bench_collectives(world_size, &sizes, reps, codec, json)
        }
        BenchCommand::Kernels(k) => kernels_command(k),
        BenchCommand::All { dir, size, params, adapter, json } => bench_all(&dir, size, params, adapter.as_deref(), json),
        BenchCommand::Adam { params, threads, grad, copy, adam_state, optimizer, reps, json } => {
            let r = zerostream::bench::adam::bench_adam(&AdamBenchConfig {
                params,
                threads,
                grad,
                copy,
                moments: adam_state,
                optimizer,
                reps,
            })?;
            if json {
                println!("{}", r.to_json());
            } else {
                println!(
                    "{}: {} params, {} grads, {} copy, {} moments, {} threads ({}): {:.2} Gparam/s, {} B/param = {:.1} GB/s; triad {:.1} GB/s; {:.0}% of triad",
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
                    100.0 * r.fraction_of_triad()
                );
            }
            Ok(())
        }
    }
}

fn bench_collectives(world_size: usize, sizes: &[u64], reps: usize, codec: Codec, json: bool) -> Result<()> {
    use zerostream::bench::comm::{CollectiveRun, bench_collectives};
    let launched = zerostream::comm::launcher_world_size().unwrap_or(1);
    if let Some(bad) = sizes.iter().find(|&&b| b == 0 || b % 4 != 0) {
        bail!("--sizes {bad}: every slice must be a positive multiple of 4 bytes (whole f32 words)");
    }
    if launched <= 1 {
        if world_size == 0 || world_size > zerostream_offload::MAX_THREADS {
            bail!("--world-size {world_size}: 1 to {} in-process ranks", zerostream_offload::MAX_THREADS);
        }
        // Each in-process rank holds two world-sized buffers of the largest slice (the gathered copy
        // and the reduce-scatter's input), and a compressed exchange's gradient and residual besides.
        let buffers = if codec.mode == zerostream::comm::compress::GradCompression::None { 2 } else { 4 };
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let need_bytes = (buffers * world_size as u64 * world_size as u64).saturating_mul(largest);
        let what = format!("--world-size {world_size} with --sizes up to {}", human_bytes(largest));
        zerostream::train::refuse_past_available_ram(need_bytes, &what)?;
    }
    let (runs, transport): (Vec<CollectiveRun>, String) = if launched > 1 {
        mpi_bench_collectives(sizes, reps, codec)?
    } else {
        let all = zerostream::train::ranks::in_process(world_size, |comm| {
            let t = comm.describe();
            Ok((bench_collectives(&comm, sizes, reps, Some(codec), |_, _| Ok(Vec::new()))?, t))
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
        let codec = if r.codec_seconds > 0.0 { format!(", of which coding {:.3} ms", 1e3 * r.codec_seconds) } else { String::new() };
        println!(
            "{:<26} slice {:>8}: {:8.3} ms  {:7.2} GB/s per rank  ({} on the wire per rank{codec})",
            r.op,
            human_bytes(r.slice_bytes),
            1e3 * r.seconds,
            r.gbps_per_rank,
            human_bytes(r.wire_bytes_per_rank)
        );
    }
    println!("ceiling: host memcpy (one thread) {memcpy:.2} GB/s");
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn mpi_bench_collectives(_: &[u64], _: usize, _: Codec) -> Result<(Vec<zerostream::bench::comm::CollectiveRun>, String)> {
    anyhow::bail!("started by mpirun, but this zerostream was built without MPI support: rebuild with `--features zerostream/mpi`")
}

/// This process's part of `bench collectives` under mpirun; rank 0 gets the rows, the others none.
#[cfg(feature = "mpi")]
fn mpi_bench_collectives(sizes: &[u64], reps: usize, codec: Codec) -> Result<(Vec<zerostream::bench::comm::CollectiveRun>, String)> {
    use anyhow::Context;
    use zerostream::comm::{Comm, mpi::MpiWorld};
    let mpi = MpiWorld::init().context("initialising MPI")?;
    let raw = mpi.comm();
    let comm = Comm::new(Box::new(mpi.comm()));
    let runs = zerostream::bench::comm::bench_collectives(&comm, sizes, reps, Some(codec), |n, reps| {
        zerostream::bench::comm::mpi_reference(&comm, &raw, n, reps)
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
    let runs = zerostream::bench::transfer::bench_transfer(&dev, link, &t.sizes, t.reps, |r| {
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

fn overlap_command(o: OverlapArgs) -> Result<()> {
    use zerostream::bench::overlap::{OverlapConfig, bench_overlap};
    let dev = GpuDevice::open(o.adapter.as_deref(), None)?;
    let cfg = OverlapConfig { bytes: o.bytes, m: o.m, n: o.n, k: o.k, reps: o.reps };
    if !o.json {
        println!("device: {}", zerostream::device::Backend::describe(&dev));
        println!("copies of {} beside matmuls of {} x {} x {} (best of {}):", human_bytes(cfg.bytes), cfg.m, cfg.n, cfg.k, cfg.reps);
        println!("{:>17} {:>10} {:>8} {:>12} {:>10} {:>7}", "method", "copy ms", "matmuls", "kernels ms", "both ms", "hidden");
    }
    bench_overlap(&dev, &cfg, |r| {
        if o.json {
            println!("{}", r.to_json());
        } else {
            let ms = |s: f64| format!("{:.3}", s * 1e3);
            let hidden = format!("{:.0}%", 100.0 * r.hidden());
            println!("{:>17} {:>10} {:>8} {:>12} {:>10} {:>7}", r.method, ms(r.copy_s), r.matmuls, ms(r.kernels_s), ms(r.both_s), hidden);
        }
    })?;
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
    let report = zerostream::bench::kernels::bench_kernels(&dev, &cfg, |r| {
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
    use zerostream::bench::{Ceiling, LinkRow};
    let mut rows: Vec<LinkRow> = Vec::new();
    let adam = zerostream::bench::adam::bench_adam(&AdamBenchConfig {
        params,
        threads: 0,
        grad: HalfOrFull::Bf16,
        copy: HalfOrFull::Bf16,
        moments: AdamState::Fp32,
        optimizer: Optimizer::Adamw,
        reps: 3,
    })?;
    // The triad is a ceiling, printed once as such; AdamW is held against it.
    rows.push(LinkRow { link: "RAM (STREAM triad, all threads)".into(), gbps: adam.triad_gbps, ceiling: None });
    rows.push(LinkRow {
        link: format!("CPU AdamW ({:.2} Gparam/s, {} B/param)", adam.gparams_per_s, adam.bytes_per_param),
        gbps: adam.adam_gbps,
        ceiling: Some(Ceiling {
            name: "triad".into(),
            gbps: adam.triad_gbps,
            exceeded_because: format!(
                "AdamW's {:.0} MiB of state may sit in this CPU's caches, where the triad's arrays are sized to stream from RAM: \
                 raise --params past the cache to measure RAM",
                (adam.bytes_per_param * adam.params) as f64 / 1048576.0
            ),
        }),
    });
    let (block, depth) = (1u64 << 20, 32);
    let _made = bench_io::BenchDir::open(dir)?;
    let io_cfg = IoBenchConfig {
        dir: dir.to_path_buf(),
        size_bytes: size,
        block_sizes: vec![block],
        queue_depths: vec![depth],
        engines: vec![IoEngineKind::NATIVE],
        direct: true,
    };
    let io = bench_io::bench_io(&io_cfg, |_| {})?;
    let fio = bench_io::fio(dir, size, block, depth)?;
    let kind = if io[0].direct { "O_DIRECT" } else { "buffered: O_DIRECT refused" };
    // fio runs with O_DIRECT: only an O_DIRECT run is held against it.
    let fio_ceiling = |gbps: f64| {
        io[0].direct.then(|| Ceiling {
            name: if fio.is_some() { "fio, same size/block/depth".into() } else { "fio not installed".into() },
            gbps,
            exceeded_because: "fio is a measurement of the same disk in the same run, not a bound: the disk's own variation (a virtual disk's host cache) can put either side ahead".into(),
        })
    };
    let label = |what: &str| format!("NVMe {what} ({}, {kind}, 1MiB x 32)", dir.display());
    rows.push(LinkRow { link: label("write"), gbps: io[0].write_gbps, ceiling: fio_ceiling(fio.map_or(f64::NAN, |f| f.0)) });
    rows.push(LinkRow { link: label("read"), gbps: io[0].read_gbps, ceiling: fio_ceiling(fio.map_or(f64::NAN, |f| f.1)) });
    match GpuDevice::open(adapter, None) {
        Ok(dev) => {
            let memcpy = zerostream::bench::memcpy_gbps(256 << 20, 3);
            for link in [Link::HostToDevice, Link::DeviceToHost] {
                let runs = zerostream::bench::transfer::bench_transfer(&dev, link, &[256 << 20], 2, |_| {})?;
                // Prestaged times a copy whose bytes were staged before the clock: not a way the trainer moves them.
                let paths = runs.iter().filter(|r| r.method != TransferMethod::Prestaged);
                let best = paths.max_by(|a, b| a.gbps.total_cmp(&b.gbps)).expect("two methods ran");
                let name = if link == Link::HostToDevice { "h2d" } else { "d2h" };
                rows.push(LinkRow {
                    link: format!("{name} 256MiB {:?} ({})", best.method, zerostream::device::Backend::describe(&dev)),
                    gbps: best.gbps,
                    ceiling: Some(Ceiling {
                        name: "host memcpy, one thread".into(),
                        gbps: memcpy,
                        exceeded_because: "the driver may copy with several threads or DMA straight from our memory, where one memcpy thread is the reference".into(),
                    }),
                });
            }
        }
        Err(e) => eprintln!("no GPU adapter, h2d and d2h not measured: {e:#}"),
    }
    if json {
        println!("{}", serde_json::json!({ "links": rows.iter().map(LinkRow::to_json).collect::<Vec<_>>() }));
    } else {
        print!("{}", zerostream::bench::links_table(&rows));
    }
    Ok(())
}
