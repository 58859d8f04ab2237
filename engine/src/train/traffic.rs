//! The NVMe tier's traffic per step, predicted from what the trainer runs: the step's schedule
//! (`pipeline::step_schedule`, the same list `Trainer::train_step` executes), the block slots the plan
//! gives, and the tier of each kind of state. `plan` and `train` print it per parameter; the metrics'
//! `nvme_read_bytes` / `nvme_written_bytes` of a run with `--sequential` equal it exactly
//! (`tests/nvme_traffic.rs`; overlapped, the update's sweep runs into the next step).
//!
//! What moves, for this rank's share of each group (its slices; the working copy as it keeps it):
//! - the update's sweep reads the master weights, both moments and the gradient, writes the master
//!   weights and moments back and writes the new working copy;
//! - each gradient download (every group's, every micro-batch) is added into the accumulator: read
//!   (except the step's first contribution, which overwrites it) and written back; stage 1 with
//!   several ranks once per step (the whole sums stay in RAM until the step's end);
//! - each upload reads the working copy (a block still in its device slot this step is not read again),
//!   and with several ranks in stages 1-2 the first upload after an update writes it back completed by
//!   the all-gather; a block `--params-ram-cache` holds ([`cached_working_blocks`]) stays in RAM from
//!   its forward upload to its backward one, so the second reads nothing (and a gathered copy is
//!   written back after it); overlapped, a group's first upload of the step reads nothing either: the
//!   sweep kept the copy it wrote resident for it (`worker::FRESH_COPIES_AHEAD`; not after a
//!   validation, a checkpoint or a skipped step, and LAMB or LARS with several ranks keep only what
//!   fits without waiting, so the forward may read some).

use std::ops::Range;

use zerostream_offload::Tier;

use super::config::TrainConfig;
use super::pipeline::{Op, step_schedule};
use super::shard::{GroupShard, Sharding};

/// Bytes one kind of state reads and writes on NVMe in one step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadWrite {
    pub read_bytes: u64,
    pub written_bytes: u64,
}

impl ReadWrite {
    fn add(&mut self, read_bytes: u64, written_bytes: u64) {
        self.read_bytes += read_bytes;
        self.written_bytes += written_bytes;
    }
}

/// One rank's NVMe traffic in a steady step (every update applied), by kind of state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeTraffic {
    /// fp32 master weights and Adam moments (fp32 or bf16).
    pub optimizer: ReadWrite,
    /// The fp32 gradient accumulator.
    pub gradients: ReadWrite,
    /// The working copy.
    pub working: ReadWrite,
    /// Of all these, the bytes moved while the update's sweep runs (overlapped, it runs beside the
    /// next step's first forward): the sweep's own and that forward's uploads. The rest move in the
    /// step's other micro-batches and its backward.
    pub during_sweep: ReadWrite,
    /// Of the rest, the working copy's bytes read ahead (`Op::ReadAhead`): read while the block before
    /// computes, not in turn with it.
    pub read_ahead_bytes: u64,
    /// Of the rest, the blocks' gradients written back behind the next block's backward (the
    /// write-behind thread), not in turn with it.
    pub written_behind_bytes: u64,
    /// Micro-batches of this rank per step.
    pub micro_batches: usize,
    /// Overlapped: the working copy's bytes the forward takes from the sweep's fresh copies rather than
    /// the drive (read in a run's first step, which no sweep precedes).
    pub fresh_working_bytes: u64,
}

