//! The placement plan: where each kind of state lives and how many device bytes each part of a run
//! takes, decided once at start-up and held to `--gpu-mem-budget`.

use anyhow::{Result, bail};
use zerostream_offload::Tier;

use super::config::{AdamState, Optimizer, TrainConfig};
use super::layout::group_layouts;
use super::shard::{GroupShard, Sharding, ZeroStage};
use super::traffic::NvmeTraffic;
use crate::device::AllocCosts;
use crate::device::alloc::available_ram_bytes;
use crate::model::Model;

mod describe;
mod device_needs;
mod ranks;
use device_needs::DeviceNeeds;
pub(super) use device_needs::slot_format;
pub use ranks::{ScheduleLimit, plan_for_rank, plan_for_ranks};

/// Where everything lives and how many device bytes each part takes: decided once at start-up.
#[derive(Clone, Debug)]
pub struct Placement {
    pub optimizer_tier: Tier,
    /// Where the gradient accumulator lives (`--offload-gradients`, else the optimizer's tier).
    pub grads_tier: Tier,
    pub params_tier: Tier,
    pub params: usize,
    pub world_size: usize,
    pub zero_stage: ZeroStage,
    /// The moments' format (`--adam-state`).
    pub adam_state: AdamState,
    /// Whose moments they are (`--optimizer`).
    pub optimizer: Optimizer,
    /// Elements of each parameter group (the head first), as the trainer lays them out.
    pub group_lens: Vec<usize>,
    /// Per rank: this rank's fp32 master weights and Adam moments (1/N of them from stage 1 on).
    pub host_optimizer_bytes: u64,
    /// Per rank: the working copy (1/N of it in stage 3).
    pub host_working_bytes: u64,
    /// Per rank: the gradient accumulator (this rank's slices), on `grads_tier`.
    pub host_grad_bytes: u64,
    /// Per rank, with `--grad-compression` and several ranks: the error-feedback residuals (the other
    /// ranks' slices of every group), on `grads_tier`.
    pub host_residual_bytes: u64,
    /// Per rank, stage 1 with several ranks: each block's whole gradient summed over this rank's
    /// micro-batches before the end-of-step reduce-scatter, in RAM.
    pub host_stage1_grad_bytes: u64,
    /// Per rank: the most host RAM the NVMe-tier state takes while paged in at once (0 without an NVMe
    /// tier): the update's sweep holds three groups (read ahead, updated, written back) with their
    /// gradients, and the device thread one group's gradient and one working copy; overlapped, the
    /// fresh working copies the sweep keeps for the next forward (`worker::FRESH_COPIES_AHEAD`) and
    /// the one read ahead of its upload.
    pub host_paged_in_bytes: u64,
    /// Per rank, on NVMe beside the state while a run is open: the spare files shard writes go into
    /// (`zerostream_offload::SPARES_PER_SIZE` of each shard size at most; 0 without an NVMe tier).
    pub host_nvme_spare_bytes: u64,
    /// Per rank, on the gpu device: its host staging (`AllocCosts::host_staging_bytes`), the
    /// read-backs in flight (a backward's two blocks of gradients, or two vocabulary chunks') and the
    /// finished ones it keeps for reuse (`AllocCosts::spare_readback_bytes`); 0 on the
    /// cpu device, whose whole memory is RAM instead (`host_device_bytes`).
    pub device_staging_bytes: u64,
    /// The device's memory is host RAM (`AllocCosts::memory_is_ram`: the cpu device).
    pub device_memory_is_ram: bool,
    /// Whether the output projection (V, C) is resident on the device whole, with every vocabulary
    /// chunk's logits, or uploaded a chunk at a time with one chunk's logits (when the budget cannot
    /// hold it whole). The embedding's rows are gathered on the host either way.
    pub vocab_resident: bool,
    /// Each rank's device bytes in all, where the ranks' devices hold different amounts (a cpu rank
    /// beside a GPU, GPUs of other sizes: [`plan_for_rank`]); empty where every rank's are these.
    pub device_bytes_by_rank: Vec<u64>,
    pub device_head_bytes: u64,
    pub device_block_slot_bytes: u64,
    pub device_activation_bytes: u64,
    /// Two blocks' gradient buffers, the token ids' and 16-bit uploads' staging, and what the device
    /// holds from the moment it opens (`AllocCosts::fixed_bytes`).
    pub device_other_bytes: u64,
    /// Block parameter slots on the device (2 at least; all blocks if the budget allows).
    pub block_slots: usize,
    /// The blocks whose working copy `--params-ram-cache` keeps in RAM from forward to backward.
    pub cached_working_blocks: std::ops::Range<usize>,
    pub device_budget_bytes: Option<u64>,
    /// Rank 0's NVMe reads and writes in a steady step, by kind of state.
    pub nvme_traffic: NvmeTraffic,
}

