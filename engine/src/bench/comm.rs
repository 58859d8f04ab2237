//! `zerostream bench collectives`: all-gather and reduce-scatter GB/s per rank, through the trainer's
//! own [`Comm`] — in-process beside a one-thread memcpy ceiling, or under mpirun beside MPI's own
//! `MPI_Allgather` and `MPI_Reduce_scatter_block` on the same sizes in the same run.
//!
//! A rank's GB/s counts the bytes it receives from the other ranks, (N-1)/N of the gathered (or
//! reduced) buffer, over the slowest rank's time; a compressed reduce-scatter (`--grad-compression`)
//! counts the f32 bytes its encodings stand for, and reports the bytes on the wire beside them.

use std::time::Instant;

use anyhow::{Result, bail};

use crate::comm::compress::{Codec, GradCompression};
use crate::comm::{AllReducePhases, Comm};

/// One measured collective at one size.
#[derive(Clone, Debug)]
pub struct CollectiveRun {
    /// `all-gather`, `reduce-scatter`, or `mpi all-gather` / `mpi reduce-scatter` (MPI's own).
    pub op: String,
    /// Bytes of each rank's slice.
    pub slice_bytes: u64,
    pub world_size: usize,
    pub seconds: f64,
    /// Bytes each rank received from the others per second, in GB/s (for a compressed reduce-scatter:
    /// the f32 gradient bytes those stand for).
    pub gbps_per_rank: f64,
    /// Bytes each rank sent to the others per call: (N-1) slices, or their encodings.
    pub wire_bytes_per_rank: u64,
    /// Of `seconds`, this rank's mean time per call in encoding and decoding (compressed rows; 0
    /// otherwise).
    pub codec_seconds: f64,
}

impl CollectiveRun {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "op": self.op, "slice_bytes": self.slice_bytes, "world_size": self.world_size,
            "seconds": self.seconds, "gbps_per_rank": self.gbps_per_rank, "wire_bytes_per_rank": self.wire_bytes_per_rank,
            "codec_seconds": self.codec_seconds,
        })
    }
}

/// Best-of-`reps` time of `f` on this rank, made the slowest rank's (the collective ends when it does).
fn best_time(comm: &Comm, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up: first-touch of the buffers
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        comm.barrier()?;
        let start = Instant::now();
        f()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    let all = comm.gather_scalars(best)?;
    Ok(all.into_iter().fold(0.0, f64::max))
}

fn record(op: &str, slice_bytes: usize, world: usize, seconds: f64) -> CollectiveRun {
    let received = (world - 1) * slice_bytes;
    CollectiveRun {
        op: op.into(),
        slice_bytes: slice_bytes as u64,
        world_size: world,
        seconds,
        gbps_per_rank: received as f64 / seconds.max(1e-12) / 1e9,
        wire_bytes_per_rank: received as u64,
        codec_seconds: 0.0,
    }
}

/// Gradient-like values: deterministic, of both signs and many magnitudes (a constant would flatter
/// top-k and int8).
fn gradient_like(seed: usize, n: usize) -> Vec<f32> {
    let mut s = (seed as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            u * u * u * 1e-2
        })
        .collect()
}

