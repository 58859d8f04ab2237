//! One schedule for every rank where uploads are collective: at ZeRO stage 3 each block's upload
//! gathers its working copy from every rank's slice, so ranks whose devices hold different numbers of
//! block slots (a cpu rank beside a GPU, GPUs of other sizes) would pair different gathers (a panic
//! in-process, a hang or mixed weights under MPI). They keep the fewest slots any rank holds, and the
//! output projection resident only where every rank keeps it so; results do not change, only how
//! often the larger devices upload.

use anyhow::Result;

use super::{Placement, plan_on, plan_within};
use crate::comm::Comm;
use crate::device::AllocCosts;
use crate::model::Model;
use crate::train::TrainConfig;
use crate::train::shard::Sharding;

/// What a rank's schedule of uploads depends on besides the model: how many block slots the device
/// keeps, and whether the output projection stays resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleLimit {
    pub block_slots: usize,
    pub vocab_resident: bool,
}

impl ScheduleLimit {
    /// No limit: what the rank's own device holds.
    pub const NONE: ScheduleLimit = ScheduleLimit { block_slots: usize::MAX, vocab_resident: true };
}

impl Placement {
    /// The schedule this placement keeps.
    pub fn schedule(&self) -> ScheduleLimit {
        ScheduleLimit { block_slots: self.block_slots, vocab_resident: self.vocab_resident }
    }
}

/// Collective: this rank's placement ([`plan_on`] with its device's `costs`), under the schedule every
/// rank's device holds where the ranks' uploads are collective, with every rank's device total where
/// they differ (so the run's device line says whose it is).
pub fn plan_for_rank(model: &Model, tc: &TrainConfig, comm: &Comm, costs: AllocCosts) -> Result<Placement> {
    let world = comm.world_size();
    let mine = plan_on(model, tc, world, costs)?;
    if world == 1 {
        return Ok(mine);
    }
    let sharding = Sharding { rank: comm.rank(), world, stage: tc.zero_stage };
    let own = mine.schedule();
    let all = comm.gather_scalars([own.block_slots as u64, own.vocab_resident as u64])?;
    let agreed = agree(all.iter().map(|&[slots, resident]| ScheduleLimit { block_slots: slots as usize, vocab_resident: resident != 0 }));
    let placement = if agreed == own || !sharding.shards_params() { mine } else { plan_within(model, tc, world, costs, agreed)? };
    let totals = comm.gather_scalars(placement.device_bytes())?;
    Ok(with_totals(placement, totals))
}

/// [`plan_for_rank`] without ranks to ask (`plan`, which opens no device): where the ranks' devices
/// have `costs` (one per rank), the placement with the `shown` device's costs under the schedule the
/// ranks would agree on, with every rank's device total where they differ. `shown` is the costs the
/// run's host-RAM check plans with (the cpu device's where any rank computes there: its memory is
/// RAM), so `plan` and `train` agree on what fits.
pub fn plan_for_ranks(model: &Model, tc: &TrainConfig, costs: &[AllocCosts], shown: AllocCosts) -> Result<Placement> {
    let world = costs.len();
    let own = costs.iter().map(|&c| plan_on(model, tc, world, c)).collect::<Result<Vec<_>>>()?;
    let agreed = agree(own.iter().map(Placement::schedule));
    let sharding = Sharding { rank: 0, world, stage: tc.zero_stage };
    let limit = if sharding.shards_params() { agreed } else { ScheduleLimit::NONE };
    let totals = costs.iter().map(|&c| plan_within(model, tc, world, c, limit).map(|p| p.device_bytes())).collect::<Result<Vec<_>>>()?;
    Ok(with_totals(plan_within(model, tc, world, shown, limit)?, totals))
}

/// `placement` with every rank's device total (`totals`) where they differ.
fn with_totals(mut placement: Placement, totals: Vec<u64>) -> Placement {
    if totals.iter().any(|&t| t != totals[0]) {
        placement.device_bytes_by_rank = totals;
    }
    placement
}