impl Placement {
    /// Device bytes planned in all.
    pub fn device_bytes(&self) -> u64 {
        self.device_head_bytes
            + self.block_slots as u64 * self.device_block_slot_bytes
            + self.device_activation_bytes
            + self.device_other_bytes
    }

    /// Host bytes per rank in RAM and on NVMe (by the tiers chosen).
    pub fn host_bytes_per_rank(&self) -> (u64, u64) {
        let mut ram = self.host_stage1_grad_bytes + self.host_paged_in_bytes;
        let mut nvme = 0;
        for (bytes, tier) in [
            (self.host_optimizer_bytes, self.optimizer_tier),
            (self.host_grad_bytes + self.host_residual_bytes, self.grads_tier),
            (self.host_working_bytes, self.params_tier),
        ] {
            if tier == Tier::Nvme { nvme += bytes } else { ram += bytes }
        }
        (ram, nvme)
    }

    /// Per rank: host RAM the device takes besides the state: the cpu device's whole memory, or the
    /// gpu device's host staging.
    pub fn host_device_bytes(&self) -> u64 {
        if self.device_memory_is_ram { self.device_bytes() } else { self.device_staging_bytes }
    }

    /// Host RAM per rank: the state in RAM (`host_bytes_per_rank`) and what the device takes of it
    /// (`host_device_bytes`). What the RAM check, the summary and `--params-ram-cache auto` count.
    pub fn ram_bytes_per_rank(&self) -> u64 {
        self.host_bytes_per_rank().0 + self.host_device_bytes()
    }

    /// One line: the host state per rank and for all ranks on one machine, against the RAM this
    /// machine has available now.
    pub fn host_summary(&self) -> String {
        self.host_verdict().0
    }

    /// [`Self::host_summary`]'s line, and whether all ranks' host RAM fits in the RAM available here
    /// (None: unknown), from one reading of it: `plan`'s output and exit code.
    pub fn host_verdict(&self) -> (String, Option<bool>) {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let (ram, nvme) = (self.ram_bytes_per_rank(), self.host_bytes_per_rank().1);
        let all = ram * self.world_size as u64;
        let available = available_ram_bytes();
        let fits = available.map(|avail| all <= avail);
        let verdict = match available {
            Some(avail) if all <= avail => format!("fits in the {:.1} GiB of RAM available here", gib(avail)),
            Some(avail) => format!("does NOT fit in the {:.1} GiB of RAM available here ({})", gib(avail), self.ram_advice()),
            None => "RAM available here unknown".to_string(),
        };
        let line = format!(
            "host state per rank: {:.2} GiB in RAM (state paged in from NVMe and the device's {:.2} GiB included), {:.2} GiB on NVMe{}; {} on one machine: {:.2} GiB of RAM, {verdict}",
            gib(ram),
            gib(self.host_device_bytes()),
            gib(nvme),
            if self.host_nvme_spare_bytes > 0 {
                format!(" (+ up to {:.2} GiB of spare files while running)", gib(self.host_nvme_spare_bytes))
            } else {
                String::new()
            },
            crate::words::counted(self.world_size as u64, "rank"),
            gib(all)
        );
        (line, fits)
    }

