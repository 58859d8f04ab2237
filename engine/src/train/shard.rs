//! How each parameter group's flat buffer is split between ranks (ZeRO), and which state each stage
//! splits.
//!
//! A group of `len` elements is padded to a multiple of world_size x [`SHARD_ALIGN_ELEMS`] and cut into
//! world_size contiguous slices of equal length; rank r owns slice r (stage 0: every rank owns all of
//! them). Padding elements belong to no tensor: they stay zero and are never updated. The slice
//! geometry is a pure function of (len, world size), so state saved at one world size can be re-split
//! at another.

use std::ops::Range;

/// `--zero-stage`: which state is split between ranks (each stage adds one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ZeroStage {
    /// Nothing: every rank keeps and updates the whole model (data parallelism), and the gradients are
    /// all-reduced. With `--grad-compression` no working copy crosses between ranks, only the
    /// compressed gradients: the choice for slow links (DeepSpeed's 1-bit Adam runs unsharded too).
    Zero = 0,
    /// fp32 master weights and Adam moments.
    One = 1,
    /// ... and the accumulated gradients (reduce-scattered as each block's backward ends).
    Two = 2,
    /// ... and the working copy of the parameters (all-gathered just before each upload).
    Three = 3,
}

impl ZeroStage {
    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            0 => Some(ZeroStage::Zero),
            1 => Some(ZeroStage::One),
            2 => Some(ZeroStage::Two),
            3 => Some(ZeroStage::Three),
            _ => None,
        }
    }
    pub fn number(self) -> u8 {
        self as u8
    }
}

/// Slices start on multiples of this many elements (256 bytes of f32).
pub const SHARD_ALIGN_ELEMS: usize = 64;

/// This rank's place in the world, and the stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharding {
    pub rank: usize,
    pub world: usize,
    pub stage: ZeroStage,
}

/// One group's split: its padded length and the slice this rank owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupShard {
    /// Elements of the model's tensors in the group.
    pub len: usize,
    /// `len` rounded up to world_size x SHARD_ALIGN_ELEMS.
    pub padded_len: usize,
    /// This rank's slice, in the group's (padded) element coordinates.
    pub owned: Range<usize>,
    /// Where element i of the group sits in this rank's working copy: at i - working_base (0 when the
    /// working copy is whole, owned.start when it is sharded, stage 3).
    pub working_base: usize,
    /// Elements of this rank's working copy.
    pub working_len: usize,
}

impl GroupShard {
    pub fn slice_len(&self) -> usize {
        self.owned.len()
    }
}

impl Sharding {
    pub fn single() -> Self {
        Sharding { rank: 0, world: 1, stage: ZeroStage::Two }
    }

    /// Gradients are reduced as each block's backward ends and kept as this rank's slice only (stages
    /// 2 and 3; stage 0, where the slice is everything; and one rank, likewise).
    pub fn shards_grads(&self) -> bool {
        self.world == 1 || self.stage != ZeroStage::One
    }

    /// Every rank owns the whole of every group (stage 0 with several ranks): gradients are
    /// all-reduced rather than reduce-scattered, and sums over the owners (norms) are this rank's own.
    pub fn replicates(&self) -> bool {
        self.world > 1 && self.stage == ZeroStage::Zero
    }

    /// The working copy is gathered from the ranks' slices once per update (stages 1-2, several ranks).
    pub fn gathers_working(&self) -> bool {
        self.world > 1 && matches!(self.stage, ZeroStage::One | ZeroStage::Two)
    }

    /// The working copy is kept as this rank's slice only (stage 3, more than one rank).
    pub fn shards_params(&self) -> bool {
        self.world > 1 && self.stage == ZeroStage::Three
    }

    pub fn group(&self, len: usize) -> GroupShard {
        let unit = self.world * SHARD_ALIGN_ELEMS;
        let padded_len = len.div_ceil(unit) * unit;
        let slice = padded_len / self.world;
        let owned = if self.replicates() { 0..padded_len } else { self.rank * slice..(self.rank + 1) * slice };
        let (working_base, working_len) = if self.shards_params() { (owned.start, slice) } else { (0, padded_len) };
        GroupShard { len, padded_len, owned, working_base, working_len }
    }
}

/// The part of `range` (group coordinates) inside `owned`, or None.
pub fn intersect(range: Range<usize>, owned: &Range<usize>) -> Option<Range<usize>> {
    let r = range.start.max(owned.start)..range.end.min(owned.end);
    (r.start < r.end).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_tile_the_padded_group_and_cover_every_element_once() {
        for world in [1, 2, 3, 4, 8] {
            for len in [1, 63, 64, 65, 1000, 12_345] {
                let mut next = 0;
                for rank in 0..world {
                    let g = Sharding { rank, world, stage: ZeroStage::Three }.group(len);
                    assert!(g.padded_len >= len && g.padded_len.is_multiple_of(world * SHARD_ALIGN_ELEMS));
                    assert!(g.padded_len - len < world * SHARD_ALIGN_ELEMS, "no more padding than one unit");
                    assert_eq!(g.owned.start, next, "world {world} len {len} rank {rank}");
                    assert!(g.owned.start.is_multiple_of(SHARD_ALIGN_ELEMS));
                    next = g.owned.end;
                }
                assert_eq!(next, Sharding { rank: 0, world, stage: ZeroStage::One }.group(len).padded_len);
            }
        }
    }

    #[test]
    fn each_stage_shards_what_it_names() {
        let s = |stage| Sharding { rank: 1, world: 2, stage };
        assert!(!s(ZeroStage::One).shards_grads() && !s(ZeroStage::One).shards_params());
        assert!(s(ZeroStage::Two).shards_grads() && !s(ZeroStage::Two).shards_params());
        assert!(s(ZeroStage::Three).shards_grads() && s(ZeroStage::Three).shards_params());
        assert!(s(ZeroStage::Zero).replicates() && !s(ZeroStage::Zero).shards_params() && !s(ZeroStage::Zero).gathers_working());
        assert!(s(ZeroStage::One).gathers_working() && s(ZeroStage::Two).gathers_working() && !s(ZeroStage::Three).gathers_working());
        let g = s(ZeroStage::Zero).group(1000);
        assert_eq!((g.owned.clone(), g.working_base, g.working_len), (0..g.padded_len, 0, g.padded_len), "stage 0 owns everything");
        let one = Sharding { rank: 0, world: 1, stage: ZeroStage::Zero };
        assert!(!one.replicates() && one.group(1000).owned == (0..1024), "one rank: as every stage");
        let g = s(ZeroStage::Three).group(1000);
        assert_eq!((g.working_base, g.working_len), (g.owned.start, g.owned.len()));
        let g = s(ZeroStage::Two).group(1000);
        assert_eq!((g.working_base, g.working_len), (0, g.padded_len));
        assert_eq!(intersect(10..20, &(15..40)), Some(15..20));
        assert_eq!(intersect(10..20, &(20..40)), None);
    }
}
