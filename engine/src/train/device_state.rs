//! The device side of a run: what the trainer keeps under the budget (the head group, block slots,
//! activations, two gradient buffers) and how it is allocated from the model's tables and the plan.

use anyhow::Result;

use super::layout::{GroupLayout, group_layouts};
use super::plan::slot_format;
use super::{Placement, TrainConfig, Trainer};
use crate::device::Backend;
use crate::model::{BlockActs, HeadActs, Model};

/// The device-resident part of the run.
pub(super) struct DeviceState<D: Backend> {
    /// The head group's tensors and gradients, in the family's table order (as every group below).
    pub(super) head: Vec<D::Tensor>,
    pub(super) head_grads: Vec<D::Tensor>,
    pub(super) head_acts: HeadActs<D::Tensor>,
    /// residual[l] is the input of block l; residual[L] the output of the last block.
    pub(super) residual: Vec<D::Tensor>,
    /// One per block, or a single one with --recompute.
    pub(super) block_acts: Vec<BlockActs<D::Tensor>>,
    pub(super) slots: Vec<Vec<D::Tensor>>,
    /// Which (block, step) each slot holds.
    pub(super) slot_holds: Vec<Option<(usize, u64)>>,
    /// Two, used in turn, so one block's gradients download while the next block's are computed.
    pub(super) block_grads: [Vec<D::Tensor>; 2],
}

impl<D: Backend> Trainer<'_, D> {
    pub(super) fn allocate_device(dev: &D, model: &Model, tc: &TrainConfig, placement: &Placement) -> Result<DeviceState<D>> {
        let groups = group_layouts(model);
        let alloc_group = |g: &GroupLayout, prefix: &str| -> Result<Vec<D::Tensor>> {
            g.tensors.iter().map(|t| dev.alloc(t.len, &format!("{prefix}{}", t.name))).collect()
        };
        let head = alloc_group(&groups[0], "")?;
        let head_grads = alloc_group(&groups[0], "grad ")?;
        let head_acts = model.head_acts(dev, tc.batch, tc.seq_len)?;
        let bt = tc.batch * tc.seq_len;
        let residual = (0..=model.n_layer()).map(|l| dev.alloc(bt * model.width(), &format!("residual.{l}"))).collect::<Result<_>>()?;
        let kept = if tc.recompute { 1 } else { model.n_layer() };
        let block_acts = (0..kept).map(|_| model.block_acts(dev, tc.batch, tc.seq_len)).collect::<Result<_>>()?;
        let block_grads = [alloc_group(&groups[1], "grad A ")?, alloc_group(&groups[1], "grad B ")?];
        // With a 16-bit working copy the matmul weights stay 16-bit on the device (the matmul widens
        // them as it reads); biases and norm weights are widened to f32 on arrival.
        let slots = (0..placement.block_slots)
            .map(|i| {
                groups[1]
                    .tensors
                    .iter()
                    .map(|t| {
                        let label = format!("slot {i} {}", t.name);
                        match slot_format(t, tc.precision) {
                            Some(format) => dev.alloc_16bit(t.len, &label, format),
                            None => dev.alloc(t.len, &label),
                        }
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceState { head, head_grads, head_acts, residual, block_acts, slot_holds: vec![None; slots.len()], slots, block_grads })
    }
}
