//! `zerostream bench collectives`: the trainer's all-gather and reduce-scatter, in-process or under mpirun.

use anyhow::{Result, bail};
use zerostream::comm::compress::Codec;

use zerostream::words::exact_size;

pub fn bench_collectives(world_size: usize, sizes: &[u64], reps: usize, codec: Codec, json: bool) -> Result<()> {
    use zerostream::bench::comm::{CollectiveRun, bench_collectives};
    let launched = zerostream::comm::launcher_world_size().unwrap_or(1);
    if let Some(bad) = sizes.iter().find(|&&b| b == 0 || b % 4 != 0) {
        bail!("--sizes {bad}: every slice must be a positive multiple of 4 bytes (whole f32 words)");
    }
    if launched <= 1 {
        if !(2..=zerostream_offload::MAX_THREADS).contains(&world_size) {
            bail!("--world-size {world_size}: 2 to {} in-process ranks (one rank exchanges nothing)", zerostream_offload::MAX_THREADS);
        }
        // Each in-process rank holds two world-sized buffers of the largest slice (the gathered copy
        // and the reduce-scatter's input), and a compressed exchange's gradient and residual besides.
        let buffers = if codec.mode == zerostream::comm::compress::GradCompression::None { 2 } else { 4 };
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let need_bytes = (buffers * world_size as u64 * world_size as u64).saturating_mul(largest);
        let what = format!("--world-size {world_size} with --sizes up to {}", exact_size(largest));
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
        // The coding time is the mean of every call's, the time beside it the best call's: not a part of it.
        let codec = if r.codec_seconds > 0.0 {
            format!(
                "; coding {:.3} ms a call on this rank, the mean of every call (the warm-up's too) where the time is the best call's",
                1e3 * r.codec_seconds
            )
        } else {
            String::new()
        };
        println!(
            "{:<28} slice {:>8}: {:8.3} ms  {:7.2} GB/s per rank  ({} on the wire per rank{codec})",
            r.op,
            exact_size(r.slice_bytes),
            1e3 * r.seconds,
            r.gbps_per_rank,
            exact_size(r.wire_bytes_per_rank)
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
