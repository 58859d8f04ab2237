//! 02: train the built-in GPT-2 on Hamlet in words through the library, with the optimizer state on
//! the NVMe tier (a temporary directory) and a small device budget, then print a sample. The budget
//! is given twice: to the device, which enforces it, and to `TrainConfig`, which plans the placement
//! under it.
//!
//! Shows: `TrainConfig` (the same settings `zerostream train` has flags for), the placement the
//! trainer decides at start-up, and the per-step reports.
//! Run: `cargo run --release -p zerostream-examples --example 02_train_hamlet [STEPS]`

use zerostream::device::{self, DeviceChoice};
use zerostream::offload::Tier;
use zerostream::train::run::{ModelChoice, RunOptions};
use zerostream::train::{LrPlan, LrSchedule, TrainConfig};

fn main() -> anyhow::Result<()> {
    let steps: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(100);
    let nvme = std::env::temp_dir().join(format!("zerostream-example-{}", std::process::id()));
    std::fs::create_dir_all(&nvme)?;
    let budget = 64 << 20;
    let train = TrainConfig {
        batch: 8,
        seq_len: 128,
        steps,
        lr: LrPlan { peak: 2e-3, min: 1e-4, warmup_steps: 10, total_steps: steps, schedule: LrSchedule::Cosine },
        gpu_mem_budget: Some(budget),
        offload_optimizer: Tier::Nvme,
        nvme_dirs: vec![nvme.clone()],
        ..TrainConfig::default()
    };
    let options = RunOptions { sample_tokens: 200, ..RunOptions::new(ModelChoice::Demo) };
    let dev = device::open(DeviceChoice::Auto, None, Some(budget))?;
    let summary = zerostream::train::run::run_on(&dev, &options, train);
    // The NVMe tier's files go whether or not the run succeeded (the run's error is the one to see).
    let _ = std::fs::remove_dir_all(&nvme);
    let summary = summary?;
    if let (Some(first), Some(last)) = (summary.steps.first(), summary.steps.last()) {
        println!("loss {:.3} -> {:.3} in {:.1} s", first.loss, last.loss, summary.seconds);
    }
    Ok(())
}