    /// What would lower the RAM a run needs: the state still in RAM put on NVMe, or — everything
    /// there already — what the RAM then holds, which only more ranks (each paging in its own slice)
    /// shrink.
    fn ram_advice(&self) -> String {
        let in_ram: Vec<&str> = [
            (self.optimizer_tier, "--offload-optimizer nvme"),
            (self.grads_tier, "--offload-gradients nvme"),
            (self.params_tier, "--offload-params nvme"),
        ]
        .into_iter()
        .filter(|(tier, _)| *tier == Tier::Ram)
        .map(|(_, flag)| flag)
        .collect();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        if in_ram.is_empty() {
            format!(
                "all state is on NVMe already: the RAM holds the state paged in at once (and any whole-block gradient sums), {:.2} GiB, and the device's {:.2} GiB; \
                 more ranks, on other machines, each page in a smaller slice",
                gib(self.host_paged_in_bytes + self.host_stage1_grad_bytes),
                gib(self.host_device_bytes())
            )
        } else {
            format!("put more state on NVMe: {}; or more ranks on other machines", in_ram.join(", "))
        }
    }

    /// Refuses, with the numbers, a run whose NVMe state (and spare files) for `ranks_here` ranks on
    /// this machine would not fit in the free space of `dirs`' file systems, each directory holding an
    /// equal share when the state is striped (counting the shard files of an earlier run there, which it
    /// overwrites): better at start-up than a full disk mid-write. Directories on one file system share
    /// its free space, so they are checked together.
    pub fn check_nvme_room(&self, dirs: &[std::path::PathBuf], ranks_here: usize) -> Result<()> {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let (_, state) = self.host_bytes_per_rank();
        if state == 0 || dirs.is_empty() {
            return Ok(());
        }
        let stripes = dirs.len() as u64;
        let share = ((state + self.host_nvme_spare_bytes) * ranks_here as u64).div_ceil(stripes);
        for group in zerostream_offload::by_file_system(dirs) {
            let Ok(free) = zerostream_offload::free_bytes(&dirs[group[0]]) else { continue };
            let reused: u64 = group.iter().map(|&d| zerostream_offload::shard_bytes_in(&dirs[d], self.world_size)).sum();
            let need = share * group.len() as u64;
            if need > free + reused {
                let names: Vec<String> = group.iter().map(|&d| dirs[d].display().to_string()).collect();
                let (here, fs) = match group.len() {
                    1 => ("in this directory".to_string(), "its file system has"),
                    n => (format!("in these {n} directories, which share a file system"), "it has"),
                };
                bail!(
                    "--nvme-dir {}: {:.2} GiB needed on NVMe{} for {} here ({:.2} GiB of state and up to {:.2} GiB of \
                     spare files per rank), but {fs} {:.2} GiB free{}: free some space, give a larger disk, stripe \
                     over more directories on other disks, or keep part of the state in RAM (--offload-params ram)",
                    names.join(", "),
                    gib(need),
                    if stripes > 1 { format!(" {here}, {}/{stripes} of the striped state", group.len()) } else { String::new() },
                    crate::words::counted(ranks_here as u64, "rank"),
                    gib(state),
                    gib(self.host_nvme_spare_bytes),
                    gib(free),
                    if reused > 0 {
                        format!(" (+ {:.2} GiB of an earlier run's shards there, which it overwrites)", gib(reused))
                    } else {
                        String::new()
                    }
                );
            }
        }
        Ok(())
    }

    /// The RAM each of `ranks_here` ranks can give `--params-ram-cache auto` (this placement planned
    /// without a cache): what is available now less their RAM (`ram_bytes_per_rank`) and a margin of
    /// 1 GiB + 1/8 of what is available (the process itself, allocator slack, other programs); 0 when
    /// the RAM is unknown, or with the working copy in RAM.
    pub fn params_ram_cache_room(&self, ranks_here: usize) -> u64 {
        let Some(avail) = available_ram_bytes() else { return 0 };
        if self.params_tier != Tier::Nvme {
            return 0;
        }
        let per_rank = self.ram_bytes_per_rank();
        let margin = (1 << 30) + avail / 8;
        avail.saturating_sub(margin).saturating_sub(per_rank * ranks_here as u64) / ranks_here.max(1) as u64
    }

