//! `zerostream bench io`: the NVMe tier's engines, block sizes and queue depths, beside fio.

use std::path::PathBuf;

use anyhow::Result;
use zerostream::bench::io::{self as bench_io, IoBenchConfig, IoRun};
use zerostream_offload::IoEngineKind;

use crate::parse_size;
use zerostream::words::exact_size;

/// `bench io`'s engines when none are named: io_uring and the portable threads engine where both exist.
const BENCH_ENGINES: &str = if cfg!(target_os = "linux") { "uring,threads" } else { "threads" };

#[derive(clap::Args)]
pub struct IoArgs {
    /// Directory on the drive to measure (a file is written there and removed; a directory this
    /// creates is removed again).
    #[arg(long)]
    pub dir: PathBuf,
    /// Bytes written then read per configuration, rounded up to whole transfers of the buffer (the
    /// block size times the queue depth times 4, at least 64 MiB, at most --size rounded up to a block).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub size: u64,
    /// Block sizes to try, comma-separated.
    #[arg(long, default_value = "256KiB,1MiB,8MiB", value_delimiter = ',', value_parser = parse_size)]
    pub block_size: Vec<u64>,
    /// Queue depths to try, comma-separated.
    #[arg(long, default_value = "8,32,128", value_delimiter = ',')]
    pub queue_depth: Vec<usize>,
    /// I/O engines to try, comma-separated: uring (Linux), threads (portable), mmap. By default
    /// every engine this platform has besides mmap, side by side.
    #[arg(long, default_value = BENCH_ENGINES, value_delimiter = ',')]
    pub io_engine: Vec<IoEngineKind>,
    /// Use the page cache instead of O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// Also run fio (--direct=1 --ioengine=io_uring --bs=1M --iodepth=32) on the same size, if installed.
    #[arg(long)]
    pub fio: bool,
    /// Draw bandwidth against block size and queue depth into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn io_command(a: IoArgs) -> Result<()> {
    let IoArgs { dir, size, block_size, queue_depth, io_engine, buffered, fio, plot, json } = a;
    let cfg = IoBenchConfig {
        dir: dir.clone(),
        size_bytes: size,
        block_sizes: block_size,
        queue_depths: queue_depth,
        engines: io_engine,
        direct: !buffered,
    };
    cfg.check()?;
    let _made = bench_io::BenchDir::open(&dir)?; // held to the end: fio writes there too
    let runs = bench_io::bench_io(&cfg, |r| {
        if !json {
            println!(
                "{:>7} {:<8} block {:>8} qd {:>4}: write {:6.2} GB/s, read {:6.2} GB/s{}",
                r.engine.name(),
                r.kind(),
                exact_size(r.block_bytes),
                r.queue_depth,
                r.write_gbps,
                r.read_gbps,
                rounded_note(r.bytes, size)
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
    let best = [best_direct, best_buffered];
    let fio_gbps = fio_gbps.zip(best_direct);
    if json {
        print_json(&runs, size, best, fio_gbps);
    } else {
        print_text(&runs, best, fio_gbps);
    }
    Ok(())
}

/// Where a run moved more than `--size` (rounded up to whole transfers of its buffer), how much.
fn rounded_note(bytes: u64, size: u64) -> String {
    if bytes == size { String::new() } else { format!(" ({} each way: --size rounded up to whole transfers)", exact_size(bytes)) }
}

/// What fio measured (write, read GB/s) beside the best O_DIRECT run it ran like.
type FioBeside<'a> = Option<((f64, f64), &'a IoRun)>;

/// The runs, the best O_DIRECT and the best buffered run, and fio, as one JSON object.
fn print_json(runs: &[IoRun], size: u64, best: [Option<&IoRun>; 2], fio: FioBeside<'_>) {
    let mut out = serde_json::json!({ "runs": runs.iter().map(|r| r.to_json()).collect::<Vec<_>>(), "size": size });
    if let Some(b) = best[0] {
        out["best_direct"] = b.to_json();
    }
    if let Some(b) = best[1] {
        out["best_buffered"] = b.to_json();
    }
    if let Some(((w, r), b)) = fio {
        out["fio"] = serde_json::json!({ "write_gbps": w, "read_gbps": r, "bs": b.block_bytes, "iodepth": b.queue_depth });
    }
    println!("{out}");
}

/// The best of each kind ready to paste into `train`, each engine beside uring, and fio beside the best.
fn print_text(runs: &[IoRun], best: [Option<&IoRun>; 2], fio: FioBeside<'_>) {
    for best in best.into_iter().flatten() {
        println!(
            "best {} (least time to write and read the same bytes): --io-engine {} --block-size {} --queue-depth {} (write {:.2} GB/s, read {:.2} GB/s){}",
            best.kind(),
            best.engine.name(),
            exact_size(best.block_bytes),
            best.queue_depth,
            best.write_gbps,
            best.read_gbps,
            if best.direct { "" } else { " through the page cache: not the drive's speed" }
        );
    }
    for (run, base) in bench_io::beside(runs, IoEngineKind::Uring) {
        println!(
            "{} / uring, {} block {} qd {}: write {:.2}x, read {:.2}x",
            run.engine,
            run.kind(),
            exact_size(run.block_bytes),
            run.queue_depth,
            run.write_gbps / base.write_gbps,
            run.read_gbps / base.read_gbps
        );
    }
    if let Some(((w, r), b)) = fio {
        println!(
            "fio (O_DIRECT, io_uring, bs {}, iodepth {}): write {w:.2} GB/s, read {r:.2} GB/s; best O_DIRECT above is {:.0}% / {:.0}% of it",
            exact_size(b.block_bytes),
            b.queue_depth,
            100.0 * b.write_gbps / w,
            100.0 * b.read_gbps / r
        );
    }
}
