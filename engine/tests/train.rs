//! The streaming trainer against PyTorch's training trajectories (`golden/gpt2-tiny`: 10 steps, clip
//! 1.0; `golden/gpt2-tiny-accum`: 8 steps of 2 micro-batches, clip 0.5), on the cpu and gpu devices;
//! and bit-identity of losses and final state across offload tiers, GPU budgets and recompute.
//!
//! The data is the copy of shared/golden in `tests/golden/` (see tests/golden.rs for its origin).

mod common;

use std::path::PathBuf;

use common::gpu_or_skip;
use safetensors::SafeTensors;
use zerostream::device::{Backend, CpuDevice};
use zerostream::train::{LrPlan, LrSchedule, ModelSource, Precision, TrainConfig, Trainer};
use zerostream_checkpoints::{HfModel, TokenFile};
use zerostream_offload::Tier;

fn golden_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)
}

struct Golden {
    settings: serde_json::Value,
    bytes: Vec<u8>,
}

impl Golden {
    fn load(name: &str) -> Self {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(golden_dir(name).join("golden.json")).unwrap()).unwrap();
        let bytes = std::fs::read(golden_dir(name).join("golden.safetensors")).unwrap();
        Golden { settings: json["config"].clone(), bytes }
    }
    fn setting(&self, key: &str) -> f64 {
        self.settings[key].as_str().unwrap().parse().unwrap()
    }
    fn f64(&self, name: &str) -> Vec<f64> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let view = st.tensor(name).unwrap_or_else(|_| panic!("golden tensor {name} missing"));
        view.data().chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect()
    }
    fn train_config(&self) -> TrainConfig {
        let steps = self.setting("steps") as u64;
        TrainConfig {
            batch: self.setting("batch") as usize,
            seq_len: self.setting("seq") as usize,
            grad_accum: self.setting("grad_accum") as usize,
            steps,
            lr: LrPlan { peak: self.setting("lr"), min: 0.0, warmup_steps: 0, total_steps: steps, schedule: LrSchedule::Constant },
            beta1: self.setting("beta1"),
            beta2: self.setting("beta2"),
            eps: self.setting("eps"),
            weight_decay: self.setting("wd"),
            grad_clip: self.setting("clip"),
            ..TrainConfig::default()
        }
    }
}

struct Run {
    losses: Vec<f64>,
    norms: Vec<f64>,
    final_params: Vec<(String, Vec<usize>, Vec<f32>)>,
    peak_bytes: u64,
}

fn run<D: Backend>(dev: &D, name: &str, tc: TrainConfig) -> Run {
    let hf = HfModel::open(&golden_dir(name).join("model")).unwrap();
    let tokens = TokenFile::open(&golden_dir(name).join("tokens.bin")).unwrap();
    let steps = tc.steps;
    let mut trainer = Trainer::new(dev, &ModelSource::Hf(&hf), tc).unwrap();
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let r = trainer.train_step(&tokens).unwrap();
        losses.push(r.loss);
        norms.push(r.grad_norm);
    }
    let final_params = trainer.master_weights().unwrap();
    Run { losses, norms, final_params, peak_bytes: dev.alloc_stats().peak_bytes }
}