/// The blocks whose working copy `--params-ram-cache` keeps in RAM between their forward and
/// backward uploads: those evicted from their device slots before the backward needs them (all but
/// the last `block_slots`), the nearest the turn first, as many as the cache holds at rank 0's share
/// (the largest). Empty with the working copy in RAM. The one place this is decided: the trainer,
/// the traffic and the plan's RAM all take it from here.
pub fn cached_working_blocks(tc: &TrainConfig, world: usize, group_lens: &[usize], block_slots: usize) -> Range<usize> {
    let n_layer = group_lens.len().saturating_sub(1);
    let evicted = n_layer.saturating_sub(block_slots.max(1));
    if tc.offload_params != Tier::Nvme || evicted == 0 {
        return 0..0;
    }
    let sharding = Sharding { rank: 0, world: world.max(1), stage: tc.zero_stage };
    let block_bytes = |b: usize| (tc.precision.working_bytes_per_param() * sharding.group(group_lens[1 + b]).working_len) as u64;
    let (mut first, mut held_bytes) = (evicted, 0u64);
    while first > 0 && held_bytes + block_bytes(first - 1) <= tc.params_ram_cache_bytes {
        first -= 1;
        held_bytes += block_bytes(first);
    }
    first..evicted
}

impl NvmeTraffic {
    /// The traffic of rank 0 (the largest share) of a run of `world` ranks with `block_slots` device
    /// slots, over groups of `group_lens` elements (the head first).
    pub fn of(tc: &TrainConfig, world: usize, group_lens: &[usize], block_slots: usize) -> Self {
        let sharding = Sharding { rank: 0, world: world.max(1), stage: tc.zero_stage };
        let shards: Vec<GroupShard> = group_lens.iter().map(|&len| sharding.group(len)).collect();
        let nvme = |tier: Tier| tier == Tier::Nvme;
        let (optimizer_on, grads_on) = (nvme(tc.offload_optimizer), nvme(tc.gradients_tier()));
        let slice_bytes = |k: usize| 4 * shards[k].slice_len() as u64;
        // A compressed exchange reads and writes the group's error-feedback residual each time.
        let residuals = super::grad_exchange::residual_lens(tc, &sharding, &shards);
        let residual_bytes = |k: usize| if grads_on { 4 * residuals.get(k).copied().unwrap_or(0) as u64 } else { 0 };
        let state_bytes = |k: usize| (tc.state_bytes_per_param() * shards[k].slice_len()) as u64;
        let mut working = WorkingUploads::new(tc, world, group_lens, block_slots, &sharding, &shards);
        let mut t = NvmeTraffic { micro_batches: tc.grad_accum, ..Default::default() };

        let n_layer = group_lens.len().saturating_sub(1);
        let slots = block_slots.max(1);
        let mut slot_holds: Vec<Option<usize>> = vec![None; slots];
        let mut micro = 0;
        // Until the step's first vocabulary head, its forward runs beside the previous update's sweep.
        let mut beside_sweep = true;
        // The block whose working copy an `Op::ReadAhead` asked for, until its fetch.
        let mut ahead = None;
        for op in step_schedule(n_layer, tc.grad_accum, !tc.sequential) {
            let before = t.total();
            beside_sweep &= op != Op::Head;
            match op {
                Op::FetchHead => working.upload(&mut t, 0),
                Op::Embed { micro: m } => micro = m,
                Op::ReadAhead { block } => ahead = Some(block),
                // A block still in its slot this step is not uploaded again.
                Op::Fetch { block } if slot_holds[block % slots] != Some(block) => {
                    slot_holds[block % slots] = Some(block);
                    let read_before = t.working.read_bytes;
                    working.upload(&mut t, 1 + block);
                    if ahead.take() == Some(block) && !beside_sweep {
                        t.read_ahead_bytes += t.working.read_bytes - read_before;
                    }
                }
                Op::FinishDownload { .. } | Op::DownloadHead if grads_on && sharding.shards_grads() => {
                    let k = if let Op::FinishDownload { block } = op { 1 + block } else { 0 };
                    let read = if micro == 0 { 0 } else { slice_bytes(k) };
                    // Stage 0 exchanges (and reads and writes the residual) with the last micro-batch only.
                    let exchanged = !sharding.replicates() || micro + 1 == tc.grad_accum;
                    let residual = if exchanged { residual_bytes(k) } else { 0 };
                    t.gradients.add(read + residual, slice_bytes(k) + residual);
                    if !tc.sequential && !beside_sweep {
                        t.written_behind_bytes += slice_bytes(k);
                    }
                }
                Op::ReduceStage1 if grads_on && !sharding.shards_grads() => {
                    (0..group_lens.len()).for_each(|k| t.gradients.add(residual_bytes(k), slice_bytes(k) + residual_bytes(k)));
                }
                Op::Update => {
                    working.release_held(&mut t);
                    for k in 0..group_lens.len() {
                        if optimizer_on {
                            t.optimizer.add(state_bytes(k), state_bytes(k));
                        }
                        if grads_on {
                            t.gradients.add(slice_bytes(k), 0);
                        }
                        working.updated(&mut t, k);
                    }
                }
                _ => {}
            }
            if beside_sweep || op == Op::Update {
                let after = t.total();
                t.during_sweep.add(after.read_bytes - before.read_bytes, after.written_bytes - before.written_bytes);
            }
        }
        t
    }

