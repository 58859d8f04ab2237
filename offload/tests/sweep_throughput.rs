//! The trainer's update sweep over NVMe, alone: the bytes per second it moves, to compare with fio
//! reading and writing the same disk at once (`benches/fio_vs_bench_io.sh --mixed`). A measurement, not
//! a check, so it is ignored by default:
//!
//! ```text
//! SWEEP_DIR=/path/on/nvme cargo test --release -p zerostream-offload --test sweep_throughput -- --ignored --nocapture
//! ```
//! SWEEP_ENGINE (uring, threads or mmap; default the platform's) moves the bytes;
//! SWEEP_GROUPS (default 8) groups of SWEEP_PARAMS (default 32M) parameters, each group's update laid
//! out as the trainer's worker (`engine/src/train/worker.rs`) does it: read the gradient, master
//! weights, m and v (16 B/param, one batch) ahead, AdamW with a bf16 copy into the working copy, write
//! the working copy (2 B/param) and then master, m and v (12 B/param, one batch) behind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use zerostream_offload::{
    AdamConfig, AdamW, Grads, IoConfig, IoEngine, IoEngineKind, NvmeDir, ParamCopy, StoreError, Stored, Tier, pipelined_sweep,
};

struct Group {
    grad: Stored,
    master: Stored,
    m: Stored,
    v: Stored,
    working: Stored,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number"))).unwrap_or(default)
}

#[test]
#[ignore = "a measurement: run with --ignored and SWEEP_DIR on the drive to measure"]
fn sweep_throughput() {
    let dir = std::env::var("SWEEP_DIR").map(std::path::PathBuf::from).unwrap_or_else(|_| std::env::temp_dir());
    let (groups, params) = (env_usize("SWEEP_GROUPS", 8), env_usize("SWEEP_PARAMS", 32 << 20));
    let engine =
        std::env::var("SWEEP_ENGINE").map_or(IoEngineKind::NATIVE, |e| e.parse().unwrap_or_else(|e: String| panic!("SWEEP_ENGINE: {e}")));
    for verify in [true, false] {
        let scratch = tempfile::tempdir_in(&dir).unwrap();
        let io = IoEngine::new(IoConfig { engine, ..IoConfig::default() }).unwrap();
        assert_eq!(io.config.engine, engine, "{:?}", io.notes);
        let nvme = NvmeDir::new(scratch.path(), io, verify, 0).unwrap();
        let nv = Some(&nvme);
        let mut shards: Vec<Group> = (0..groups)
            .map(|k| {
                let new = |kind: &str, bytes: usize| {
                    let mut s = Stored::new(&format!("g{k}.{kind}"), bytes, Tier::Nvme, nv).unwrap();
                    s.page_in_zeroed(nv);
                    s.data_mut().as_mut_slice::<f32>().iter_mut().for_each(|x| *x = 0.01);
                    s.page_out(nv, true).unwrap();
                    s
                };
                Group {
                    grad: new("grad", 4 * params),
                    master: new("master", 4 * params),
                    m: new("m", 4 * params),
                    v: new("v", 4 * params),
                    working: new("working", 2 * params),
                }
            })
            .collect();
        let adam = AdamW::new(
            AdamConfig { lr: 1e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, variance_frozen_after: None },
            0,
            zerostream_offload::adam::DEFAULT_CHUNK_ELEMS,
        );
        for sweep in 0..2 {
            let before = nvme.traffic();
            // Each stage's busy time (the rest of the sweep it spends waiting on its neighbours).
            let busy = [(); 4].map(|()| AtomicU64::new(0));
            let timed = |stage: usize, since: Instant| busy[stage].fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let start = Instant::now();
            shards = pipelined_sweep(
                shards,
                |g: &mut Group| -> Result<(), StoreError> {
                    let t = Instant::now();
                    let read = Stored::page_in_all(&mut [&mut g.grad, &mut g.master, &mut g.m, &mut g.v], nv);
                    timed(0, t);
                    read
                },
                |_, g| {
                    let t = Instant::now();
                    g.working.page_in_zeroed(nv);
                    let (p, m, v) = (g.master.data_mut(), g.m.data_mut(), g.v.data_mut());
                    let copy = ParamCopy::Bf16(bytemuck::cast_slice_mut(g.working.data_mut().as_mut_slice::<u16>()));
                    let grads = Grads::F32(g.grad.data().as_slice::<f32>());
                    adam.step(p.as_mut_slice(), m.as_mut_slice(), v.as_mut_slice(), grads, copy, sweep as u64 + 1, 1.0, true);
                    timed(1, t);
                    let t = Instant::now();
                    g.working.page_out(nv, true)?;
                    g.grad.page_out(nv, false)?;
                    timed(2, t);
                    Ok(())
                },
                |g| {
                    let t = Instant::now();
                    let written = Stored::page_out_all(&mut [&mut g.master, &mut g.m, &mut g.v], nv, true);
                    timed(3, t);
                    written
                },
            )
            .unwrap();
            let seconds = start.elapsed().as_secs_f64();
            let (read, written) = (nvme.traffic().0 - before.0, nvme.traffic().1 - before.1);
            println!(
                "sweep {sweep} ({engine} engine, verify {verify}): {groups} groups x {params} params in {seconds:.2} s: read {:.2} GB/s, written {:.2} GB/s, together {:.2} GB/s",
                read as f64 / seconds / 1e9,
                written as f64 / seconds / 1e9,
                (read + written) as f64 / seconds / 1e9
            );
            let [read_s, adam_s, working_s, write_s] = busy.map(|b| b.into_inner() as f64 / 1e9);
            println!(
                "  busy: read {read_s:.2} s, AdamW {adam_s:.2} s, working copy written {working_s:.2} s, state written {write_s:.2} s (of {seconds:.2} s)"
            );
            assert!(read > 0 && written > 0);
            // What the run holds on disk now, spares included (what `du` of the directory says).
            let allocated = allocated_bytes(scratch.path());
            let state: u64 =
                shards.iter().map(|g| [&g.grad, &g.master, &g.m, &g.v, &g.working].map(|t| t.len_bytes() as u64).iter().sum::<u64>()).sum();
            println!("  disk: {:.2} GB allocated in the directory, state {:.2} GB", allocated as f64 / 1e9, state as f64 / 1e9);
        }
    }
}

/// Bytes allocated to the files in `dir` (what `du` counts; their lengths where std cannot tell).
fn allocated_bytes(dir: &std::path::Path) -> u64 {
    let files = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap());
    #[cfg(unix)]
    return files.map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512).sum();
    #[cfg(not(unix))]
    return files.map(|m| m.len()).sum();
}