/// The schedule every one of `ranks` holds: the fewest block slots, and the projection resident only
/// where every rank keeps it.
fn agree(ranks: impl Iterator<Item = ScheduleLimit>) -> ScheduleLimit {
    ranks.fold(ScheduleLimit::NONE, |a, b| ScheduleLimit {
        block_slots: a.block_slots.min(b.block_slots),
        vocab_resident: a.vocab_resident && b.vocab_resident,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::shard::ZeroStage;

    #[test]
    fn ranks_agree_on_the_fewest_slots_and_a_streamed_projection() {
        let limit = |block_slots, vocab_resident| ScheduleLimit { block_slots, vocab_resident };
        assert_eq!(agree([limit(6, true), limit(3, true)].into_iter()), limit(3, true));
        assert_eq!(agree([limit(6, true), limit(6, false)].into_iter()), limit(6, false));
        // Kept below the limit, a rank's placement holds the agreed slots.
        let model = Model::preset("gpt2").unwrap();
        let tc = TrainConfig { zero_stage: ZeroStage::Three, ..TrainConfig::default() };
        let own = plan_on(&model, &tc, 2, AllocCosts::CPU).unwrap();
        assert!(own.block_slots >= 2, "{}", own.block_slots);
        let kept = plan_within(&model, &tc, 2, AllocCosts::CPU, limit(2, false)).unwrap();
        assert_eq!(kept.schedule(), limit(2, false));
    }

    /// Two in-process ranks planning with the cpu device's and a GPU's costs under a budget where
    /// those hold different slot counts come out with one schedule, the fewer slots.
    #[test]
    fn ranks_with_other_costs_plan_one_schedule() {
        let model = Model::preset("gpt2").unwrap();
        let base = TrainConfig { zero_stage: ZeroStage::Three, batch: 1, seq_len: 64, ..TrainConfig::default() };
        let slots = |budget, costs| {
            plan_on(&model, &TrainConfig { gpu_mem_budget: Some(budget), ..base.clone() }, 2, costs).map_or(0, |p| p.block_slots)
        };
        let minimum = crate::train::minimum_device_bytes_on(&model, &base, AllocCosts::GPU);
        let budget = (0..400u64)
            .map(|i| minimum + (i << 20))
            .find(|&b| slots(b, AllocCosts::CPU) > slots(b, AllocCosts::GPU))
            .expect("a budget where the cpu device holds more block slots than a GPU");
        let tc = TrainConfig { gpu_mem_budget: Some(budget), ..base.clone() };
        let placements = crate::train::ranks::in_process(2, |comm: Comm| {
            let costs = if comm.rank() == 0 { AllocCosts::CPU } else { AllocCosts::GPU };
            plan_for_rank(&model, &tc, &comm, costs)
        })
        .unwrap();
        assert_eq!(placements[0].schedule(), placements[1].schedule());
        assert_eq!(placements[0].block_slots, slots(budget, AllocCosts::GPU));
        // The device line says it is rank 0's, and each rank's total.
        let by_rank = &placements[0].device_bytes_by_rank;
        assert_eq!(by_rank, &[placements[0].device_bytes(), placements[1].device_bytes()]);
        assert_ne!(by_rank[0], by_rank[1]);
        let said = placements[0].describe();
        assert!(
            said.contains("device (the ranks' devices differ, in all: rank 0 ") && said.contains("the parts, the cpu device's)"),
            "{said}"
        );
        // `plan`, asking no ranks, plans the same.
        let planned = plan_for_ranks(&model, &tc, &[AllocCosts::CPU, AllocCosts::GPU], AllocCosts::CPU).unwrap();
        assert_eq!((planned.schedule(), &planned.device_bytes_by_rank), (placements[0].schedule(), by_rank));
        assert_eq!(planned.device_bytes(), placements[0].device_bytes(), "the cpu device's parts, as the RAM check plans");
        // Alike devices: every rank's.
        let alike = crate::train::ranks::in_process(2, |comm: Comm| plan_for_rank(&model, &tc, &comm, AllocCosts::GPU)).unwrap();
        assert!(alike[0].device_bytes_by_rank.is_empty() && alike[0].describe().contains("device (each rank)"));
    }
}
