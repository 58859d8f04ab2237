//! What a finished run prints about itself: the `done:` line of step-time averages, and the three lines
//! that end it — what was trained on what, where its state lived, and the traffic of the offload links.

use super::StepReport;
use super::plan::Placement;
use crate::model::Model;
use crate::words::{seconds, size};

/// Byte counts of one run's offload links, all ranks' state included where the run knows it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Traffic {
    pub upload_bytes: u64,
    pub download_bytes: u64,
    /// (bytes read, bytes written) through this rank's NVMe tier (None: nothing lived on NVMe).
    pub nvme_bytes: Option<(u64, u64)>,
}

impl Traffic {
    /// The host <-> device bytes of `reports`, with this rank's NVMe counters.
    pub fn of(reports: &[StepReport], nvme: Option<(u64, u64)>) -> Self {
        Traffic {
            upload_bytes: reports.iter().map(|r| r.upload_bytes).sum(),
            download_bytes: reports.iter().map(|r| r.download_bytes).sum(),
            nvme_bytes: nvme,
        }
    }
}

/// `1.5M`, `124M`, `1.56B`.
fn count(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.2}B", n / 1e9),
        n if n >= 1e6 => format!("{:.1}M", n / 1e6),
        n if n >= 1e3 => format!("{:.0}k", n / 1e3),
        n => format!("{n:.0}"),
    }
}

/// Passes over the data: two significant digits below 1 ("0.0053"), one decimal above.
fn passes(p: f64) -> String {
    if p >= 1.0 || p == 0.0 {
        format!("{p:.1}")
    } else {
        let decimals = (1.0 - p.log10().floor()) as usize;
        format!("{p:.decimals$}")
    }
}

/// The three closing lines of a run: what it trained, where the state lived, what moved.
#[allow(clippy::too_many_arguments)]
pub fn what_it_did(
    model: &Model,
    placement: &Placement,
    reports: &[StepReport],
    data_tokens: usize,
    run_s: f64,
    val_loss: Option<f64>,
    device: &str,
    traffic: &Traffic,
) -> [String; 3] {
    let tokens: usize = reports.iter().map(|r| r.tokens).sum();
    let (first, last) = (reports.first().map_or(f64::NAN, |r| r.loss), reports.last().map_or(f64::NAN, |r| r.loss));
    let validation = val_loss.map_or(String::new(), |v| format!(", validation {v:.3} (perplexity {:.1})", v.exp()));
    let trained = format!(
        "trained {} parameters ({}) for {} on {} tokens ({} passes over {}) in {}: loss {first:.3} -> {last:.3}{validation}",
        count(placement.params as f64),
        model.describe(),
        crate::words::counted(reports.len() as u64, "step"),
        count(tokens as f64),
        passes(tokens as f64 / data_tokens.max(1) as f64),
        count(data_tokens as f64),
        seconds(run_s),
    );
    let ranks = if placement.world_size > 1 {
        format!(" per rank ({} ranks, ZeRO stage {})", placement.world_size, placement.zero_stage.number())
    } else {
        String::new()
    };
    let lived = format!(
        "state{ranks}: fp32 master weights + {} {} {} in {}, working copy {} in {}, gradients {} in {}; on the device ({device}) at most {} ({})",
        placement.adam_state.name(),
        placement.optimizer.state_words(),
        size(placement.host_optimizer_bytes),
        tier_place(placement.optimizer_tier),
        size(placement.host_working_bytes),
        tier_place(placement.params_tier),
        size(placement.host_grad_bytes + placement.host_stage1_grad_bytes),
        tier_place(placement.grads_tier),
        size(reports.iter().map(|r| r.peak_device_bytes).max().unwrap_or(0)),
        placement.device_budget_bytes.map_or("no budget".to_string(), |b| format!("budget {}", size(b))),
    );
    let steps = reports.len().max(1) as u64;
    let nvme = match traffic.nvme_bytes {
        Some((read, written)) => format!("NVMe read {} and wrote {}", size(read), size(written)),
        None => "nothing on NVMe".to_string(),
    };
    let moved = format!(
        "traffic{}: {} host -> device and {} device -> host ({} and {} a step); {nvme}",
        if placement.world_size > 1 { " (rank 0)" } else { "" },
        size(traffic.upload_bytes),
        size(traffic.download_bytes),
        size(traffic.upload_bytes / steps),
        size(traffic.download_bytes / steps),
    );
    [trained, lived, moved]
}

fn tier_place(tier: zerostream_offload::Tier) -> &'static str {
    match tier {
        zerostream_offload::Tier::Ram => "RAM",
        zerostream_offload::Tier::Nvme => "NVMe",
    }
}

/// The `done:` line: steps, loss, throughput, and the mean of each part of a step. `adam_total_s`
/// is the run's AdamW time over every update, the last one's included: no step's report holds it,
/// since it runs after the last step.
pub fn summarise(say: &dyn Fn(String), reports: &[StepReport], run_s: f64, adam_total_s: f64, peak_device_bytes: u64) {
    let (Some(first), Some(last)) = (reports.first(), reports.last()) else { return };
    let n = reports.len() as f64;
    let mean = |f: fn(&StepReport) -> f64| reports.iter().map(f).sum::<f64>() / n;
    say(format!(
        "done: {} in {}; loss {:.4} -> {:.4}; {:.0} tokens/s; per step: compute {:.3} s, upload {:.3} s, download {:.3} s, AdamW {:.3} s (waited {:.3} s), NVMe wait {:.3} s; device peak {}",
        crate::words::counted(reports.len() as u64, "step"),
        seconds(run_s),
        first.loss,
        last.loss,
        reports.iter().map(|r| r.tokens).sum::<usize>() as f64 / run_s,
        mean(|r| r.compute_s),
        mean(|r| r.upload_s),
        mean(|r| r.download_s),
        adam_total_s / n,
        mean(|r| r.update_wait_s),
        mean(|r| r.io_wait_s),
        size(peak_device_bytes),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_bytes_read_as_people_write_them() {
        assert_eq!(count(1_489_920.0), "1.5M");
        assert_eq!(count(1_557_611_200.0), "1.56B");
        assert_eq!(count(44_249.0), "44k");
        assert_eq!(passes(0.0053), "0.0053");
        assert_eq!(passes(0.25), "0.25");
        assert_eq!(passes(12.04), "12.0");
    }

    #[test]
    fn the_done_lines_update_time_is_the_runs_total_a_step() {
        // The reports' own times leave out the last update, which runs after the last report: the
        // line reads the run's total instead (2 s over 2 steps), whatever the reports hold.
        let step = |adam_s| StepReport { loss: 3.0, tokens: 8, adam_s, ..Default::default() };
        let reports = [step(0.0), step(0.5)];
        let line = std::cell::RefCell::new(String::new());
        summarise(&|l| *line.borrow_mut() = l, &reports, 1.0, 2.0, 0);
        assert!(line.borrow().contains("AdamW 1.000 s"), "{}", line.borrow());
    }
}