    /// Refuses, with the numbers, a run whose state in RAM for `ranks_here` ranks on this machine is
    /// more than the RAM available now: better at start-up than an abort when an allocation fails.
    pub fn check_host_ram(&self, ranks_here: usize) -> Result<()> {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let need = self.ram_bytes_per_rank() * ranks_here as u64;
        if let Some(avail) = available_ram_bytes()
            && need > avail
        {
            // Where most of a rank's RAM goes decides the advice.
            let mostly_device = 2 * self.host_device_bytes() >= self.ram_bytes_per_rank();
            let advice = if mostly_device && self.device_memory_is_ram {
                "most of it the cpu device's memory: set a --gpu-mem-budget, add --recompute or use a smaller --batch-size/--seq-len"
            } else if mostly_device {
                "most of it the GPUs' host staging: run fewer ranks on this machine"
            } else {
                "put the optimizer state and parameters on NVMe (--offload-optimizer nvme --offload-params nvme --nvme-dir DIR), \
                 use a higher --zero-stage, or spread the ranks over more machines"
            };
            bail!(
                "host RAM: {:.2} GiB needed for the state and devices of {} here ({:.2} GiB a rank the \
                 device's), but only {:.2} GiB is available: {advice}",
                gib(need),
                crate::words::counted(ranks_here as u64, "rank"),
                gib(self.host_device_bytes()),
                gib(avail)
            );
        }
        Ok(())
    }
}

/// Refuses work that needs `need_bytes` of RAM when less is available now (unchecked where the platform
/// does not say): better an error naming `what` asked for it than an abort when an allocation fails.
pub fn refuse_past_available_ram(need_bytes: u64, what: &str) -> Result<()> {
    if let Some(avail) = available_ram_bytes()
        && need_bytes > avail
    {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        bail!("{what}: needs about {:.1} GiB of RAM, but {:.1} GiB is available", gib(need_bytes), gib(avail));
    }
    Ok(())
}

/// The smallest `--gpu-mem-budget` that [`plan`] accepts for this model and configuration, on the gpu
/// device.
pub fn minimum_device_bytes(model: &Model, tc: &TrainConfig) -> u64 {
    minimum_device_bytes_on(model, tc, AllocCosts::GPU)
}

/// The smallest budget [`plan_on`] accepts on a device that allocates with `costs`.
pub fn minimum_device_bytes_on(model: &Model, tc: &TrainConfig, costs: AllocCosts) -> u64 {
    DeviceNeeds::of(model, tc, costs, false).minimum()
}

/// [`plan_on`] for the gpu device (the command line's `plan`, before any device is opened).
pub fn plan(model: &Model, tc: &TrainConfig, world_size: usize) -> Result<Placement> {
    plan_on(model, tc, world_size, AllocCosts::GPU)
}

/// Plans one rank's host and device memory in a run of `world_size` ranks on a device that allocates
/// with `costs` (`Backend::alloc_costs`), or refuses a budget that cannot hold the device minimum, with
/// the numbers. The device bytes planned are those the trainer allocates, tensor by tensor.
pub fn plan_on(model: &Model, tc: &TrainConfig, world_size: usize, costs: AllocCosts) -> Result<Placement> {
    plan_within(model, tc, world_size, costs, ScheduleLimit::NONE)
}

