//! What one optimizer step measured: the `--metrics` line and the progress bar's numbers.

/// What one optimizer step measured.
#[derive(Clone, Debug, Default)]
pub struct StepReport {
    pub step: u64,
    /// Mean loss of the step's micro-batches, before its update.
    pub loss: f64,
    /// Global gradient L2 norm before clipping (unscaled).
    pub grad_norm: f64,
    pub lr: f64,
    pub loss_scale: f32,
    /// False when a loss-scaled step overflowed and its update was skipped.
    pub applied: bool,
    pub tokens: usize,
    pub seconds: f64,
    /// Time in the device's compute (ops, and waiting for them to finish).
    pub compute_s: f64,
    pub upload_s: f64,
    pub download_s: f64,
    /// Of compute, upload and download, the seconds before the step's first vocabulary head: the
    /// forward that runs beside the previous update's sweep.
    pub forward_device_s: f64,
    /// CPU AdamW time of the update that ran during this step (the previous step's gradients).
    pub adam_s: f64,
    /// The device's kernels' busy time during the step by GPU timestamps (None without them).
    pub gpu_kernels_s: Option<f64>,
    /// Time the device thread waited for that update.
    pub update_wait_s: f64,
    /// Time the device thread spent on its host tiers: reading working parameters before upload, and
    /// reading and writing the gradient accumulator (NVMe, when the optimizer state lives there).
    pub io_wait_s: f64,
    pub upload_bytes: u64,
    pub download_bytes: u64,
    pub peak_device_bytes: u64,
    /// Bytes this rank read from and wrote to its NVMe tier during the step (both threads: the update's
    /// sweep, uploads, gradients); zero without an NVMe tier.
    pub nvme_read_bytes: u64,
    pub nvme_written_bytes: u64,
    /// Of `nvme_read_bytes`, the working copies read ahead of their upload while the block before
    /// computed (`pipeline::Op::ReadAhead`).
    pub nvme_read_ahead_bytes: u64,
    /// Of `nvme_written_bytes`, the gradients written back on their own thread while the next block
    /// computed.
    pub nvme_written_behind_bytes: u64,
    /// The process's peak resident set so far (VmHWM), when the OS reports it.
    pub peak_rss_bytes: Option<u64>,
    /// The validation loss of the weights this step started from (when the step was one to evaluate).
    pub val_loss: Option<f64>,
    /// The steady step `plan --measure`'s rates predict for this run (None: not measured).
    pub predicted_step_s: Option<f64>,
    /// This rank's collectives during the step: bytes sent, seconds, and seconds hidden behind device work.
    pub comm: crate::comm::CommStats,
}

impl StepReport {
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-12)
    }
    pub fn device_busy_fraction(&self) -> f64 {
        (self.compute_s / self.seconds.max(1e-12)).min(1.0)
    }
    /// `gpu_kernels_s` / the step's wall time, at most 1: the busy figure from the device's own clock.
    pub fn gpu_busy_fraction(&self) -> Option<f64> {
        self.gpu_kernels_s.map(|k| (k / self.seconds.max(1e-12)).min(1.0))
    }
    pub fn to_json(&self) -> serde_json::Value {
        let gbps = |bytes: u64, s: f64| if s > 0.0 { bytes as f64 / s / 1e9 } else { 0.0 };
        let mut row = serde_json::json!({
            "step": self.step,
            "loss": self.loss,
            "grad_norm": self.grad_norm,
            "lr": self.lr,
            "loss_scale": self.loss_scale,
            "applied": self.applied,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s(),
            "device_busy_fraction": self.device_busy_fraction(),
            "gpu_busy_fraction": self.gpu_busy_fraction(),
            "peak_device_bytes": self.peak_device_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "nvme_read_bytes": self.nvme_read_bytes,
            "nvme_written_bytes": self.nvme_written_bytes,
            "nvme_read_ahead_bytes": self.nvme_read_ahead_bytes,
            "nvme_written_behind_bytes": self.nvme_written_behind_bytes,
            "time": {
                "total_s": self.seconds,
                "device_compute_s": self.compute_s,
                "gpu_kernels_s": self.gpu_kernels_s,
                "upload_s": self.upload_s,
                "download_s": self.download_s,
                "forward_device_s": self.forward_device_s,
                "adam_s": self.adam_s,
                "update_wait_s": self.update_wait_s,
                "io_wait_s": self.io_wait_s,
            },
            "comm_s": self.comm.seconds,
            "comm_overlapped_s": self.comm.overlapped_seconds,
            "comm_codec_s": self.comm.codec_seconds,
            "comm_bytes": self.comm.sent_bytes,
            "comm_grad_bytes": self.comm.grad_sent_bytes,
            "comm_param_bytes": self.comm.param_sent_bytes,
            "upload_bytes": self.upload_bytes,
            "download_bytes": self.download_bytes,
            "upload_gbps": gbps(self.upload_bytes, self.upload_s),
            "download_gbps": gbps(self.download_bytes, self.download_s),
        });
        if let Some(p) = self.predicted_step_s {
            row["predicted_step_s"] = p.into();
        }
        if let Some(v) = self.val_loss {
            row["val_loss"] = v.into();
            row["val_perplexity"] = v.exp().into();
        }
        row
    }
}

/// The CPU seconds (user and system, all threads) this process has used: fields 14 and 15 of
/// /proc/self/stat, in the kernel's fixed 100 ticks a second (USER_HZ); None off Linux.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks = |i: usize| fields.get(i - 3)?.parse::<u64>().ok();
    Some((ticks(14)? + ticks(15)?) as f64 / 100.0)
}

/// The process's peak resident set size (VmHWM in /proc/self/status), in bytes; None off Linux.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/METRICS.md documents every field a row can hold, in its field table and, for each number
    /// TensorBoard gets, in its tag table: the one place a new field is held to being documented.
    #[test]
    fn every_metrics_field_is_documented() {
        let docs = include_str!("../../../docs/METRICS.md");
        let (fields, tags) = docs.split_once("## TensorBoard").expect("METRICS.md has a TensorBoard section");
        let report = StepReport { predicted_step_s: Some(1.0), val_loss: Some(1.0), peak_rss_bytes: Some(1), ..StepReport::default() };
        let row = report.to_json();
        let mut missing = Vec::new();
        for (name, value) in row.as_object().unwrap() {
            let inner: Vec<String> = match value.as_object() {
                Some(parts) => parts.keys().map(|k| format!("{name}.{k}")).collect(),
                None => vec![name.clone()],
            };
            for field in inner {
                if !fields.contains(&format!("`{field}`")) {
                    missing.push(format!("{field} (field table)"));
                }
            }
            // TensorBoard's table names the top-level numbers; `time/…` stands for every part of time.
            let scalar = !matches!(name.as_str(), "step" | "applied" | "time");
            if scalar && !tags.contains(&format!("`{name}`")) {
                missing.push(format!("{name} (TensorBoard table)"));
            }
        }
        assert!(missing.is_empty(), "docs/METRICS.md lacks: {missing:?}");
    }
}