fn check_trajectory<D: Backend>(dev: &D, name: &str, label: &str) {
    let golden = Golden::load(name);
    let got = run(dev, name, golden.train_config());
    let (want_loss, want_norm) = (golden.f64("trajectory.loss"), golden.f64("trajectory.grad_norm"));
    assert_eq!(got.losses.len(), want_loss.len());
    let mut worst = (0.0f64, 0.0f64);
    for (s, ((l, wl), (n, wn))) in got.losses.iter().zip(&want_loss).zip(got.norms.iter().zip(&want_norm)).enumerate() {
        let (le, ne) = ((l - wl).abs() / wl.abs(), (n - wn).abs() / wn.abs());
        assert!(le < 1e-5, "[{label} {name}] step {s}: loss {l} vs {wl}: relative error {le:.2e}");
        assert!(ne < 1e-4, "[{label} {name}] step {s}: grad norm {n} vs {wn}: relative error {ne:.2e}");
        worst = (worst.0.max(le), worst.1.max(ne));
    }
    println!("[{label} {name}] worst relative error over {} steps: loss {:.2e}, grad norm {:.2e}", want_loss.len(), worst.0, worst.1);
    // Final parameters: PyTorch's own float32 rerun lands within 0.03%-0.2% of the largest parameter of
    // this float64 reference (AdamW turns tiny differences in near-zero gradients into steps of size
    // lr); we hold each tensor to that bound, 0.2% of its largest magnitude, and report the worst.
    let mut worst = (String::new(), 0.0f64);
    for (tensor, _, values) in &got.final_params {
        let want = golden.f64(&format!("final.{tensor}"));
        let scale = want.iter().fold(0.0f64, |a, w| a.max(w.abs()));
        let err = values.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max) / scale;
        assert!(err < 2e-3, "[{label} {name}] final {tensor}: max abs error {err:.2e} of its largest magnitude");
        if err > worst.1 {
            worst = (tensor.clone(), err);
        }
    }
    println!("[{label} {name}] final parameters: worst max-abs error {:.2e} of the tensor's largest magnitude ({})", worst.1, worst.0);
}

#[test]
fn trajectories_match_pytorch_on_cpu() {
    let dev = CpuDevice::new(None);
    check_trajectory(&dev, "gpt2-tiny", "cpu");
    check_trajectory(&dev, "gpt2-tiny-accum", "cpu");
}

#[test]
fn trajectories_match_pytorch_on_gpu() {
    if let Some(gpu) = gpu_or_skip("trajectories_match_pytorch_on_gpu") {
        let label = gpu.describe();
        check_trajectory(&gpu, "gpt2-tiny", &label);
        check_trajectory(&gpu, "gpt2-tiny-accum", &label);
    }
}

fn bits(run: &Run) -> (Vec<u64>, Vec<u32>) {
    (
        run.losses.iter().map(|l| l.to_bits()).collect(),
        run.final_params.iter().flat_map(|(_, _, v)| v.iter().map(|x| x.to_bits())).collect(),
    )
}

#[test]
fn tiers_budgets_and_recompute_give_bit_identical_runs() {
    let golden = Golden::load("gpt2-tiny-accum");
    let base = TrainConfig { steps: 4, ..golden.train_config() };
    let reference = run(&CpuDevice::new(None), "gpt2-tiny-accum", base.clone());
    let nvme = tempfile::tempdir().unwrap();
    let variants = [
        (
            "optimizer and params on nvme",
            TrainConfig { offload_optimizer: Tier::Nvme, offload_params: Tier::Nvme, nvme_dir: Some(nvme.path().into()), ..base.clone() },
        ),
        ("recompute", TrainConfig { recompute: true, ..base.clone() }),
        ("smallest budget with recompute", TrainConfig { recompute: true, gpu_mem_budget: Some(0), ..base.clone() }),
    ];
    for (what, mut tc) in variants {
        if tc.gpu_mem_budget == Some(0) {
            // The smallest budget the planner accepts; one byte less is refused.
            let cfg = HfModel::open(&golden_dir("gpt2-tiny-accum").join("model")).unwrap().config;
            let minimum = zerostream::train::minimum_device_bytes(&cfg, &tc);
            assert!(zerostream::train::plan(&cfg, &TrainConfig { gpu_mem_budget: Some(minimum - 1), ..tc.clone() }, 1).is_err());
            tc.gpu_mem_budget = Some(minimum);
        }
        let budget = tc.gpu_mem_budget;
        let dev = CpuDevice::new(budget);
        let got = run(&dev, "gpt2-tiny-accum", tc);
        assert!(bits(&got) == bits(&reference), "{what}: losses or final parameters differ from the all-in-RAM run");
        if let Some(b) = budget {
            assert!(got.peak_bytes <= b, "{what}: peak {} bytes above the budget {b}", got.peak_bytes);
            println!("{what}: peak device bytes {} within the budget {b}", got.peak_bytes);
        }
    }
}

