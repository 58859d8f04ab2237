//! The gradients' reduce-scatter between ranks (their all-reduce, in stage 0), compressed or not
//! (`--grad-compression`), with this rank's error-feedback residuals: one per group, holding what the
//! encodings of the slices this rank sends dropped (world - 1 slices: this rank's own crosses no wire;
//! stage 0 at 2 ranks: the whole group, which every rank sends and decodes; from 3 ranks: the other
//! ranks' slices and then the own slice's second encoding, `Comm::all_reduce_sum_compressed`), on the gradients' tier (paged in
//! around each exchange, like the gradient accumulator) and checkpointed in the rank's optimizer file
//! as `{group}.grad_residual`, so a resumed run equals an uninterrupted one bit for bit.

use anyhow::{Result, bail};
use zerostream_offload::{NvmeDir, Stored};

use super::checkpoint::Checkpoint;
use super::shard::{GroupShard, Sharding};
use super::{ModelSource, TrainConfig};
use crate::comm::Comm;
use crate::comm::compress::{Codec, GradCompression};

pub(super) struct GradExchange {
    pub codec: Codec,
    /// Steps exchanged uncompressed first (`--grad-compression-warmup`).
    warmup_steps: u64,
    /// Per group (empty: no compression, or one rank).
    pub residuals: Vec<Stored>,
    /// Stage 0 with several ranks: gradients all-reduced, every rank owning the whole.
    all_reduce: bool,
    /// Stage 0's compressed all-reduce in two phases (`--all-reduce-phases`).
    two_phases: bool,
    /// Per group: where its padding lies in the exchange's result and in its residual (see
    /// [`Padding`]); empty without residuals.
    padding: Vec<Padding>,
}

/// The places of a group's padding (elements past its tensors, zero in every gradient sent) in this
/// rank's reduced values and in its residual. A codec's scale covers a chunk, and a chunk can reach
/// into the padding: the zeros there decode as plus or minus the scale, so those elements are zeroed
/// after each exchange. Left, they would count in the gradient norm, and in stage 0, where the result
/// is what the next step sends, grow step after step.
#[derive(Default)]
struct Padding {
    in_result: Vec<std::ops::Range<usize>>,
    in_residual: Vec<std::ops::Range<usize>>,
}

impl Padding {
    fn of(shard: &GroupShard, sharding: &Sharding, two_phases: bool) -> Self {
        let pad = shard.len..shard.padded_len;
        // `covered` (group coordinates) laid out from `at` in a buffer: its padding there.
        let within = |covered: std::ops::Range<usize>, at: usize| {
            super::shard::intersect(pad.clone(), &covered).map(|r| r.start - covered.start + at..r.end - covered.start + at)
        };
        let (world, rank) = (sharding.world, sharding.rank);
        let slice = shard.padded_len / world;
        // The reduce-scatter's residual: the other ranks' slices, in rank order.
        let others = || (0..world).filter(move |&r| r != rank);
        let worker = others().enumerate().filter_map(|(i, r)| within(r * slice..(r + 1) * slice, i * slice));
        if !sharding.replicates() {
            return Padding { in_result: within(shard.owned.clone(), 0).into_iter().collect(), in_residual: worker.collect() };
        }
        let whole = within(0..shard.padded_len, 0);
        // Stage 0's all-reduce: one phase, the whole group; two phases, the reduce-scatter's residual
        // and then this rank's own slice (comm::all_reduce_sum_compressed).
        let in_residual = if two_phases {
            worker.chain(within(rank * slice..(rank + 1) * slice, (world - 1) * slice)).collect()
        } else {
            whole.clone().into_iter().collect()
        };
        Padding { in_result: whole.into_iter().collect(), in_residual }
    }

    fn zero(ranges: &[std::ops::Range<usize>], values: &mut [f32]) {
        ranges.iter().for_each(|r| values[r.clone()].fill(0.0));
    }
}

/// Elements of a group's residual: the slices of every other rank (stage 0: the whole group's worth,
/// laid out as `Comm::all_reduce_sum_compressed` says).
fn residual_len(shard: &GroupShard, sharding: &Sharding) -> usize {
    if sharding.replicates() { shard.padded_len } else { (sharding.world - 1) * shard.slice_len() }
}

/// Elements of each group's residual in a run of `train` split as `sharding` says (none without
/// compression or with one rank): what the plan counts.
pub(super) fn residual_lens(train: &TrainConfig, sharding: &Sharding, shards: &[GroupShard]) -> Vec<usize> {
    if train.grad_compression == GradCompression::None || sharding.world < 2 {
        return Vec::new();
    }
    shards.iter().map(|s| residual_len(s, sharding)).collect()
}

