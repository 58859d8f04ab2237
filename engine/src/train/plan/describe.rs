//! A placement in words, as `plan` and the start of `train` print it.

use super::Placement;

impl Placement {
    /// The placement in words: where each kind of state lives, the device's parts, the NVMe traffic.
    pub fn describe(&self) -> String {
        let size = crate::words::size;
        let ranks = if self.world_size > 1 {
            format!("; {} ranks, ZeRO stage {}, per rank:", self.world_size, self.zero_stage.number())
        } else {
            ";".to_string()
        };
        format!(
            "placement: {} parameters{ranks} master weights + {} {} {} on {}; gradients {} on {}; working copy {} on {}{}{}\n\
             device{}: head {} ({}) + {} x {} + activations {} + other {} = {} (budget {})\n{}",
            self.params,
            self.adam_state.name(),
            self.optimizer.state_words(),
            size(self.host_optimizer_bytes),
            self.optimizer_tier.name(),
            size(self.host_grad_bytes),
            self.grads_tier.name(),
            size(self.host_working_bytes),
            self.params_tier.name(),
            match self.cached_working_blocks.len() {
                0 => String::new(),
                n => format!(
                    " (blocks {}-{}, {n} of them, kept in RAM from forward to backward by --params-ram-cache)",
                    self.cached_working_blocks.start,
                    self.cached_working_blocks.end - 1
                ),
            },
            [
                (self.host_residual_bytes > 0).then(|| format!(
                    "; error-feedback residuals {} on {}",
                    size(self.host_residual_bytes),
                    self.grads_tier.name()
                )),
                (self.host_stage1_grad_bytes > 0).then(|| format!("; whole gradient sums {} in RAM", size(self.host_stage1_grad_bytes))),
            ]
            .into_iter()
            .flatten()
            .collect::<String>(),
            self.whose_device(),
            size(self.device_head_bytes),
            if self.vocab_resident { "output projection resident" } else { "output projection streamed a vocabulary chunk at a time" },
            crate::words::counted(self.block_slots as u64, "block slot"),
            size(self.device_block_slot_bytes),
            size(self.device_activation_bytes),
            size(self.device_other_bytes),
            size(self.device_bytes()),
            self.device_budget_bytes.map_or("none".to_string(), size),
            self.nvme_traffic.describe(self.params),
        )
    }

    /// Whose device the device line describes: every rank's, or, where the ranks' devices hold
    /// different amounts, each rank's total and which kind of device the parts are of.
    fn whose_device(&self) -> String {
        let size = crate::words::size;
        match (self.world_size, self.device_bytes_by_rank.as_slice()) {
            (1, _) => String::new(),
            (_, []) => " (each rank)".into(),
            (_, by_rank) => {
                let totals: Vec<String> = by_rank.iter().enumerate().map(|(r, &b)| format!("rank {r} {}", size(b))).collect();
                let kind = if self.device_memory_is_ram { "the cpu device's" } else { "a GPU's" };
                format!(" (the ranks' devices differ, in all: {}; the parts, {kind})", totals.join(", "))
            }
        }
    }
}
