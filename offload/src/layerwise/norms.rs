//! A tensor's squared norms in one order of addition at every world size.
//!
//! A norm is summed in three levels, each in a fixed place of the tensor's group (its flat buffer),
//! never of a rank's slice:
//! - a piece: the tensor's elements in one run of [`NORM_PIECE_ELEMS`] of the group, in eight lanes;
//! - a block: the pieces of one run of [`NORM_BLOCK_ELEMS`], added in order;
//! - the tensor: its blocks, added in order.
//!
//! Ranks' slices start at multiples of [`NORM_PIECE_ELEMS`], so a piece is always one rank's, but a
//! slice may start inside a block. [`NormSlots`] lays out one vector that every rank fills with its
//! own parts: a block one rank holds whole takes one slot (its pieces' sum), a block several ranks
//! share takes one slot per piece. Each slot has one owner and the others leave it zero, so the ranks'
//! vectors added elementwise in any order hold the same bits as one rank would; every rank then adds
//! each shared block's pieces, and each tensor's blocks, in order.

use std::ops::Range;

use super::SquaredNorms;

/// Elements per piece: norms start afresh at every multiple of this in the group, the alignment of
/// every rank's slice, so a piece never straddles two ranks.
pub const NORM_PIECE_ELEMS: usize = 64;

/// Elements per block: the unit of the passes' parallel work, and what one exchange slot holds when
/// one rank holds all of a tensor's elements in it.
pub const NORM_BLOCK_ELEMS: usize = 1 << 14;

/// Pieces per block.
const PIECES: usize = NORM_BLOCK_ELEMS / NORM_PIECE_ELEMS;

/// One part of a tensor (a run of its elements, one rank's): its squared norms by the group's blocks
/// it touches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PartNorms {
    /// The group's index of the first block the part touches.
    pub first_block: usize,
    /// Per block touched, in order: the part's pieces in it added in order.
    pub blocks: Vec<SquaredNorms>,
    /// The pieces of the part's first and last blocks (one entry when they are one), the only blocks
    /// it may share with another rank: (block, index of the first piece in the block, the pieces).
    pub edges: Vec<(usize, usize, Vec<SquaredNorms>)>,
}

impl PartNorms {
    /// The blocks added in order: the norms of a tensor this part holds whole.
    pub fn total(&self) -> SquaredNorms {
        self.blocks.iter().fold(SquaredNorms::default(), |a, &b| a + b)
    }
}

/// Where each tensor of a group puts its blocks in the ranks' exchange (see the module's text).
#[derive(Clone, Debug)]
pub struct NormSlots {
    tensors: Vec<TensorSlots>,
    len: usize,
}

#[derive(Clone, Debug)]
struct TensorSlots {
    first_block: usize,
    /// Per block the tensor touches: its first slot, and whether ranks share it (then one slot per
    /// piece of the block follows, else one).
    blocks: Vec<(usize, bool)>,
}

impl NormSlots {
    /// The slots of `tensors` (ranges of the group's elements) for ranks whose slices are
    /// `slice_len` elements each (the group's whole padded length where every rank holds all of it).
    pub fn new(tensors: &[Range<usize>], slice_len: usize) -> Self {
        assert!(slice_len > 0 && slice_len.is_multiple_of(NORM_PIECE_ELEMS), "slices start at multiples of a piece");
        let mut len = 0;
        let tensors = tensors
            .iter()
            .map(|t| {
                let first_block = t.start / NORM_BLOCK_ELEMS;
                let last_block = if t.is_empty() { first_block } else { (t.end - 1) / NORM_BLOCK_ELEMS + 1 };
                let blocks = (first_block..last_block)
                    .map(|b| {
                        let lo = t.start.max(b * NORM_BLOCK_ELEMS);
                        let hi = t.end.min((b + 1) * NORM_BLOCK_ELEMS);
                        let shared = lo / slice_len != (hi - 1) / slice_len;
                        let slot = len;
                        len += if shared { PIECES } else { 1 };
                        (slot, shared)
                    })
                    .collect();
                TensorSlots { first_block, blocks }
            })
            .collect();
        NormSlots { tensors, len }
    }

    /// f64 values in the exchange: two per slot (the parameters' and the update's).
    pub fn values(&self) -> usize {
        2 * self.len
    }

    /// Writes `part` of tensor `t` (measured by this rank) into its slots of `out`
    /// ([`Self::values`] long, zero where other ranks' parts go).
    pub fn fill(&self, t: usize, part: &PartNorms, out: &mut [f64]) {
        let slots = &self.tensors[t];
        let put = |out: &mut [f64], slot: usize, n: SquaredNorms| (out[2 * slot], out[2 * slot + 1]) = (n.param, n.update);
        for (j, &folded) in part.blocks.iter().enumerate() {
            let (slot, shared) = slots.blocks[part.first_block + j - slots.first_block];
            if !shared {
                put(out, slot, folded);
                continue;
            }
            let (_, first, pieces) =
                part.edges.iter().find(|(b, _, _)| *b == part.first_block + j).expect("a shared block is at the part's edge");
            for (i, &piece) in pieces.iter().enumerate() {
                put(out, slot + first + i, piece);
            }
        }
    }

    /// Each tensor's squared norms from the ranks' vectors added elementwise.
    pub fn totals(&self, summed: &[f64]) -> Vec<SquaredNorms> {
        let at = |slot: usize| SquaredNorms { param: summed[2 * slot], update: summed[2 * slot + 1] };
        self.tensors
            .iter()
            .map(|t| {
                t.blocks.iter().fold(SquaredNorms::default(), |total, &(slot, shared)| {
                    let block = if shared { (slot..slot + PIECES).fold(SquaredNorms::default(), |a, s| a + at(s)) } else { at(slot) };
                    total + block
                })
            })
            .collect()
    }
}