impl GradExchange {
    /// The exchange for `train`'s mode: residuals from the checkpoint being resumed at the same world
    /// size, else zero; `notes` gets why a mode does nothing or residuals start again.
    pub fn new(
        train: &TrainConfig,
        sharding: &Sharding,
        shards: &[GroupShard],
        names: &[&str],
        source: &ModelSource<'_>,
        nvme: Option<&NvmeDir>,
        notes: &mut Vec<String>,
    ) -> Result<Self> {
        let codec = Codec::new(train.grad_compression, train.grad_compression_chunk)?;
        let (warmup_steps, all_reduce) = (train.grad_compression_warmup, sharding.replicates());
        let two_phases = train.all_reduce_phases.two_at(sharding.world);
        let mut residuals = Vec::new();
        if codec.mode == GradCompression::None {
            return Ok(GradExchange { codec, warmup_steps, residuals, all_reduce, two_phases, padding: Vec::new() });
        }
        if sharding.world == 1 {
            notes.push(format!("--grad-compression {} does nothing with one rank: no gradient crosses between ranks", codec.mode));
            return Ok(GradExchange { codec, warmup_steps, residuals, all_reduce, two_phases, padding: Vec::new() });
        }
        if all_reduce && warmup_steps == 0 {
            notes.push(format!(
                "--grad-compression {} at --zero-stage 0 encodes every rank's whole gradient, its own part too: on the small models of \
                 benches/results/2026-11-28-stage0-slow-network.md at 2 ranks onebit's loss after 300 steps trailed none's by 14-18% without \
                 --grad-compression-warmup, by 2-4% with 100 warm-up steps, and by 0.6-1.4% with \
                 --grad-compression-warmup 150 --freeze-variance (benches/results/2026-11-28-frozen-variance.md)",
                codec.mode
            ));
        }
        // Stage 0's residuals cover the whole group's worth, the other stages' the other ranks'
        // slices. Checkpoints that do not record the layout (before stage 0 took two phases from 3
        // ranks on) laid out the stage's as one phase.
        let layout = super::checkpoint::residual_layout(sharding, two_phases);
        let same_split = |c: &Checkpoint| {
            let recorded = c.rank_metadata(sharding.rank, "grad_residual_layout");
            let recorded = recorded.as_deref().unwrap_or(if c.state.zero_stage == 0 { "whole group" } else { "other ranks' slices" });
            // The layout tells stage 0 from the sharded stages, so only the world size is left to compare.
            c.state.world_size == sharding.world && recorded == layout
        };
        let resumed = match source {
            ModelSource::Checkpoint(c) if same_split(c) => Some(c),
            ModelSource::Checkpoint(c) => {
                let old_layout =
                    c.rank_metadata(sharding.rank, "grad_residual_layout").map(|l| format!(", laid out as {l}")).unwrap_or_default();
                notes.push(format!(
                    "--grad-compression {}: the error-feedback residuals of the checkpoint's {} ranks at ZeRO stage {}{old_layout} do not map onto \
                     {} ranks' at stage {}, laid out as {layout}; they start again from zero",
                    codec.mode,
                    c.state.world_size,
                    c.state.zero_stage,
                    sharding.world,
                    sharding.stage.number()
                ));
                None
            }
            _ => None,
        };
        for (shard, name) in shards.iter().zip(names) {
            let len = residual_len(shard, sharding);
            let mut r = Stored::new(&format!("{name}.grad_residual"), 4 * len, train.gradients_tier(), nvme)?;
            r.page_in_zeroed(nvme);
            if let Some(c) = resumed {
                read_residual(c, sharding.rank, name, shard, r.data_mut().as_mut_slice())?;
            }
            r.page_out(nvme, true)?;
            residuals.push(r);
        }
        let padding = shards.iter().map(|s| Padding::of(s, sharding, two_phases)).collect();
        Ok(GradExchange { codec, warmup_steps, residuals, all_reduce, two_phases, padding })
    }

    /// Whether group `k`'s exchange after `updates_applied` updates sends the values as they are
    /// (no compression, or still in its warm-up) as a plain reduce-scatter: what
    /// [`Comm::exchange_slices`] and [`Comm::sum_exchanged`] do in two halves.
    pub fn plain_reduce_scatter(&self, k: usize, updates_applied: u64) -> bool {
        !self.all_reduce && (self.residuals.get(k).is_none() || updates_applied < self.warmup_steps)
    }

