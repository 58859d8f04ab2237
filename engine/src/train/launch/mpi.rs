//! This process's part of an MPI job: MPI started before any check, so that a refusal on any rank
//! ends the whole job ([`abort`]); the checks of this rank's node and its device, held until every
//! rank has passed them ([`check_rank`]); then the run ([`run_rank`]). A build without the `mpi`
//! feature refuses to start, saying how to build one.

#[cfg(feature = "mpi")]
use anyhow::Context;
use anyhow::Result;

use super::{Launched, RunRequest};
use crate::device::AnyDevice;
use crate::model::Model;
use crate::train::TrainConfig;

#[cfg(feature = "mpi")]
pub(super) use crate::comm::mpi::MpiWorld as Mpi;

/// None is built without MPI.
#[cfg(not(feature = "mpi"))]
pub(super) enum Mpi {}

/// This process's rank, checked and with its device open, not yet run.
#[cfg_attr(not(feature = "mpi"), allow(dead_code, reason = "never made without MPI"))]
pub(super) struct MpiRank {
    train: TrainConfig,
    dev: AnyDevice,
}

#[cfg(feature = "mpi")]
pub(super) fn start() -> Result<Mpi> {
    Mpi::init().context("initialising MPI")
}

#[cfg(not(feature = "mpi"))]
pub(super) fn start() -> Result<Mpi> {
    let n = crate::comm::launcher_world_size().unwrap_or(1);
    anyhow::bail!(
        "started by mpirun as one of {n} processes, but this zerostream was built without MPI support: \
         rebuild with `cargo build --release --features zerostream/mpi` (needs OpenMPI and libclang), \
         or run one process with --world-size N for ranks on this machine"
    )
}

/// Ends the whole job with this rank's error `e`: the other ranks are in, or on their way to, a
/// collective that this one would never join.
#[cfg(feature = "mpi")]
pub(super) fn abort(mpi: &Mpi, e: &anyhow::Error) -> ! {
    mpi.abort(&format!("rank {}: {e:#}", mpi.rank()))
}

#[cfg(not(feature = "mpi"))]
pub(super) fn abort(mpi: &Mpi, _: &anyhow::Error) -> ! {
    match *mpi {}
}

/// The checks on this rank's node (RAM, disk, `--devices`) and its node-local device opened, before
/// any output is made; the collective at the end holds every rank until all have passed (a rank that
/// fails aborts the job, those waiting included).
#[cfg(feature = "mpi")]
pub(super) fn check_rank(mpi: &Mpi, req: &RunRequest, model: &Model) -> Result<MpiRank> {
    let (rank, local_rank) = (mpi.rank(), mpi.node_local_rank());
    let mut train = req.train.clone();
    if req.params_ram_cache_auto {
        // Each process sized the cache from its own machine's RAM: all take the smallest, so every rank
        // holds the same blocks and the checkpoint records the size they all used.
        train.params_ram_cache_bytes = mpi.min_u64(train.params_ram_cache_bytes);
    }
    super::check_host_room(req, model, &train, mpi.size(), mpi.node_local_size())?;
    train.adam_threads = super::adam_threads_per_rank(train.adam_threads, mpi.node_local_size());
    let (devices, choice, adapter) = (&req.ranks.devices, req.ranks.device, req.ranks.adapter.as_deref());
    let which = match devices.get(local_rank) {
        Some(d) => d.clone(),
        None if !devices.is_empty() => anyhow::bail!(
            "--devices lists {}, but this node runs at least {} ranks: list one device per rank on a node",
            crate::words::counted(devices.len() as u64, "device"),
            local_rank + 1
        ),
        None => crate::train::ranks::default_device_for_local_rank(local_rank, choice, adapter),
    };
    let dev = which.open(choice, adapter, train.gpu_mem_budget).with_context(|| format!("rank {rank}'s device"))?;
    mpi.min_u64(1);
    Ok(MpiRank { train, dev })
}

#[cfg(not(feature = "mpi"))]
pub(super) fn check_rank(mpi: &Mpi, _: &RunRequest, _: &Model) -> Result<MpiRank> {
    match *mpi {}
}

/// Runs the checked rank ([`check_rank`]).
#[cfg(feature = "mpi")]
pub(super) fn run_rank(mpi: &Mpi, MpiRank { train, dev }: MpiRank, req: &RunRequest) -> Result<Launched> {
    let comm = crate::comm::Comm::new(Box::new(mpi.comm()));
    let summary = crate::train::run::run_rank_on(&dev, &req.options, train, comm)?;
    Ok(Launched::Ran { rank: mpi.rank(), summary })
}

#[cfg(not(feature = "mpi"))]
pub(super) fn run_rank(mpi: &Mpi, _: MpiRank, _: &RunRequest) -> Result<Launched> {
    match *mpi {}
}
