//! `zerostream bench io`: sequential write then read of a file on the NVMe tier, per I/O engine, block
//! size and queue depth, through the same engine the trainer uses; optionally beside fio in the same run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zerostream_offload::io::MAX_QUEUE_DEPTH;
use zerostream_offload::io::preallocate;
use zerostream_offload::{ALIGN_BYTES, AlignedBuf, Direction, IoConfig, IoEngine, IoEngineKind};

#[derive(Clone, Debug)]
pub struct IoBenchConfig {
    pub dir: PathBuf,
    pub size_bytes: u64,
    pub block_sizes: Vec<u64>,
    pub queue_depths: Vec<usize>,
    pub engines: Vec<IoEngineKind>,
    pub direct: bool,
}

/// One configuration's result.
#[derive(Clone, Debug)]
pub struct IoRun {
    pub engine: IoEngineKind,
    pub block_bytes: u64,
    pub queue_depth: usize,
    pub direct: bool,
    /// Bytes written, then read: `--size` rounded up to whole transfers of the engine's buffer.
    pub bytes: u64,
    pub write_gbps: f64,
    pub read_gbps: f64,
}

impl IoRun {
    /// "O_DIRECT" (or its platform's kin: "F_NOCACHE", "FILE_FLAG_NO_BUFFERING") or "buffered"
    /// (through the page cache: the mmap engine, or uncached I/O refused).
    pub fn kind(&self) -> &'static str {
        if self.direct { IoEngine::uncached_name() } else { "buffered" }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "io_engine": self.engine.name(), "block_size": self.block_bytes, "queue_depth": self.queue_depth,
            "direct": self.direct, "kind": self.kind(), "bytes": self.bytes, "write_gbps": self.write_gbps, "read_gbps": self.read_gbps,
        })
    }
}

/// Bytes moved per engine call: large enough that refilling the queue between calls costs little,
/// small enough to keep the buffer modest.
fn chunk_bytes(block: u64, depth: usize) -> u64 {
    (64u64 << 20).max(block * depth as u64 * 4)
}

/// Writes then reads `size` bytes sequentially with one configuration; returns (write, read) GB/s.
pub fn run_one(path: &Path, size: u64, config: IoConfig) -> Result<IoRun> {
    let io = IoEngine::new(config).with_context(|| format!("configuration {config:?}"))?;
    for note in &io.notes {
        eprintln!("{note}");
    }
    let (file, direct) = io.open(path, true).with_context(|| format!("opening {}", path.display()))?;
    let chunk = chunk_bytes(config.block_bytes as u64, config.queue_depth).min(size.max(4096)).div_ceil(config.block_bytes as u64)
        * config.block_bytes as u64;
    let size = size.div_ceil(chunk) * chunk;
    // Allocated before writing, as fio does and as the trainer's shard files are: writes then fill
    // reserved blocks instead of allocating them one by one.
    preallocate(&file, size).with_context(|| format!("allocating {} bytes for {}", size, path.display()))?;
    let mut buf = AlignedBuf::zeroed(chunk as usize);
    for (i, b) in buf.bytes_mut().iter_mut().enumerate() {
        *b = (i % 251) as u8; // not zeros: some devices compress or skip them
    }
    // The whole file in one stream of requests through the one buffer: the queue never drains between
    // chunks, and the buffer is registered once.
    let mut timed = |dir: Direction| -> Result<f64> {
        let t = Instant::now();
        io.transfer_repeated(dir, &file, 0, buf.padded_mut(), size).with_context(|| format!("{dir:?} of {}", path.display()))?;
        if dir == Direction::Write {
            file.sync_data().with_context(|| format!("syncing {}", path.display()))?;
        }
        Ok(size as f64 / t.elapsed().as_secs_f64() / 1e9)
    };
    let write_gbps = timed(Direction::Write)?;
    let read_gbps = timed(Direction::Read)?;
    Ok(IoRun {
        engine: io.config.engine,
        block_bytes: config.block_bytes as u64,
        queue_depth: config.queue_depth,
        direct,
        bytes: size,
        write_gbps,
        read_gbps,
    })
}