#[test]
fn half_precision_runs_follow_the_fp32_curve() {
    let golden = Golden::load("gpt2-tiny");
    let base = golden.train_config();
    let fp32 = run(&CpuDevice::new(None), "gpt2-tiny", base.clone());
    let gpu = gpu_or_skip("half_precision_runs_follow_the_fp32_curve (gpu part)");
    for precision in [Precision::Bf16, Precision::Fp16] {
        let got = run(&CpuDevice::new(None), "gpt2-tiny", TrainConfig { precision, ..base.clone() });
        for (s, (a, b)) in got.losses.iter().zip(&fp32.losses).enumerate() {
            let rel = (a - b).abs() / b;
            assert!(rel < 0.02, "{precision:?} step {s}: loss {a} vs fp32 {b} ({:.2}%)", rel * 100.0);
        }
        // The gpu device uploads the 16-bit words and widens them with a kernel: the same numbers.
        if let Some(gpu) = &gpu {
            let on_gpu = run(gpu, "gpt2-tiny", TrainConfig { precision, ..base.clone() });
            for (s, (a, b)) in on_gpu.losses.iter().zip(&got.losses).enumerate() {
                assert!((a - b).abs() / b < 1e-5, "{precision:?} step {s}: gpu loss {a} vs cpu {b}");
            }
        }
    }
}

#[test]
fn gpu_runs_under_the_smallest_budget_are_bit_identical_and_stay_within_it() {
    let Some(unlimited) = gpu_or_skip("gpu_runs_under_the_smallest_budget_are_bit_identical_and_stay_within_it") else { return };
    let golden = Golden::load("gpt2-tiny-accum");
    let base = TrainConfig { steps: 3, ..golden.train_config() };
    let reference = run(&unlimited, "gpt2-tiny-accum", base.clone());
    drop(unlimited);
    let tc = TrainConfig { recompute: true, ..base };
    let cfg = HfModel::open(&golden_dir("gpt2-tiny-accum").join("model")).unwrap().config;
    let minimum = zerostream::train::minimum_device_bytes(&cfg, &tc);
    let gpu = zerostream::device::GpuDevice::open(None, Some(minimum)).unwrap();
    let got = run(&gpu, "gpt2-tiny-accum", TrainConfig { gpu_mem_budget: Some(minimum), ..tc });
    assert!(got.peak_bytes <= minimum, "peak {} bytes above the budget {minimum}", got.peak_bytes);
    assert!(bits(&got) == bits(&reference), "the budgeted GPU run differs from the unlimited one");
    println!("gpu: budget {minimum} bytes, peak {} bytes, bit-identical to the unlimited run", got.peak_bytes);
    drop(gpu);
    // With a bf16 working copy the slots hold 16-bit matrices: a smaller minimum, still respected.
    let bf16 = TrainConfig { precision: Precision::Bf16, steps: 3, recompute: true, ..golden.train_config() };
    let minimum_bf16 = zerostream::train::minimum_device_bytes(&cfg, &bf16);
    assert!(minimum_bf16 < minimum, "16-bit slots should need less: {minimum_bf16} vs {minimum}");
    let gpu = zerostream::device::GpuDevice::open(None, Some(minimum_bf16)).unwrap();
    let got = run(&gpu, "gpt2-tiny-accum", TrainConfig { gpu_mem_budget: Some(minimum_bf16), ..bf16 });
    assert!(got.peak_bytes <= minimum_bf16, "bf16: peak {} bytes above the budget {minimum_bf16}", got.peak_bytes);
}
