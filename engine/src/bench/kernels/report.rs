//! `bench kernels`' results in words and JSON: the table it prints, a JSON object per row and per
//! model's step.

use super::{Bound, KernelBenchReport, KernelRun, StepEstimate};
use crate::device::timing::Timer;

impl KernelBenchReport {
    /// The time share of each row in its model's step, when there is a step estimate.
    pub fn share_of_step(&self, run: &KernelRun) -> Option<f64> {
        let step = self.steps.iter().find(|s| s.model == run.model)?;
        Some(run.per_step as f64 * run.seconds / step.seconds)
    }

    /// One JSON object per kernel and shape.
    pub fn run_json(&self, r: &KernelRun) -> serde_json::Value {
        let compute = r.bound == Bound::Compute;
        serde_json::json!({
            "adapter": self.adapter, "model": r.model, "batch": self.batch, "seq_len": self.seq_len,
            "matmul_path": if r.precision.starts_with("f16-coop") { crate::device::gpu::MATMUL_COOP_PATH } else { self.matmul_path.as_str() },
            "matmul_coop": match &self.matmul_coop { Ok(_) => "available".to_string(), Err(why) => format!("unavailable on this adapter: {why}") },
            "kernel": r.kernel, "case": r.case, "shape": r.shape, "precision": r.precision,
            "bound": if compute { "compute" } else { "memory" },
            "flops": r.flops, "bytes": r.bytes, "seconds": r.seconds, "reps": r.reps, "timer": r.timer.name(),
            "gflops": if compute { Some(r.gflops()) } else { None },
            "gbps": r.gbps(),
            "peak_part": self.peak.map(|p| p.part),
            "peak_fp32_gflops": self.peak.map(|p| p.fp32_tflops * 1e3),
            "peak_mem_gbps": self.peak.map(|p| p.mem_gbps),
            "fraction_of_peak": r.fraction_of_peak(self.peak),
            "copy_gbps": self.copy_gbps,
            "fraction_of_copy": if compute { None } else { Some(r.gbps() / self.copy_gbps) },
            "per_step": r.per_step,
            "share_of_step": self.share_of_step(r),
            "variant": r.variant,
            "matmul_table": self.matmul_table,
        })
    }

    /// One JSON object per model: the device time of a step's kernels.
    pub fn step_json(&self, s: &StepEstimate) -> serde_json::Value {
        serde_json::json!({
            "adapter": self.adapter, "model": s.model, "batch": self.batch, "seq_len": self.seq_len,
            "layers": s.layers, "step_kernel_seconds": s.seconds, "timer": self.timer.name(),
            "tokens_per_s_at_full_busy": (self.batch * self.seq_len) as f64 / s.seconds,
        })
    }

    /// The table `bench kernels` prints.
    pub fn table(&self) -> String {
        let mut out = format!("adapter: {}; timer: {}", self.adapter, self.timer.name());
        if self.timer == Timer::WallClock {
            out += " (host clock around submit-and-wait: each time includes submission and wake-up latency)";
        }
        out += &match self.peak {
            Some(p) => format!("\npeak ({} datasheet): {:.1} TFLOP/s fp32, {:.0} GB/s", p.part, p.fp32_tflops, p.mem_gbps),
            None => "\npeak: unknown (adapter not in the datasheet table); memory-bound rows are also shown against the copy".into(),
        };
        out += &format!(
            "\nmeasured device-to-device copy: {:.1} GB/s (read + written); B={} T={}\nmatmul: {}\nmatmul variants: {}\nmatmul f16-coop: {}\n",
            self.copy_gbps,
            self.batch,
            self.seq_len,
            self.matmul_path,
            self.matmul_table,
            match &self.matmul_coop {
                Ok(path) => format!("{path} (rows f16-coop; % peak against the fp32 peak)"),
                Err(why) => format!("unavailable on this adapter ({why})"),
            }
        );
        out += &format!(
            "{:<8} {:<22} {:<54} {:<15} {:<23} {:>6} {:>11} {:>16} {:>7} {:>7} {:>6}\n",
            "model", "kernel", "case [variant]", "prec", "shape", "x/step", "time (us)", "rate", "% peak", "% copy", "% step"
        );
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}", 100.0 * v));
        for r in &self.runs {
            let case = match &r.variant {
                Some(v) => format!("{} [{v}]", r.case),
                None => r.case.clone(),
            };
            let (rate, copy) = match r.bound {
                Bound::Compute => (format!("{:.1} GFLOP/s", r.gflops()), None),
                Bound::Memory => (format!("{:.1} GB/s", r.gbps()), Some(r.gbps() / self.copy_gbps)),
            };
            out += &format!(
                "{:<8} {:<22} {:<54} {:<15} {:<23} {:>6} {:>11.1} {:>16} {:>7} {:>7} {:>6}\n",
                r.model,
                r.kernel,
                case,
                r.precision,
                r.shape,
                r.per_step,
                r.seconds * 1e6,
                rate,
                pct(r.fraction_of_peak(self.peak)),
                pct(copy),
                pct(self.share_of_step(r)),
            );
        }
        for s in &self.steps {
            out += &format!(
                "{}: the kernels of one fp32 training step (B={}, T={}, {} layers) take {:.2} ms of device time: {:.0} tokens/s if the device never waited\n",
                s.model,
                self.batch,
                self.seq_len,
                s.layers,
                s.seconds * 1e3,
                (self.batch * self.seq_len) as f64 / s.seconds
            );
        }
        out
    }
}
