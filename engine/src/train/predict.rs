//! The step time before the run (`plan --measure`): time each link the run will use, in well under a
//! minute, and predict a steady step from the bytes and parameters the placement gives.
//!
//! Timed (`predict/measure.rs`):
//! - the drive: its directories (the run's `--nvme-dir`, striped alike), swept as the update sweeps
//!   the state (read ahead, the run's update and its moments, write back, through the run's I/O
//!   engine), bytes of both directions per second;
//! - the update (`--optimizer`: AdamW, or LAMB's and LARS's two passes) at the run's moment format
//!   and working-copy precision, on the run's threads;
//! - the device: a one-block and a several-block cut of the run's model (same width, vocabulary, B,
//!   T, precision, budget), all state in RAM, a few steps each; their difference gives a block's
//!   device time (compute, upload, download), the rest is the head's; and a block's upload rate.
//!
//! The model of a steady step (`predict`): overlapped, the update's sweep runs beside the next step's
//! first forward, which waits for each group's update before uploading it; the head, the backward and
//! any further micro-batches follow (the next update needs their gradients). So a step is the slower
//! of that forward, the update and the drive's bytes beside the sweep (`NvmeTraffic::during_sweep`),
//! plus the slower of the rest of the device's work and the rest of the drive's bytes. On the cpu
//! device the device's work, the update and the sweep's own CPU time (the update, checksums, the
//! I/O's system time: the share of the cores the rehearsal kept busy) share the cores, so within each
//! part they add up, against the drive's time alone; and after the sweep the device thread's own
//! reads and writes follow its kernels, except the working copies read ahead and the gradients
//! written behind on threads of their own (`NvmeTraffic::read_ahead_bytes`, `written_behind_bytes`),
//! which hide behind them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use zerostream_offload::Tier;

use super::config::TrainConfig;
use super::plan::Placement;
use super::traffic::{NvmeTraffic, ReadWrite};
use crate::device::Backend;
use crate::model::Model;

mod measure;
pub use measure::measure;

/// What each link did when timed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LinkRates {
    /// GB/s (1e9 bytes a second) read and written at once, both directions counted (None: no drive timed).
    pub drive_gbps: Option<f64>,
    /// The share of all the cores the sweep kept busy while timed (the update, checksums, the I/O's system
    /// time): the part of the drive's time the cpu device's work cannot overlap.
    pub drive_cpu_share: f64,
    pub adam_gparams_per_s: f64,
    /// Device seconds per step of one block (kernels, working-copy upload, gradient download) with
    /// every block resident, and of the rest.
    pub block_s: f64,
    pub head_s: f64,
    /// Of those, the forward's share (kernels and the upload before the vocabulary head): what runs
    /// beside the update's sweep.
    pub block_forward_s: f64,
    pub head_forward_s: f64,
    /// Host-to-device bytes per second of a block's working copy: what evicted blocks pay again.
    pub upload_gbps: f64,
    pub measuring_s: f64,
}

/// A steady step, predicted.
#[derive(Clone, Debug)]
pub struct Prediction {
    pub step_s: f64,
    /// The device's share: kernels, transfers, and (`upload_s`) evicted blocks' second upload.
    pub device_s: f64,
    pub upload_s: f64,
    /// Of `device_s`, the first forward's (beside the sweep).
    pub forward_s: f64,
    pub adam_s: f64,
    pub drive_s: f64,
    /// `--sequential`: the parts run one after the other (the device's step, then the sweep).
    pub sequential: bool,
    /// The two parts of the step, each set by its slowest link: the first forward beside the update's
    /// sweep, then the rest (the head, the backward, further micro-batches); with `--sequential`,
    /// everything one after the other.
    pub phases: [Phase; 2],
}

/// A part of the step: how long, and which link sets it ("the drive", "the device", "the update",
/// or, on the cpu device, "the cores" the device, the update and the sweep share).
#[derive(Clone, Copy, Debug)]
pub struct Phase {
    pub seconds: f64,
    pub bound: &'static str,
}