/// Measures the trainer's all-gather and reduce-scatter at each slice size on this rank's world (every
/// rank calls it); `extra` adds transport-specific rows (MPI's own collectives) at each size.
/// With `codec` (other than none), also the reduce-scatter as `--grad-compression` runs it: encoded
/// with error feedback, on gradient-like values, its bytes on the wire counted; and stage 0's
/// compressed all-reduce of the same values.
pub fn bench_collectives(
    comm: &Comm,
    slice_sizes_bytes: &[u64],
    reps: usize,
    codec: Option<Codec>,
    mut extra: impl FnMut(usize, usize) -> Result<Vec<CollectiveRun>>,
) -> Result<Vec<CollectiveRun>> {
    let world = comm.world_size();
    // Under mpirun each process reads its own arguments: sizes or counts that differ would pair
    // collectives of other lengths (MPI writes past a buffer) or leave a rank waiting.
    let asked = format!("{slice_sizes_bytes:?} {reps} {codec:?}");
    let differ = comm.ranks_differing(crate::comm::fingerprint(asked.as_bytes()))?;
    if !differ.is_empty() {
        bail!(
            "bench collectives: ranks {differ:?} were given other --sizes, --reps or --grad-compression than rank 0; give every rank the same"
        );
    }
    let mut runs = Vec::new();
    for &size in slice_sizes_bytes {
        let n = (size as usize / 4).max(1);
        let mine = vec![comm.rank() as f32; n];
        let mut all = vec![0.0f32; world * n];
        let t = best_time(comm, reps, || comm.all_gather(&mine, &mut all, false))?;
        runs.push(record("all-gather", 4 * n, world, t));
        let full = vec![1.0f32; world * n];
        let mut out = vec![0.0f32; n];
        let t = best_time(comm, reps, || comm.reduce_scatter_sum(&full, &mut out, false))?;
        runs.push(record("reduce-scatter", 4 * n, world, t));
        if let Some(codec) = codec.filter(|c| c.mode != GradCompression::None && world > 1) {
            let full = gradient_like(comm.rank(), world * n);
            let mut residual = vec![0.0f32; (world - 1) * n];
            let op = format!("reduce-scatter {}", codec.mode);
            runs.push(time_compressed(comm, reps, &op, n, || {
                comm.reduce_scatter_sum_compressed(&full, &mut out, &codec, &mut residual, false)
            })?);
            // Stage 0's exchange of the same gradient (one phase at 2 ranks, two from 3).
            let (mut sum, mut residual) = (vec![0.0f32; world * n], vec![0.0f32; world * n]);
            let op = format!("all-reduce {} (stage 0)", codec.mode);
            runs.push(time_compressed(comm, reps, &op, n, || {
                comm.all_reduce_sum_compressed(&full, &mut sum, &codec, &mut residual, AllReducePhases::Auto.two_at(world), false)
            })?);
        }
        runs.extend(extra(n, reps)?);
    }
    Ok(runs)
}

/// A compressed exchange `run` of `n` elements per rank's slice, timed as [`best_time`] times it, with
/// its bytes on the wire (from one untimed call) and its codec seconds per call.
fn time_compressed(comm: &Comm, reps: usize, op: &str, n: usize, mut run: impl FnMut() -> Result<()>) -> Result<CollectiveRun> {
    let before = comm.stats().grad_sent_bytes;
    run()?;
    let wire = comm.stats().grad_sent_bytes - before;
    let codec_before = comm.stats().codec_seconds;
    let t = best_time(comm, reps, &mut run)?;
    // best_time makes reps.max(1) calls after one warm-up.
    let codec_seconds = (comm.stats().codec_seconds - codec_before) / (reps.max(1) + 1) as f64;
    Ok(CollectiveRun { wire_bytes_per_rank: wire, codec_seconds, ..record(op, 4 * n, comm.world_size(), t) })
}

/// MPI's own MPI_Allgather and MPI_Reduce_scatter_block (sum of f32) on `n` floats per rank.
#[cfg(feature = "mpi")]
pub fn mpi_reference(comm: &Comm, raw: &crate::comm::mpi::MpiComm, n: usize, reps: usize) -> Result<Vec<CollectiveRun>> {
    let world = comm.world_size();
    let mine = vec![comm.rank() as f32; n];
    let mut all = vec![0.0f32; world * n];
    let t = best_time(comm, reps, || {
        raw.mpi_all_gather(&mine, &mut all);
        Ok(())
    })?;
    let mut runs = vec![record("mpi all-gather", 4 * n, world, t)];
    let full = vec![1.0f32; world * n];
    let mut out = vec![0.0f32; n];
    let t = best_time(comm, reps, || {
        raw.mpi_reduce_scatter_sum(&full, &mut out);
        Ok(())
    })?;
    runs.push(record("mpi reduce-scatter", 4 * n, world, t));
    Ok(runs)
}
