//! The placement plan: where each kind of state lives and how many device bytes each part of a run
//! takes, decided once at start-up and held to `--gpu-mem-budget`.

use anyhow::{Result, bail};
use zerostream_offload::Tier;

use super::config::{Precision, TrainConfig};
use super::layout::group_layouts;
use crate::model::gpt2::{BlockActivations, Gpt2Config, HeadActivations};

/// Where everything lives and how many device bytes each part takes: decided once at start-up.
#[derive(Clone, Debug)]
pub struct Placement {
    pub optimizer_tier: Tier,
    pub params_tier: Tier,
    pub params: usize,
    pub host_optimizer_bytes: u64,
    pub host_working_bytes: u64,
    pub host_grad_bytes: u64,
    pub device_head_bytes: u64,
    pub device_block_slot_bytes: u64,
    pub device_activation_bytes: u64,
    pub device_other_bytes: u64,
    /// Block parameter slots on the device (2 at least; all blocks if the budget allows).
    pub block_slots: usize,
    pub device_budget_bytes: Option<u64>,
}

impl Placement {
    /// Device bytes planned in all.
    pub fn device_bytes(&self) -> u64 {
        self.device_head_bytes
            + self.block_slots as u64 * self.device_block_slot_bytes
            + self.device_activation_bytes
            + self.device_other_bytes
    }

    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        format!(
            "placement: {} parameters; master weights + Adam moments {:.1} MiB on {}; working copy {:.1} MiB on {}; gradients {:.1} MiB in RAM\n\
             device: head {:.1} MiB + {} block slots x {:.1} MiB + activations {:.1} MiB + other {:.1} MiB = {:.1} MiB (budget {})",
            self.params,
            mib(self.host_optimizer_bytes),
            self.optimizer_tier.name(),
            mib(self.host_working_bytes),
            self.params_tier.name(),
            mib(self.host_grad_bytes),
            mib(self.device_head_bytes),
            self.block_slots,
            mib(self.device_block_slot_bytes),
            mib(self.device_activation_bytes),
            mib(self.device_other_bytes),
            mib(self.device_bytes()),
            self.device_budget_bytes.map_or("none".to_string(), |b| format!("{:.1} MiB", mib(b))),
        )
    }
}

/// Device bytes of each part of a run, before any budget is applied.
struct DeviceNeeds {
    /// Head parameters and their gradients.
    head_bytes: u64,
    /// One block's parameters (a slot).
    slot_bytes: u64,
    activation_bytes: u64,
    /// Two blocks' gradients (downloads overlap the next backward) and the token ids with the encoder's
    /// index (x and y).
    other_bytes: u64,
}

impl DeviceNeeds {
    fn of(cfg: &Gpt2Config, tc: &TrainConfig) -> Self {
        let groups = group_layouts(cfg);
        let block_elems = groups.get(1).map_or(0, |g| g.len);
        let bt = tc.batch * tc.seq_len;
        let kept_blocks = if tc.recompute { 1 } else { cfg.n_layer };
        let block_bytes = 4 * block_elems as u64; // gradients, always f32
        // A slot holds 16-bit matrices (packed two per word) with a 16-bit working copy.
        let slot_bytes = match tc.precision {
            Precision::Fp32 => block_bytes,
            _ => groups.get(1).map_or(0, |g| {
                g.tensors.iter().map(|t| if t.shape.len() >= 2 { 4 * t.len.div_ceil(2) } else { 4 * t.len }).sum::<usize>() as u64
            }),
        };
        DeviceNeeds {
            head_bytes: 2 * 4 * groups[0].len as u64,
            slot_bytes,
            activation_bytes: kept_blocks as u64 * BlockActivations::<()>::bytes(cfg, tc.batch, tc.seq_len)
                + HeadActivations::<()>::bytes(cfg, tc.batch, tc.seq_len)
                + 4 * ((cfg.n_layer + 1) * bt * cfg.n_embd) as u64,
            // With 16-bit working copies, the packed upload of the largest tensor is staged on the device.
            other_bytes: 2 * block_bytes
                + 2 * 4 * 4 * bt as u64
                + 4096
                + if tc.precision == Precision::Fp32 {
                    0
                } else {
                    4 * (groups.iter().flat_map(|g| &g.tensors).map(|t| t.len).max().unwrap_or(0) as u64).div_ceil(2)
                },
        }
    }

    /// The least a run can hold: two block slots, so one block uploads while another computes.
    fn minimum(&self) -> u64 {
        self.head_bytes + 2 * self.slot_bytes + self.activation_bytes + self.other_bytes
    }
}

/// The smallest `--gpu-mem-budget` that [`plan`] accepts for this model and configuration.
pub fn minimum_device_bytes(cfg: &Gpt2Config, tc: &TrainConfig) -> u64 {
    DeviceNeeds::of(cfg, tc).minimum()
}

/// Plans the device memory of a run, or refuses a budget that cannot hold the minimum, with the numbers.
pub fn plan(cfg: &Gpt2Config, tc: &TrainConfig) -> Result<Placement> {
    let params: usize = group_layouts(cfg).iter().map(|g| g.len).sum();
    let needs = DeviceNeeds::of(cfg, tc);
    let DeviceNeeds { head_bytes, slot_bytes, activation_bytes, other_bytes } = needs;
    let minimum = needs.minimum();
    let mut block_slots = cfg.n_layer.min(2);
    if let Some(budget) = tc.gpu_mem_budget {
        if budget < minimum {
            bail!(
                "--gpu-mem-budget {budget} bytes ({:.1} MiB) cannot hold the minimum of {minimum} bytes ({:.1} MiB): \
                 head parameters+gradients {head_bytes}, 2 block slots x {slot_bytes}, activations {activation_bytes}{}, other {other_bytes}. \
                 Raise the budget, lower --batch-size/--seq-len{}",
                budget as f64 / 1048576.0,
                minimum as f64 / 1048576.0,
                if tc.recompute { " (with --recompute)" } else { "" },
                if tc.recompute { "" } else { ", or add --recompute" },
            );
        }
        let spare = budget - minimum;
        block_slots += (spare / slot_bytes.max(1)) as usize;
        block_slots = block_slots.min(cfg.n_layer);
    } else {
        block_slots = cfg.n_layer;
    }
    let host = |bytes_per_param: usize| (params * bytes_per_param) as u64;
    Ok(Placement {
        optimizer_tier: tc.offload_optimizer,
        params_tier: tc.offload_params,
        params,
        host_optimizer_bytes: host(12),
        host_working_bytes: host(tc.precision.working_bytes_per_param()),
        host_grad_bytes: host(4),
        device_head_bytes: head_bytes,
        device_block_slot_bytes: slot_bytes,
        device_activation_bytes: activation_bytes,
        device_other_bytes: other_bytes,
        block_slots,
        device_budget_bytes: tc.gpu_mem_budget,
    })
}
