//! `zerostream bench all`: every link of the offload path in one table beside its ceiling.

use anyhow::Result;
use zerostream::bench::adam::{AdamBenchConfig, HalfOrFull};
use zerostream::bench::io::{self as bench_io, IoBenchConfig};
use zerostream::bench::transfer::Link;
use zerostream::device::GpuDevice;
use zerostream::device::transfer::TransferMethod;
use zerostream::train::{AdamState, Optimizer};
use zerostream_offload::IoEngineKind;

use zerostream::bench::{Ceiling, LinkRow};

pub fn bench_all(dir: &std::path::Path, size: u64, params: usize, adapter: Option<&str>, json: bool, quiet: bool) -> Result<()> {
    let mut rows: Vec<LinkRow> = adam_rows(params, quiet)?.into();
    rows.extend(nvme_rows(dir, size)?);
    match GpuDevice::open(adapter, None) {
        Ok(dev) => rows.extend(transfer_rows(&dev)?),
        Err(e) => eprintln!("no GPU adapter, h2d and d2h not measured: {e:#}"),
    }
    if json {
        println!("{}", serde_json::json!({ "links": rows.iter().map(LinkRow::to_json).collect::<Vec<_>>() }));
    } else {
        print!("{}", zerostream::bench::links_table(&rows));
    }
    Ok(())
}

/// The RAM's triad (a ceiling, printed once as such) and AdamW held against it.
fn adam_rows(params: usize, quiet: bool) -> Result<[LinkRow; 2]> {
    let adam = zerostream::bench::adam::bench_adam(&AdamBenchConfig {
        params,
        threads: 0,
        grad: HalfOrFull::Bf16,
        copy: HalfOrFull::Bf16,
        moments: AdamState::Fp32,
        optimizer: Optimizer::Adamw,
        reps: 3,
        progress: !quiet,
    })?;
    Ok([
        LinkRow { link: "RAM (STREAM triad, all threads)".into(), gbps: adam.triad_gbps, ceiling: None },
        LinkRow {
            link: format!("CPU AdamW ({:.2} Gparam/s, {} B/param)", adam.gparams_per_s, adam.bytes_per_param),
            gbps: adam.adam_gbps,
            ceiling: Some(Ceiling { name: "triad".into(), gbps: adam.triad_gbps, exceeded_because: adam.above_triad_because() }),
        },
    ])
}

/// The drive's write and read in `dir` (1 MiB blocks, 32 deep), each beside fio's on the same terms.
fn nvme_rows(dir: &std::path::Path, size: u64) -> Result<[LinkRow; 2]> {
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
    Ok([
        LinkRow { link: label("write"), gbps: io[0].write_gbps, ceiling: fio_ceiling(fio.map_or(f64::NAN, |f| f.0)) },
        LinkRow { link: label("read"), gbps: io[0].read_gbps, ceiling: fio_ceiling(fio.map_or(f64::NAN, |f| f.1)) },
    ])
}

/// The fastest way the trainer moves 256 MiB up and down, beside one thread's host memcpy.
fn transfer_rows(dev: &GpuDevice) -> Result<Vec<LinkRow>> {
    let memcpy = zerostream::bench::memcpy_gbps(256 << 20, 3);
    let mut rows = Vec::new();
    for link in [Link::HostToDevice, Link::DeviceToHost] {
        let runs = zerostream::bench::transfer::bench_transfer(dev, link, &[256 << 20], 2, |_| {})?;
        // Prestaged times a copy whose bytes were staged before the clock: not a way the trainer moves them.
        let paths = runs.iter().filter(|r| r.method != TransferMethod::Prestaged);
        let best = paths.max_by(|a, b| a.gbps.total_cmp(&b.gbps)).expect("two methods ran");
        let name = if link == Link::HostToDevice { "h2d" } else { "d2h" };
        rows.push(LinkRow {
            link: format!("{name} 256MiB {:?} ({})", best.method, zerostream::device::Backend::describe(dev)),
            gbps: best.gbps,
            ceiling: Some(Ceiling {
                name: "host memcpy, one thread".into(),
                gbps: memcpy,
                exceeded_because:
                    "the driver may copy with several threads or DMA straight from our memory, where one memcpy thread is the reference"
                        .into(),
            }),
        });
    }
    Ok(rows)
}