    pub fn total(&self) -> ReadWrite {
        let mut all = ReadWrite::default();
        for rw in [self.optimizer, self.gradients, self.working] {
            all.add(rw.read_bytes, rw.written_bytes);
        }
        all
    }

    /// One line: read and written per step, in all and per parameter (of `params`) for each kind, per
    /// micro-batch, and what of it moves beside the kernels; or that nothing is on NVMe.
    pub fn describe(&self, params: usize) -> String {
        let all = self.total();
        if all == ReadWrite::default() {
            return "NVMe per step: nothing (no state on NVMe)".to_string();
        }
        let per = |b: u64| b as f64 / params.max(1) as f64;
        let gb = |b: u64| b as f64 / 1e9;
        let kinds = [("optimizer", self.optimizer), ("gradients", self.gradients), ("working copy", self.working)]
            .iter()
            .filter(|(_, rw)| *rw != ReadWrite::default())
            .map(|(name, rw)| format!("{name} {:.2}/{:.2}", per(rw.read_bytes), per(rw.written_bytes)))
            .collect::<Vec<_>>()
            .join(", ");
        let m = self.micro_batches.max(1) as u64;
        let background = match (self.read_ahead_bytes, self.written_behind_bytes) {
            (0, 0) => String::new(),
            (read, written) => format!("; beside the kernels: {:.2} GB read ahead, {:.2} GB written behind", gb(read), gb(written)),
        };
        format!(
            "NVMe per step: read {:.2} GB, written {:.2} GB ({:.2} and {:.2} bytes per parameter; read/written by kind: {kinds}); \
             per micro-batch of {m}: {:.2} / {:.2} bytes per parameter{background}",
            gb(all.read_bytes),
            gb(all.written_bytes),
            per(all.read_bytes),
            per(all.written_bytes),
            per(all.read_bytes) / m as f64,
            per(all.written_bytes) / m as f64,
        )
    }
}

/// The working copy's side of [`NvmeTraffic::of`]: what each upload reads and writes back, given what
/// is held in RAM, gathered or kept fresh by the sweep. Counts nothing with the working copy in RAM.
struct WorkingUploads {
    on_nvme: bool,
    /// Per group: this rank's working copy in bytes.
    bytes: Vec<u64>,
    /// Overlapped, each group's first upload of the step takes the copy the sweep kept fresh
    /// (`worker::FRESH_COPIES_AHEAD`): it reads nothing.
    fresh: bool,
    /// Stages 1-2 with several ranks gather the working copy in place on its first upload after an
    /// update, and write it back.
    gathers: bool,
    /// The blocks `--params-ram-cache` holds from their forward upload to their backward one
    /// ([`cached_working_blocks`]).
    cached: Range<usize>,
    uploaded: Vec<bool>,
    gathered: Vec<bool>,
    /// Held in RAM since its forward upload: Some(whether a gather completed it, to be written back).
    held: Vec<Option<bool>>,
}