impl Phase {
    /// The slowest of `links`.
    fn longest(links: &[(&'static str, f64)]) -> Phase {
        let (bound, seconds) = links.iter().copied().fold(("the device", 0.0f64), |best, c| if c.1 > best.1 { c } else { best });
        Phase { seconds, bound }
    }
}

/// Whether `dev` computes on the CPU's cores, which the update uses too.
pub fn shares_cores<D: Backend>(dev: &D) -> bool {
    dev.alloc_costs() == crate::device::AllocCosts::CPU
}

/// The steady step of `placement` (of `model` with `train`) at `rates`; `shared_cores`: the device is
/// the CPU, whose cores the update uses too.
///
/// Overlapped, the update's sweep runs beside the next step's first forward, which waits for each
/// group's update before uploading it; the head, the backward and any further micro-batches come
/// after the sweep has ended (the next update needs their gradients). So the step is the slower of
/// the forward and the sweep, plus the rest, each part moving its own share of the drive's bytes.
pub fn predict(rates: &LinkRates, placement: &Placement, model: &Model, train: &TrainConfig, shared_cores: bool) -> Prediction {
    let traffic = &placement.nvme_traffic;
    let drive_time = |rw: ReadWrite| match rates.drive_gbps {
        Some(gbps) if gbps > 0.0 => (rw.read_bytes + rw.written_bytes) as f64 / (gbps * 1e9),
        _ => 0.0,
    };
    let drive_s = drive_time(traffic.total());
    let sweep_drive_s = drive_time(traffic.during_sweep);
    let rest_drive_s = (drive_s - sweep_drive_s).max(0.0);
    let background = ReadWrite { read_bytes: traffic.read_ahead_bytes, written_bytes: traffic.written_behind_bytes };
    let background_drive_s = drive_time(background).min(rest_drive_s);
    // Blocks evicted from their device slots between forward and backward are uploaded again: the
    // bytes over an all-resident run's (counted as the NVMe tier would read them), at a block's rate.
    // (A RAM cache spares the drive's reads, not the uploads.)
    let as_if_on_nvme = TrainConfig { offload_params: Tier::Nvme, params_ram_cache_bytes: 0, ..train.clone() };
    let uploads = |slots: usize| NvmeTraffic::of(&as_if_on_nvme, placement.world_size, &placement.group_lens, slots).working.read_bytes;
    let reupload_bytes = uploads(placement.block_slots).saturating_sub(uploads(model.n_layer()));
    let upload_s = if rates.upload_gbps > 0.0 { reupload_bytes as f64 / (rates.upload_gbps * 1e9) } else { 0.0 };
    let device_s = rates.head_s + model.n_layer() as f64 * rates.block_s + upload_s;
    let forward_s = (rates.head_forward_s + model.n_layer() as f64 * rates.block_forward_s).min(device_s);
    let state_params = placement.host_optimizer_bytes as f64 / train.state_bytes_per_param() as f64;
    let adam_s = state_params / (rates.adam_gparams_per_s * 1e9);
    let links = StepLinks {
        forward_s,
        rest_device_s: device_s - forward_s,
        adam_s,
        sweep_drive_s,
        rest_drive_s,
        background_drive_s,
        drive_cpu_share: rates.drive_cpu_share,
    };
    let phases = step_phases(&links, shared_cores, train.sequential);
    Prediction {
        step_s: phases[0].seconds + phases[1].seconds,
        device_s,
        upload_s,
        forward_s,
        adam_s,
        drive_s,
        sequential: train.sequential,
        phases,
    }
}

/// The seconds each link needs in each part of a step.
struct StepLinks {
    /// The device's first forward, and the rest of its step.
    forward_s: f64,
    rest_device_s: f64,
    adam_s: f64,
    /// The drive's bytes beside the sweep (the sweep's own, and the first forward's: none but a
    /// gathered copy's write-back, as it takes the sweep's fresh copies), and the rest.
    sweep_drive_s: f64,
    rest_drive_s: f64,
    /// Of `rest_drive_s`, the working copies read ahead and the gradients written behind on their own
    /// threads while the device computes.
    background_drive_s: f64,
    /// The share of the cores the sweep keeps busy while the drive moves its bytes.
    drive_cpu_share: f64,
}

/// The step's two parts: overlapped, the first forward beside the sweep, then the rest; with
/// `sequential`, the device's step, then the update and the drive.
fn step_phases(l: &StepLinks, shared_cores: bool, sequential: bool) -> [Phase; 2] {
    let share = l.drive_cpu_share;
    if sequential {
        // The device thread's step, its own reads and writes included, then the whole sweep (whose
        // read-ahead and write-back overlap the update).
        let device = if shared_cores { "the cores" } else { "the device" };
        [
            Phase { seconds: l.forward_s + l.rest_device_s + l.rest_drive_s, bound: device },
            Phase::longest(&[("the update", l.adam_s), ("the drive", l.sweep_drive_s)]),
        ]
    } else if shared_cores {
        // On the cpu device the device's work, the update and the sweep's own CPU time share the
        // cores, so they add up, against the drive's time alone. After the sweep the device thread
        // computes and moves its own bytes (a later micro-batch's gradient reads, the head's gradient)
        // in turn: its kernels run on it, so only the working copies read ahead and the gradients
        // written behind on their own threads hide behind them.
        let in_turn_s = l.rest_drive_s - l.background_drive_s;
        let beside = Phase::longest(&[("the cores", l.rest_device_s), ("the drive", l.background_drive_s)]);
        // (Under a microsecond in turn is the rounding of two equal byte counts' times.)
        let bound = match beside.bound {
            "the cores" if in_turn_s > 1e-6 => "the cores and the drive in turn",
            bound => bound,
        };
        [
            Phase::longest(&[("the cores", l.forward_s + l.adam_s + share * l.sweep_drive_s), ("the drive", l.sweep_drive_s)]),
            Phase { seconds: beside.seconds + in_turn_s, bound },
        ]
    } else {
        [
            Phase::longest(&[("the device", l.forward_s), ("the update", l.adam_s), ("the drive", l.sweep_drive_s)]),
            Phase::longest(&[("the device", l.rest_device_s), ("the drive", l.rest_drive_s)]),
        ]
    }
}

impl Prediction {
    /// One line for `plan` and `train`.
    pub fn describe(&self, rates: &LinkRates, placement: &Placement) -> String {
        let t = placement.nvme_traffic.total();
        let drive = match rates.drive_gbps {
            Some(gbps) if t.read_bytes + t.written_bytes > 0 => format!(
                "drive {:.2} s ({:.2} GB at the sweep's {gbps:.2} GB/s read+write, {:.0}% of the cores busy)",
                self.drive_s,
                (t.read_bytes + t.written_bytes) as f64 / 1e9,
                100.0 * rates.drive_cpu_share
            ),
            Some(_) => "drive: nothing on NVMe".into(),
            None => "drive not timed (no --nvme-dir or --measure DIR)".into(),
        };
        let [first, then] = self.phases;
        let parts = match self.sequential {
            false => format!(
                "{:.3} s beside the update's sweep, set by {}, then {:.3} s set by {}",
                first.seconds, first.bound, then.seconds, then.bound
            ),
            true => format!(
                "{:.3} s of the device's step, set by {}, then {:.3} s of the update's sweep, set by {}",
                first.seconds, first.bound, then.seconds, then.bound
            ),
        };
        format!(
            "predicted steady step: {:.3} s: {parts} ({drive}; device {:.3} s, {:.3} s of it the first forward: head {:.3} s + {:.4} s a block + re-uploads {:.3} s at {:.2} GB/s; update {:.3} s at {:.2} Gparam/s); measured in {:.0} s",
            self.step_s,
            self.device_s,
            self.forward_s,
            rates.head_s,
            rates.block_s,
            self.upload_s,
            rates.upload_gbps,
            self.adam_s,
            rates.adam_gparams_per_s,
            rates.measuring_s
        )
    }
}

/// The flags that change what `plan --measure` times: shapes, formats, threads, I/O and budget (the
/// tiers and the schedule do not: the prediction takes them from the placement).
const RATE_FLAGS: &[&str] = &[
    "batch-size",
    "seq-len",
    "grad-accum",
    "precision",
    "recompute",
    "vocab-chunk-rows",
    "matmul-inputs",
    "adam-state",
    "adam-threads",
    "io-engine",
    "block-size",
    "queue-depth",
    "buffered",
    "no-verify",
    "gpu-mem-budget",
    "dropout",
];

/// What timed rates are valid for: this build, the device, the model and the rate flags, and the
/// directories whose drive was timed.
fn rates_key(device: &str, model: &Model, train: &TrainConfig, drive_dirs: &[PathBuf]) -> serde_json::Value {
    let flags = train.to_flags();
    let rate_flags: serde_json::Map<String, serde_json::Value> =
        RATE_FLAGS.iter().map(|k| (k.to_string(), flags.get(*k).cloned().unwrap_or_default())).collect();
    serde_json::json!({
        "zerostream": env!("CARGO_PKG_VERSION"),
        // What the rates hold: 2 since the forward's share was timed (older files predict without it).
        "rates": 2,
        "device": device,
        "model": format!("{model:?}"),
        "flags": rate_flags,
        "drive_dirs": drive_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>(),
    })
}

/// The file for `key`, in the tuning directory (`$ZEROSTREAM_TUNE_DIR` or the user's cache):
/// a hash of the key names it, and the file holds the key, so a collision is a miss, not a mix-up.
fn rates_path(key: &serde_json::Value) -> Option<PathBuf> {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a: stable across runs and platforms
    for byte in key.to_string().bytes() {
        hash = (hash ^ byte as u64).wrapping_mul(0x0100_0000_01b3);
    }
    Some(crate::device::matmul_tuning::tune_dir()?.join("links").join(format!("{hash:016x}.json")))
}

/// Keeps what `plan --measure` timed for `train` with the same flags on the same device; returns
/// the file (None where there is no cache directory).
pub fn save_rates(device: &str, model: &Model, train: &TrainConfig, drive_dirs: &[PathBuf], rates: &LinkRates) -> Result<Option<PathBuf>> {
    let key = rates_key(device, model, train, drive_dirs);
    let Some(path) = rates_path(&key) else { return Ok(None) };
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let partial = path.with_extension("json.partial");
    let text = serde_json::to_string_pretty(&serde_json::json!({ "key": key, "rates": rates }))? + "\n";
    std::fs::write(&partial, text).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &path).with_context(|| format!("renaming {} to {}", partial.display(), path.display()))?;
    Ok(Some(path))
}

/// The rates `plan --measure` kept for this run (its drive timed in the run's own `--nvme-dir`), if any.
pub fn saved_rates(device: &str, model: &Model, train: &TrainConfig) -> Option<LinkRates> {
    let key = rates_key(device, model, train, &train.nvme_dirs);
    let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(rates_path(&key)?).ok()?).ok()?;
    (stored.get("key") == Some(&key)).then(|| serde_json::from_value(stored.get("rates")?.clone()).ok()).flatten()
}