/// [`plan_on`] keeping at most `limit`'s block slots, and the output projection resident only where
/// `limit` allows it: the schedule another rank's device holds ([`ranks::plan_for_rank`]).
fn plan_within(model: &Model, tc: &TrainConfig, world_size: usize, costs: AllocCosts, limit: ScheduleLimit) -> Result<Placement> {
    let groups = group_layouts(model);
    let params: usize = groups.iter().map(|g| g.len).sum();
    let streamed = DeviceNeeds::of(model, tc, costs, false);
    let minimum = streamed.minimum();
    // The output projection stays resident whole when the budget holds it with two block slots.
    let resident = DeviceNeeds::of(model, tc, costs, true);
    let vocab_resident = limit.vocab_resident && tc.gpu_mem_budget.is_none_or(|budget| budget >= resident.minimum());
    let needs = if vocab_resident { resident } else { streamed };
    let block_slots = block_slots(model, tc, &needs, minimum)?.min(limit.block_slots);
    let DeviceNeeds { head_bytes, slot_bytes, activation_bytes, other_bytes } = needs;
    // Rank 0's share (the largest, with padding) of each kind of host state, group by group.
    let sharding = Sharding { rank: 0, world: world_size.max(1), stage: tc.zero_stage };
    let shards: Vec<_> = groups.iter().map(|g| sharding.group(g.len)).collect();
    let slices = shards.iter().map(|s| s.slice_len()).sum::<usize>() as u64;
    let working = shards.iter().map(|s| s.working_len).sum::<usize>() as u64;
    let residuals = super::grad_exchange::residual_lens(tc, &sharding, &shards);
    let group_lens: Vec<usize> = groups.iter().map(|g| g.len).collect();
    let cached_working_blocks = super::traffic::cached_working_blocks(tc, sharding.world, &group_lens, block_slots);
    let host_paged_in_bytes = host_paged_in_bytes(tc, &shards, &residuals, cached_working_blocks.clone());
    let host_nvme_spare_bytes = nvme_spare_bytes(tc, &shards, &residuals);
    let state_bytes = tc.state_bytes_per_param() as u64;
    // Stage 1 with several ranks keeps each group's whole gradient until the step's end.
    let stage1_grads = if sharding.shards_grads() { 0 } else { shards.iter().map(|s| s.padded_len).sum::<usize>() as u64 };
    let largest_block = group_lens[1..].iter().max().copied().unwrap_or(0);
    let vocab_chunk = model.vocab_chunks(tc.vocab_chunk_rows).rows_per_chunk * model.width();
    // In flight at once: two blocks' gradients, or two vocabulary chunks' (each read back while the
    // next computes).
    let read_backs = costs.tensor_bytes(2 * largest_block.max(vocab_chunk));
    // The largest read-back: a block's gradient, a vocabulary chunk's, or a micro-batch's embedding rows
    // (read back where the embedding stays on the host).
    let embed_rows = tc.batch * tc.seq_len * model.width();
    let largest_read = costs.tensor_bytes(largest_block.max(vocab_chunk).max(embed_rows));
    let spare_read_backs = costs.spare_readback_bytes(largest_read);
    Ok(Placement {
        optimizer_tier: tc.offload_optimizer,
        grads_tier: tc.gradients_tier(),
        params_tier: tc.offload_params,
        params,
        world_size: sharding.world,
        zero_stage: tc.zero_stage,
        adam_state: tc.adam_state,
        optimizer: tc.optimizer,
        group_lens: group_lens.clone(),
        host_optimizer_bytes: state_bytes * slices,
        host_working_bytes: tc.precision.working_bytes_per_param() as u64 * working,
        host_grad_bytes: 4 * slices,
        host_residual_bytes: 4 * residuals.iter().sum::<usize>() as u64,
        host_stage1_grad_bytes: 4 * stage1_grads,
        host_paged_in_bytes,
        host_nvme_spare_bytes,
        device_staging_bytes: if costs.memory_is_ram { 0 } else { costs.host_staging_bytes + spare_read_backs + read_backs },
        device_memory_is_ram: costs.memory_is_ram,
        vocab_resident,
        device_bytes_by_rank: Vec::new(),
        device_head_bytes: head_bytes,
        device_block_slot_bytes: slot_bytes,
        device_activation_bytes: activation_bytes,
        device_other_bytes: other_bytes,
        block_slots,
        cached_working_blocks,
        device_budget_bytes: tc.gpu_mem_budget,
        nvme_traffic: NvmeTraffic::of(tc, sharding.world, &group_lens, block_slots),
    })
}

/// How many block slots the device holds under `--gpu-mem-budget` (every block without one), or the
/// budget refused, with the numbers, when it cannot hold the `minimum` (two slots) of `needs`.
fn block_slots(model: &Model, tc: &TrainConfig, needs: &DeviceNeeds, minimum: u64) -> Result<usize> {
    let Some(budget) = tc.gpu_mem_budget else { return Ok(model.n_layer()) };
    let DeviceNeeds { head_bytes, slot_bytes, activation_bytes, other_bytes } = *needs;
    if budget < minimum {
        // "the minimum of N bytes" is read by scripts (benches/scale.sh): its words stay.
        use crate::words::size;
        bail!(
            "--gpu-mem-budget {budget} bytes ({}) cannot hold the minimum of {minimum} bytes ({}): \
             head parameters+gradients (one vocabulary chunk of the output projection) {}, 2 block slots x {}, activations {}{}, other {}. \
             Raise the budget, lower --batch-size/--seq-len{}",
            size(budget),
            size(minimum),
            size(head_bytes),
            size(slot_bytes),
            size(activation_bytes),
            if tc.recompute { " (with --recompute)" } else { "" },
            size(other_bytes),
            if tc.recompute { "" } else { ", or add --recompute" },
        );
    }
    let spare = budget - needs.minimum();
    Ok((model.n_layer().min(2) + (spare / slot_bytes.max(1)) as usize).min(model.n_layer()))
}