impl WorkingUploads {
    fn new(tc: &TrainConfig, world: usize, group_lens: &[usize], block_slots: usize, sharding: &Sharding, shards: &[GroupShard]) -> Self {
        let groups = group_lens.len();
        WorkingUploads {
            on_nvme: tc.offload_params == Tier::Nvme,
            bytes: shards.iter().map(|s| (tc.precision.working_bytes_per_param() * s.working_len) as u64).collect(),
            fresh: !tc.sequential,
            gathers: sharding.gathers_working(),
            cached: cached_working_blocks(tc, world, group_lens, block_slots),
            uploaded: vec![false; groups],
            gathered: vec![false; groups],
            held: vec![None; groups],
        }
    }

    /// Group `k` uploaded.
    fn upload(&mut self, t: &mut NvmeTraffic, k: usize) {
        if !self.on_nvme {
            return;
        }
        let was_held = self.held[k].take();
        let fresh_copy = self.fresh && !std::mem::replace(&mut self.uploaded[k], true);
        if fresh_copy {
            t.fresh_working_bytes += self.bytes[k];
        }
        let read = if was_held.is_some() || fresh_copy { 0 } else { self.bytes[k] };
        let dirty = (self.gathers && !std::mem::replace(&mut self.gathered[k], true)) || was_held == Some(true);
        // Kept from a forward upload, and written back (if a gather completed it) after the
        // backward's (see `Trainer::upload_group_keeping`).
        if was_held.is_none() && k > 0 && self.cached.contains(&(k - 1)) {
            self.held[k] = Some(dirty);
            t.working.add(read, 0);
        } else {
            t.working.add(read, if dirty { self.bytes[k] } else { 0 });
        }
    }

    /// What is still held goes back before the update (`Trainer::release_held`).
    fn release_held(&mut self, t: &mut NvmeTraffic) {
        for (k, h) in self.held.iter_mut().enumerate() {
            if h.take() == Some(true) {
                t.working.add(0, self.bytes[k]);
            }
        }
    }

    /// The update's sweep wrote group `k`'s new working copy.
    fn updated(&self, t: &mut NvmeTraffic, k: usize) {
        if self.on_nvme {
            t.working.add(0, self.bytes[k]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Overlapped, the sweep's bytes move beside the sweep, and the first forward's uploads read nothing
    /// (they take the sweep's fresh copies); the backward's re-upload and the gradients' writes (each
    /// group's, behind) come after it. Sequential, every upload reads.
    #[test]
    fn the_sweep_moves_beside_the_first_forward_which_takes_its_fresh_copies() {
        let tc = TrainConfig { offload_optimizer: Tier::Nvme, offload_params: Tier::Nvme, ..Default::default() };
        let lens = [1024, 640, 640];
        let t = NvmeTraffic::of(&tc, 1, &lens, 1);
        let working_once: u64 = lens.iter().map(|&n| 4 * n as u64).sum();
        assert_eq!(t.fresh_working_bytes, working_once, "every group's first upload takes a fresh copy");
        // The optimizer's bytes and the gradients' sweep reads are the sweep's; block 0 is evicted by
        // block 1 and read again for its backward.
        let beside = ReadWrite {
            read_bytes: t.optimizer.read_bytes + t.gradients.read_bytes,
            written_bytes: t.optimizer.written_bytes + t.working.written_bytes,
        };
        assert_eq!(t.during_sweep, beside);
        let all = t.total();
        assert_eq!(all.read_bytes - beside.read_bytes, 4 * 640, "block 0's second upload");
        assert_eq!(all.written_bytes - beside.written_bytes, t.gradients.written_bytes);
        assert!(t.gradients.written_bytes > 0);
        assert_eq!(t.read_ahead_bytes, 4 * 640, "block 0's second upload is read ahead, during block 1's backward");
        assert_eq!(t.written_behind_bytes, 4 * (1024 + 2 * 640), "every group's gradient is written behind, the head's too");

        let sequential = NvmeTraffic::of(&TrainConfig { sequential: true, ..tc }, 1, &lens, 1);
        assert_eq!(sequential.fresh_working_bytes, 0);
        assert_eq!(sequential.working.read_bytes, t.working.read_bytes + working_once);
        assert_eq!((sequential.read_ahead_bytes, sequential.written_behind_bytes), (0, 0), "nothing in the background in sequence");
    }
}
