//! Running a training job on several ranks: in-process (one thread and one device per rank, exchanging
//! through [`crate::comm::local`]) or as this process's part of an MPI job.
//!
//! A rank that fails — an error or a panic — aborts its world, so every other rank leaves its next
//! collective with an error naming it; the launcher then reports the failing rank's own error.

use std::panic::{AssertUnwindSafe, catch_unwind};

use anyhow::{Context, Result, anyhow, bail};

use super::TrainConfig;
use super::run::{RunOptions, RunSummary, run_rank_on};
use crate::comm::local::LocalWorld;
use crate::comm::{Collectives, Comm, PeerFailed};
use crate::device::{self, AnyDevice, DeviceChoice};

/// The device one rank computes on: `cpu`, or a GPU adapter (index or part of its name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankDevice {
    /// Whatever `--device`/`--adapter` chose.
    Default,
    Cpu,
    Adapter(String),
}

impl RankDevice {
    /// Parses `--devices`: a comma-separated list, one entry per rank (`cpu`, or an adapter index or name).
    pub fn parse_list(text: &str) -> Result<Vec<RankDevice>> {
        text.split(',')
            .map(|e| match e.trim() {
                "" => bail!("--devices {text:?}: an empty entry (expected e.g. `0,1` or `cpu,cpu`)"),
                "cpu" => Ok(RankDevice::Cpu),
                name => Ok(RankDevice::Adapter(name.to_string())),
            })
            .collect()
    }

    /// Opens the device, charged to `budget_bytes`.
    pub fn open(&self, choice: DeviceChoice, adapter: Option<&str>, budget_bytes: Option<u64>) -> Result<AnyDevice> {
        match self {
            RankDevice::Default => device::open(choice, adapter, budget_bytes),
            RankDevice::Cpu => device::open(DeviceChoice::Cpu, None, budget_bytes),
            // Named by --devices (the node-local choice under mpirun is always an adapter that exists).
            RankDevice::Adapter(name) => {
                device::open(DeviceChoice::Gpu, Some(name), budget_bytes).with_context(|| format!("--devices {name}"))
            }
        }
    }
}

/// The device of MPI rank `local_rank` on its node when `--devices` is not given: the cpu device if
/// that is the choice (or `auto` finds no real GPU), an explicit `--adapter` if given, else adapter
/// number local_rank modulo the adapters found.
pub fn default_device_for_local_rank(local_rank: usize, choice: DeviceChoice, adapter: Option<&str>) -> RankDevice {
    if choice == DeviceChoice::Cpu || adapter.is_some() {
        return RankDevice::Default;
    }
    let adapters = device::gpu::list_adapters();
    let candidates: Vec<_> = adapters.iter().filter(|a| choice == DeviceChoice::Gpu || a.is_real_gpu()).collect();
    if candidates.is_empty() {
        return RankDevice::Default;
    }
    RankDevice::Adapter(candidates[local_rank % candidates.len()].index.to_string())
}

/// Runs `body` on `world` ranks, each a thread with its own [`Comm`]; returns every rank's result in
/// rank order, or the first failing rank's error (not the errors the others got because of it).
pub fn in_process<R: Send>(world: usize, body: impl Fn(Comm) -> Result<R> + Sync) -> Result<Vec<R>> {
    if world == 0 {
        bail!("--world-size must be at least 1");
    }
    let results: Vec<Result<R>> = std::thread::scope(|scope| {
        let handles: Vec<_> = LocalWorld::new(world)
            .into_iter()
            .enumerate()
            .map(|(rank, local)| {
                let body = &body;
                std::thread::Builder::new()
                    .name(format!("rank{rank}"))
                    .spawn_scoped(scope, move || {
                        let aborter = local.clone();
                        let comm = Comm::new(Box::new(local));
                        match catch_unwind(AssertUnwindSafe(|| body(comm))) {
                            Ok(Ok(r)) => Ok(r),
                            Ok(Err(e)) => {
                                aborter.abort(&format!("{e:#}"));
                                Err(e)
                            }
                            Err(panic) => {
                                let why = panic_message(&panic);
                                aborter.abort(&format!("panicked: {why}"));
                                Err(anyhow!("rank {rank} panicked: {why}"))
                            }
                        }
                    })
                    .expect("spawning a rank thread")
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a rank thread could not be joined")))).collect()
    });
    let mut out = Vec::with_capacity(world);
    let mut first_error: Option<(usize, anyhow::Error)> = None;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(v) => out.push(v),
            Err(e) => {
                let caused_by_peer = e.downcast_ref::<PeerFailed>().is_some();
                let better = match &first_error {
                    None => true,
                    Some((_, prev)) => prev.downcast_ref::<PeerFailed>().is_some() && !caused_by_peer,
                };
                if better {
                    first_error = Some((rank, e));
                }
            }
        }
    }
    match first_error {
        None => Ok(out),
        Some((rank, e)) if e.downcast_ref::<PeerFailed>().is_none() => Err(e.context(format!("rank {rank} of {world}"))),
        Some((_, e)) => Err(e),
    }
}

/// A panic's message, as the thread that panicked gave it.
pub(super) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// `zerostream train --world-size N`: N in-process ranks, rank r on `devices[r]` (or all on the
/// default device); rank 0 prints progress, writes the metrics and saves.
pub fn train_in_process(
    world: usize,
    devices: &[RankDevice],
    choice: DeviceChoice,
    adapter: Option<&str>,
    options: &RunOptions,
    train: TrainConfig,
) -> Result<Vec<RunSummary>> {
    if !devices.is_empty() && devices.len() != world {
        bail!("--devices lists {} for --world-size {world}: give one per rank", crate::words::counted(devices.len() as u64, "device"));
    }
    in_process(world, |comm| {
        let rank = comm.rank();
        let which = devices.get(rank).cloned().unwrap_or(RankDevice::Default);
        let dev = which.open(choice, adapter, train.gpu_mem_budget).map_err(|e| e.context("opening its device"))?;
        run_rank_on(&dev, options, train.clone(), comm)
    })
}