/// Per rank, the most host RAM the NVMe-tier state takes while paged in at once
/// ([`Placement::host_paged_in_bytes`]), from rank 0's shards (the largest) of each group, its
/// error-feedback residuals' lengths and the blocks `--params-ram-cache` holds.
fn host_paged_in_bytes(tc: &TrainConfig, shards: &[GroupShard], residuals: &[usize], cached: std::ops::Range<usize>) -> u64 {
    // The three largest groups (the sweep's), and the largest alone (the device thread's).
    let slice_lens = largest_first(shards.iter().map(|s| s.slice_len() as u64));
    let largest_working = shards.iter().map(|s| s.working_len as u64).max().unwrap_or(0);
    let working_bytes = tc.precision.working_bytes_per_param() as u64;
    let mut bytes = 0;
    // The sweep's three groups of master weights, moments and gradients; the device thread's gradient.
    if tc.offload_optimizer == Tier::Nvme {
        bytes += tc.state_bytes_per_param() as u64 * slice_lens.iter().take(3).sum::<u64>();
    }
    if tc.gradients_tier() == Tier::Nvme {
        // Overlapped, one more: the one written behind while the device thread adds the next.
        let device_thread = if tc.sequential { 1 } else { 2 };
        bytes += 4 * slice_lens.iter().take(3).sum::<u64>() + device_thread * 4 * slice_lens.first().copied().unwrap_or(0);
        // The device thread's residual, paged in around one group's exchange.
        bytes += 4 * residuals.iter().max().copied().unwrap_or(0) as u64;
    }
    if tc.offload_params == Tier::Nvme {
        // The one the sweep writes and the one the device thread uploads; overlapped, the fresh copies
        // the sweep keeps ahead of the forward and the next one read ahead (`background_io.rs`) too.
        let overlapped = if tc.sequential { 0 } else { super::worker::FRESH_COPIES_AHEAD as u64 + 1 };
        bytes += (2 + overlapped) * working_bytes * largest_working;
        bytes += working_bytes * cached.map(|b| shards[1 + b].working_len as u64).sum::<u64>();
    }
    bytes
}

/// Per rank, the spare files beside the NVMe-tier state ([`Placement::host_nvme_spare_bytes`]): a few
/// per distinct shard size (master, fp32 moments and gradient slices share theirs; bf16 moments and
/// the working copy have their own), each padded to whole pages with a footer page.
fn nvme_spare_bytes(tc: &TrainConfig, shards: &[GroupShard], residuals: &[usize]) -> u64 {
    let slice_lens = shards.iter().map(|s| s.slice_len() as u64);
    let mut spare_sizes = std::collections::BTreeSet::new();
    if tc.offload_optimizer == Tier::Nvme || tc.gradients_tier() == Tier::Nvme {
        spare_sizes.extend(slice_lens.clone().map(|n| 4 * n));
    }
    if tc.gradients_tier() == Tier::Nvme {
        spare_sizes.extend(residuals.iter().map(|&n| 4 * n as u64));
    }
    if tc.offload_optimizer == Tier::Nvme {
        spare_sizes.extend(slice_lens.map(|n| tc.adam_state.moment_bytes() as u64 * n));
    }
    if tc.offload_params == Tier::Nvme {
        spare_sizes.extend(shards.iter().map(|s| tc.precision.working_bytes_per_param() as u64 * s.working_len as u64));
    }
    let page = 4096;
    zerostream_offload::SPARES_PER_SIZE as u64 * spare_sizes.iter().map(|b| b.div_ceil(page) * page + page).sum::<u64>()
}

/// `lens`, the largest first.
fn largest_first(lens: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut lens: Vec<u64> = lens.collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    lens
}

#[cfg(test)]
mod tests;
