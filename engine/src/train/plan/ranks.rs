//! One schedule for every rank where uploads are collective: at ZeRO stage 3 each block's upload
//! gathers its working copy from every rank's slice, so ranks whose devices hold different numbers of
//! block slots (a cpu rank beside a GPU, GPUs of other sizes) would pair different gathers (a panic
//! in-process, a hang or mixed weights under MPI). They keep the fewest slots any rank holds, and the
//! output projection resident only where every rank keeps it so; results do not change, only how
//! often the larger devices upload.

use anyhow::Result;

use super::{Placement, ScheduleLimit, plan_on, plan_within};
use crate::comm::Comm;
use crate::device::AllocCosts;
use crate::model::Model;
use crate::train::TrainConfig;
use crate::train::shard::Sharding;

/// Collective: this rank's placement ([`plan_on`] with its device's `costs`), under the schedule every
/// rank's device holds where the ranks' uploads are collective.
pub fn plan_for_rank(model: &Model, tc: &TrainConfig, comm: &Comm, costs: AllocCosts) -> Result<Placement> {
    let world = comm.world_size();
    let mine = plan_on(model, tc, world, costs)?;
    let sharding = Sharding { rank: comm.rank(), world, stage: tc.zero_stage };
    if !sharding.shards_params() {
        return Ok(mine);
    }
    let own = mine.schedule();
    let all = comm.gather_scalars([own.block_slots as u64, own.vocab_resident as u64])?;
    let agreed = agree(all.iter().map(|&[slots, resident]| ScheduleLimit { block_slots: slots as usize, vocab_resident: resident != 0 }));
    if agreed == own { Ok(mine) } else { plan_within(model, tc, world, costs, agreed) }
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
}