impl IoBenchConfig {
    /// Refuses, by flag, a size, block size or queue depth no engine takes (before any file is made).
    pub fn check(&self) -> Result<()> {
        if self.size_bytes == 0 {
            bail!("--size 0: expected a positive number of bytes");
        }
        if let Some(b) = self.block_sizes.iter().find(|&&b| b == 0 || !b.is_multiple_of(ALIGN_BYTES as u64)) {
            bail!("--block-size {b}: expected a positive multiple of {ALIGN_BYTES} bytes");
        }
        if let Some(d) = self.queue_depths.iter().find(|&&d| d == 0 || d > MAX_QUEUE_DEPTH) {
            bail!("--queue-depth {d}: expected 1 to {MAX_QUEUE_DEPTH}");
        }
        Ok(())
    }
}

/// The `--dir` a drive bench writes its files in: created with any missing parents, as the NVMe tier
/// creates its own, and those it created removed again when dropped (the empty ones: a file someone
/// else put there meanwhile keeps its directory), so a measurement leaves nothing behind.
pub struct BenchDir {
    /// The directories this made, deepest first.
    created: Vec<PathBuf>,
}

impl BenchDir {
    pub fn open(dir: &Path) -> Result<BenchDir> {
        let mut created = Vec::new();
        let mut missing = Some(dir);
        while let Some(d) = missing.filter(|d| !d.as_os_str().is_empty() && std::fs::symlink_metadata(d).is_err()) {
            created.push(d.to_path_buf());
            missing = d.parent();
        }
        if dir.exists() && !dir.is_dir() {
            bail!("--dir {}: not a directory", dir.display());
        }
        let made = BenchDir { created };
        std::fs::create_dir_all(dir).with_context(|| format!("--dir {}: cannot create it", dir.display()))?;
        Ok(made)
    }
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        for d in &self.created {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Every combination, in order, in `cfg.dir` (which must exist: [`BenchDir::open`]); the test file is
/// removed afterwards.
pub fn bench_io(cfg: &IoBenchConfig, mut on_run: impl FnMut(&IoRun)) -> Result<Vec<IoRun>> {
    cfg.check()?;
    if !cfg.dir.is_dir() {
        bail!("--dir {}: not a directory", cfg.dir.display());
    }
    let path = cfg.dir.join(format!("zerostream-bench-io-{}.bin", std::process::id()));
    let mut runs = Vec::new();
    let result = (|| -> Result<()> {
        for &engine in &cfg.engines {
            for &block in &cfg.block_sizes {
                for &depth in &cfg.queue_depths {
                    let config = IoConfig { engine, block_bytes: block as usize, queue_depth: depth, direct: cfg.direct };
                    let run = run_one(&path, cfg.size_bytes, config)?;
                    on_run(&run);
                    runs.push(run);
                }
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    result.map(|()| runs)
}

/// Among the O_DIRECT runs (`direct`) or the buffered ones, the configuration that writes and reads a
/// byte in the least time (1/write + 1/read), as a step's NVMe sweep does both: a fast read cannot
/// hide a slow write, as a sum of rates would let it. The two kinds are never compared.
pub fn best(runs: &[IoRun], direct: bool) -> Option<&IoRun> {
    let seconds_per_byte = |r: &IoRun| 1.0 / r.write_gbps + 1.0 / r.read_gbps;
    runs.iter().filter(|r| r.direct == direct).min_by(|a, b| seconds_per_byte(a).total_cmp(&seconds_per_byte(b)))
}

/// Each run of one engine beside the run of `base` at the same block size, depth and kind (uncached or
/// buffered): (that run, base's run). `bench io` prints their ratio.
pub fn beside(runs: &[IoRun], base: IoEngineKind) -> Vec<(&IoRun, &IoRun)> {
    let same = |a: &IoRun, b: &IoRun| (a.block_bytes, a.queue_depth, a.direct) == (b.block_bytes, b.queue_depth, b.direct);
    runs.iter()
        .filter(|r| r.engine != base && r.engine != IoEngineKind::Mmap)
        .filter_map(|r| runs.iter().find(|b| b.engine == base && same(r, b)).map(|b| (r, b)))
        .collect()
}

/// fio's sequential write then read of the same size (`--direct=1 --ioengine=io_uring --bs=1M
/// --iodepth=32`), in GB/s; None if fio is not installed.
pub fn fio(dir: &Path, size: u64, block: u64, depth: usize) -> Result<Option<(f64, f64)>> {
    if std::process::Command::new("fio").arg("--version").output().is_err() {
        return Ok(None);
    }
    let file = dir.join(format!("zerostream-fio-{}.bin", std::process::id()));
    let mut gbps = Vec::new();
    for rw in ["write", "read"] {
        let out = std::process::Command::new("fio")
            .args(["--name=zerostream", "--direct=1", "--ioengine=io_uring", "--output-format=json", "--end_fsync=1"])
            .arg(format!("--rw={rw}"))
            .arg(format!("--bs={block}"))
            .arg(format!("--iodepth={depth}"))
            .arg(format!("--size={size}"))
            .arg(format!("--filename={}", file.display()))
            .output()
            .context("running fio")?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&file);
            bail!("fio --rw={rw} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).context("parsing fio's JSON")?;
        let bw_bytes = json["jobs"][0][rw]["bw_bytes"].as_f64().context("fio's JSON has no bw_bytes")?;
        gbps.push(bw_bytes / 1e9);
    }
    let _ = std::fs::remove_file(&file);
    Ok(Some((gbps[0], gbps[1])))
}

/// Draws read and write GB/s against block size, one line per engine and queue depth, as SVG.
#[cfg(feature = "plot")]
pub fn plot(runs: &[IoRun], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let max = runs.iter().map(|r| r.read_gbps.max(r.write_gbps)).fold(0.0f64, f64::max) * 1.15 + 1e-3;
    let (min_block, max_block) = runs.iter().fold((u64::MAX, 0u64), |(lo, hi), r| (lo.min(r.block_bytes), hi.max(r.block_bytes)));
    let root = SVGBackend::new(path, (1000, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let halves = root.split_evenly((1, 2));
    for (area, (title, pick)) in halves.iter().zip([("write", true), ("read", false)]) {
        let mut chart = ChartBuilder::on(area)
            .caption(format!("sequential {title}, GB/s"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d(((min_block as f64).log2() - 0.5)..((max_block as f64).log2() + 0.5), 0.0..max)?;
        chart.configure_mesh().x_desc("block size").x_label_formatter(&|x| format!("{}KiB", (2f64.powf(*x) / 1024.0).round())).draw()?;
        let mut keys: Vec<(IoEngineKind, usize)> = runs.iter().map(|r| (r.engine, r.queue_depth)).collect();
        keys.sort_by_key(|k| (k.0.name(), k.1));
        keys.dedup();
        for (i, key) in keys.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| (r.engine, r.queue_depth) == *key)
                .map(|r| ((r.block_bytes as f64).log2(), if pick { r.write_gbps } else { r.read_gbps }))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(format!("{} qd{}", key.0, key.1))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(2)));
            chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    }
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_run_writes_and_reads_in_the_least_time() {
        let run = |engine, write_gbps, read_gbps| IoRun {
            engine,
            block_bytes: 1 << 20,
            queue_depth: 32,
            direct: true,
            bytes: 1 << 30,
            write_gbps,
            read_gbps,
        };
        // A fast read beside a slow write loses to two middling rates: 1/0.82 + 1/12.89 > 1/1.89 + 1/2.
        let runs = [run(IoEngineKind::Threads, 0.82, 12.89), run(IoEngineKind::NATIVE, 1.89, 2.0)];
        assert_eq!(best(&runs, true).unwrap().write_gbps, 1.89);
        assert!(best(&runs, false).is_none(), "O_DIRECT and buffered runs are never compared");
    }

    #[test]
    fn bench_dir_removes_what_it_made_and_only_that() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a").join("b");
        let made = BenchDir::open(&deep).unwrap();
        assert!(deep.is_dir());
        drop(made);
        assert!(!tmp.path().join("a").exists(), "both levels it created are gone");
        assert!(tmp.path().is_dir(), "the directory that was there stays");
        // A directory that gained a file meanwhile is kept, with the file.
        let made = BenchDir::open(&deep).unwrap();
        std::fs::write(deep.join("someone-elses"), b"x").unwrap();
        drop(made);
        assert!(deep.join("someone-elses").is_file());
        // One that existed before is left as it was, empty or not.
        std::fs::remove_file(deep.join("someone-elses")).unwrap();
        drop(BenchDir::open(&deep).unwrap());
        assert!(deep.is_dir());
        std::fs::write(deep.join("someone-elses"), b"x").unwrap();
        // A file in the way is refused by name.
        let err = BenchDir::open(&deep.join("someone-elses")).err().unwrap().to_string();
        assert!(err.contains("someone-elses") && err.contains("not a directory"), "{err}");
    }
}
