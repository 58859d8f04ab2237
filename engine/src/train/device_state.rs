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
    /// The head group's tensors and gradients, in the family's table order (as every group below). The
    /// vocabulary matrices are empty placeholders, except the output projection when the plan keeps
    /// it resident ([`Placement::vocab_resident`]); their gradients are summed on the host.
    pub(super) head: Vec<D::Tensor>,
    pub(super) head_grads: Vec<D::Tensor>,
    /// One vocabulary chunk of the output projection, uploaded in turn (when it is not resident).
    pub(super) vocab_slot: Option<D::Tensor>,
    /// One vocabulary chunk's projection gradient, downloaded after each chunk's backward.
    pub(super) vocab_grad: D::Tensor,
    /// The embedding's rows for the micro-batch's tokens (BT, C), gathered on the host.
    pub(super) embed_rows: D::Tensor,
    /// The ids 0..BT: row i of `embed_rows` is token i's.
    pub(super) positions: D::Tokens,
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
        let (embedding, projection) = model.vocab_tensors();
        let is_vocab = |i: usize| i == embedding || i == projection;
        let head_tensors = |prefix: &str, keep_projection: bool| -> Result<Vec<D::Tensor>> {
            let placed = |i: usize, len: usize| if is_vocab(i) && !(keep_projection && i == projection) { 0 } else { len };
            groups[0].tensors.iter().enumerate().map(|(i, t)| dev.alloc(placed(i, t.len), &format!("{prefix}{}", t.name))).collect()
        };
        let head = head_tensors("", placement.vocab_resident)?;
        let head_grads = head_tensors("grad ", false)?;
        let chunks = model.vocab_chunks(tc.vocab_chunk_rows);
        let chunk_len = chunks.rows_per_chunk * model.width();
        let vocab_slot = if placement.vocab_resident { None } else { Some(dev.alloc(chunk_len, "vocabulary chunk")?) };
        let vocab_grad = dev.alloc(chunk_len, "grad vocabulary chunk")?;
        let bt = tc.batch * tc.seq_len;
        let embed_rows = dev.alloc(bt * model.width(), "embedding rows")?;
        let positions = dev.tokens(&(0..bt as u32).collect::<Vec<u32>>())?;
        let head_acts = model.head_acts_with(dev, tc.batch, tc.seq_len, chunks, placement.vocab_resident)?;
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
        Ok(DeviceState {
            head,
            head_grads,
            vocab_slot,
            vocab_grad,
            embed_rows,
            positions,
            head_acts,
            residual,
            block_acts,
            slot_holds: vec![None; slots.len()],
            slots,
            block_grads,
        })
    }
}
