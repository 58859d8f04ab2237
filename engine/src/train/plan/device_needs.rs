//! The device's side of the plan: the bytes each part of a run takes on the device, counted with the
//! device's own [`AllocCosts`] tensor by tensor, as `device_state` allocates them.

use crate::device::{AllocCosts, HalfFormat, MatmulInputs};
use crate::model::Model;
use crate::model::vocab::LossActs;
use crate::train::config::{Precision, TrainConfig};
use crate::train::layout::{GroupLayout, TensorSlot, group_layouts};

/// The format a block slot stores tensor `t` in: 16-bit for matrices when the working copy is 16-bit
/// (the matmul widens them as it reads), f32 otherwise. [`DeviceNeeds`] counts slots with it and
/// `device_state` allocates them with it.
pub(in crate::train) fn slot_format(t: &TensorSlot, precision: Precision) -> Option<HalfFormat> {
    precision.half_format().filter(|_| t.shape.len() >= 2)
}

/// Device bytes of each part of a run, before any budget is applied, counted with the device's own
/// [`AllocCosts`] tensor by tensor, as the trainer allocates them.
#[derive(Clone, Copy)]
pub(super) struct DeviceNeeds {
    /// Head parameters and their gradients besides the vocabulary matrices (which have empty
    /// placeholders), the output projection (whole when resident, else a chunk-sized slot), one chunk's
    /// gradient, the embedding's gathered rows and their position ids.
    pub(super) head_bytes: u64,
    /// One block's parameters (a slot).
    pub(super) slot_bytes: u64,
    pub(super) activation_bytes: u64,
    /// Two blocks' gradients (downloads overlap the next backward), the token ids of one micro-batch
    /// (x and y) and the staging of a 16-bit upload into an f32 tensor.
    pub(super) other_bytes: u64,
}

impl DeviceNeeds {
    pub(super) fn of(model: &Model, tc: &TrainConfig, costs: AllocCosts, vocab_resident: bool) -> Self {
        let groups = group_layouts(model);
        let bt = tc.batch * tc.seq_len;
        let (embedding, projection) = model.vocab_tensors();
        let chunks = model.vocab_chunks(tc.vocab_chunk_rows);
        let chunk_len = chunks.rows_per_chunk * model.width();
        // What the head group puts on the device for tensor i: the vocabulary matrices an empty
        // placeholder, except the projection when resident.
        let head_tensor_len = |i: usize, len: usize| match i {
            i if i == projection && vocab_resident => len,
            i if i == embedding || i == projection => 0,
            _ => len,
        };
        let head_params: u64 = groups[0].tensors.iter().enumerate().map(|(i, t)| costs.tensor_bytes(head_tensor_len(i, t.len))).sum();
        let head_grads: u64 = groups[0]
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| costs.tensor_bytes(if i == embedding || i == projection { 0 } else { t.len }))
            .sum();
        let vocab_chunk_bytes = if vocab_resident { 0 } else { costs.tensor_bytes(chunk_len) };
        let head_bytes = head_params
            + head_grads
            + vocab_chunk_bytes
            + costs.tensor_bytes(chunk_len)
            + costs.tensor_bytes(bt * model.width())
            + costs.tokens_bytes(bt);
        let loss_bytes: u64 = LossActs::<()>::tensor_lens(chunks, bt, vocab_resident).iter().map(|&n| costs.tensor_bytes(n)).sum();
        let f32_bytes = |g: &GroupLayout| g.tensors.iter().map(|t| costs.tensor_bytes(t.len)).sum::<u64>();
        let block = groups.get(1);
        let slot_bytes = block.map_or(0, |g| {
            g.tensors
                .iter()
                .map(|t| match slot_format(t, tc.precision) {
                    Some(_) => costs.tensor_16bit_bytes(t.len),
                    None => costs.tensor_bytes(t.len),
                })
                .sum()
        });
        let kept_blocks = if tc.recompute { 1 } else { model.n_layer() };
        // With a 16-bit working copy, every f32 tensor (the head's as placed, the projection's chunk,
        // and a slot's vectors) is written from 16-bit words staged on the device; one at a time.
        let staged_16bit = match tc.precision {
            Precision::Fp32 => 0,
            _ => {
                let head = groups[0].tensors.iter().enumerate().map(|(i, t)| head_tensor_len(i, t.len));
                let slot_vectors =
                    groups.iter().skip(1).flat_map(|g| g.tensors.iter().filter(|t| slot_format(t, tc.precision).is_none()).map(|t| t.len));
                let chunk = if vocab_resident { 0 } else { chunk_len };
                head.chain(slot_vectors).chain([chunk]).map(|len| costs.upload_16bit_bytes(len)).max().unwrap_or(0)
            }
        };
        DeviceNeeds {
            head_bytes,
            slot_bytes,
            activation_bytes: kept_blocks as u64 * model.block_activation_bytes(tc.batch, tc.seq_len)
                + model.head_activation_bytes(tc.batch, tc.seq_len)
                + loss_bytes
                + (model.n_layer() as u64 + 1) * costs.tensor_bytes(bt * model.width()),
            other_bytes: 2 * block.map_or(0, f32_bytes)
                + 2 * costs.tokens_bytes(bt)
                + staged_16bit
                + costs.fixed_bytes
                + if tc.matmul_inputs == MatmulInputs::F16 { costs.f16_inputs_bytes } else { 0 },
        }
    }

    /// The least a run can hold: two block slots, so one block uploads while another computes.
    pub(super) fn minimum(&self) -> u64 {
        self.head_bytes + 2 * self.slot_bytes + self.activation_bytes + self.other_bytes
    }
}