/// The directories `plan --measure DIR` times: DIR, else the run's own.
pub fn drive_dirs(measure: &Path, train: &TrainConfig) -> Vec<PathBuf> {
    if measure.as_os_str().is_empty() { train.nvme_dirs.clone() } else { vec![measure.to_path_buf()] }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links() -> StepLinks {
        StepLinks {
            forward_s: 1.0,
            rest_device_s: 3.0,
            adam_s: 0.5,
            sweep_drive_s: 10.0,
            rest_drive_s: 1.0,
            background_drive_s: 0.0,
            drive_cpu_share: 0.5,
        }
    }

    fn seconds(p: [Phase; 2]) -> (f64, &'static str, f64, &'static str) {
        (p[0].seconds, p[0].bound, p[1].seconds, p[1].bound)
    }

    /// The sweep hides the first forward only; the backward waits for nothing but its own bytes.
    #[test]
    fn the_sweep_overlaps_the_first_forward_and_the_rest_follows() {
        assert_eq!(seconds(step_phases(&links(), false, false)), (10.0, "the drive", 3.0, "the device"));
        // The cpu device: the forward, the update and the sweep's CPU share add up on the cores.
        let cpu = StepLinks { adam_s: 2.0, drive_cpu_share: 0.75, ..links() };
        // After the sweep the cpu device's kernels and the device thread's reads and writes add up.
        assert_eq!(seconds(step_phases(&cpu, true, false)), (10.5, "the cores", 4.0, "the cores and the drive in turn"));
        assert_eq!(seconds(step_phases(&links(), true, false)), (10.0, "the drive", 4.0, "the cores and the drive in turn"));
        // Nothing on the drive after the sweep: the cores alone.
        let nothing_after = StepLinks { rest_drive_s: 0.0, ..links() };
        assert_eq!(seconds(step_phases(&nothing_after, true, false)), (10.0, "the drive", 3.0, "the cores"));
        // Working copies read ahead and gradients written behind hide behind the kernels; the rest of
        // the drive's bytes still follow them.
        let ahead = StepLinks { rest_drive_s: 1.5, background_drive_s: 1.0, ..links() };
        assert_eq!(seconds(step_phases(&ahead, true, false)), (10.0, "the drive", 3.5, "the cores and the drive in turn"));
        let only_ahead = StepLinks { rest_drive_s: 1.0, background_drive_s: 1.0, ..links() };
        assert_eq!(seconds(step_phases(&only_ahead, true, false)), (10.0, "the drive", 3.0, "the cores"));
        let reads_longer = StepLinks { rest_drive_s: 4.0, background_drive_s: 4.0, ..links() };
        assert_eq!(seconds(step_phases(&reads_longer, true, false)), (10.0, "the drive", 4.0, "the drive"));
        let update_bound = StepLinks { adam_s: 12.0, ..links() };
        assert_eq!(seconds(step_phases(&update_bound, false, false)).1, "the update");
        // Nothing overlaps in the sequential schedule.
        assert_eq!(seconds(step_phases(&links(), false, true)), (5.0, "the device", 10.0, "the drive"));
    }
}