    /// Group `k`'s reduce-scatter after `updates_applied` optimizer updates: `mine` = the sum over ranks
    /// of their parts of this rank's slice of `whole` (stage 0: of all of it, `mine` as long as
    /// `whole`), each sent as the codec encodes it (exactly, for `none` and during the warm-up). The
    /// warm-up counts applied updates, not steps, as `--freeze-variance` does, so a skipped step
    /// cannot start the compression before the variance is frozen.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &mut self,
        comm: &Comm,
        nvme: Option<&NvmeDir>,
        updates_applied: u64,
        k: usize,
        whole: &[f32],
        mine: &mut [f32],
        device_busy: bool,
    ) -> Result<()> {
        let residual = self.residuals.get_mut(k).filter(|_| updates_applied >= self.warmup_steps);
        let Some(residual) = residual else {
            return match self.all_reduce {
                true => comm.all_reduce_sum(whole, mine, device_busy),
                false => comm.reduce_scatter_sum(whole, mine, device_busy),
            };
        };
        residual.page_in(nvme)?;
        let (codec, values) = (&self.codec, residual.data_mut().as_mut_slice());
        match self.all_reduce {
            true => comm.all_reduce_sum_compressed(whole, mine, codec, values, self.two_phases, device_busy)?,
            false => comm.reduce_scatter_sum_compressed(whole, mine, codec, values, device_busy)?,
        }
        let padding = &self.padding[k];
        Padding::zero(&padding.in_result, mine);
        Padding::zero(&padding.in_residual, values);
        residual.page_out(nvme, true)?;
        Ok(())
    }
}

/// This rank's residual of `group` from checkpoint `c` (written by the same rank at the same world size).
/// Checkpoints from before the residual left out this rank's own slice hold the whole padded group,
/// with zeros there: those zeros are dropped.
fn read_residual(c: &Checkpoint, rank: usize, group: &str, shard: &GroupShard, out: &mut [f32]) -> Result<()> {
    match c.rank_tensor(rank, &format!("{group}.grad_residual"))? {
        Some(values) if values.len() == out.len() => {
            out.copy_from_slice(&values);
            Ok(())
        }
        Some(values) if values.len() == shard.padded_len => {
            let own = shard.owned.clone();
            let others = values[..own.start].iter().chain(&values[own.end..]);
            out.iter_mut().zip(others).for_each(|(o, v)| *o = *v);
            Ok(())
        }
        Some(values) => bail!(
            "{}: rank {rank}'s {group}.grad_residual holds {} values; this run's group needs {}",
            c.dir.display(),
            values.len(),
            out.len()
        ),
        None => bail!(
            "{}: rank {rank}'s optimizer file has no {group}.grad_residual (the error-feedback residual --grad-compression resumes from)",
            c.dir.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ZeroStage;

    /// `Padding::of` against a map built element by element: which group element each place of the
    /// result and of the residual holds (as the reduce-scatter and the all-reduce in one or two phases
    /// lay them out), at every stage, world 2-4 and phase count, for groups whose padding spans
    /// several slices.
    #[test]
    fn padding_lies_where_the_layout_puts_group_elements_past_the_tensors() {
        let expand = |ranges: &[std::ops::Range<usize>]| ranges.iter().flat_map(|r| r.clone()).collect::<Vec<_>>();
        for stage in [ZeroStage::Zero, ZeroStage::One, ZeroStage::Two, ZeroStage::Three] {
            for (world, two_phases) in (2..=4).flat_map(|w| [(w, false), (w, true)]) {
                for len in [1, 100, 64 * world + 1, 3 * 64 * world - 5] {
                    for rank in 0..world {
                        let sharding = Sharding { rank, world, stage };
                        let shard = sharding.group(len);
                        let slice = shard.padded_len / world;
                        let others: Vec<usize> = (0..world).filter(|&r| r != rank).collect();
                        // The group element at each place of the result and of the residual.
                        let result: Vec<usize> = shard.owned.clone().collect();
                        let mut residual: Vec<usize> = others.iter().flat_map(|&r| r * slice..(r + 1) * slice).collect();
                        if sharding.replicates() {
                            if two_phases {
                                residual.extend(rank * slice..(rank + 1) * slice);
                            } else {
                                residual = (0..shard.padded_len).collect();
                            }
                        }
                        assert_eq!(residual.len(), residual_len(&shard, &sharding));
                        let past = |at: &[usize]| at.iter().enumerate().filter(|(_, e)| **e >= len).map(|(i, _)| i).collect::<Vec<_>>();
                        let p = Padding::of(&shard, &sharding, two_phases);
                        let what = format!("stage {} world {world} rank {rank} len {len} two phases {two_phases}", stage.number());
                        assert_eq!(expand(&p.in_result), past(&result), "{what}: the result's padding");
                        assert_eq!(expand(&p.in_residual), past(&residual), "{what}: the residual's padding");
                    }
                }
            }
        }
    }
}
