//! `--matmul-inputs f16` (`TrainConfig::matmul_inputs`): every matmul's operands rounded to f16, sums in
//! f32. On the cpu device a run follows the f32 run up to that rounding, is deterministic, and leaves the
//! default f32 path untouched; on a GPU it runs the cooperative-matrix kernel where the adapter lists a
//! 16x16x16 or 8x8x8 f16 configuration (compared with the cpu device's f16 run), and otherwise refuses,
//! naming the adapter and the flag.
//!
//! The data is the copy of shared/golden in `tests/golden/` (see tests/golden.rs for its origin).

mod common;

use common::trajectory::{Golden, Run, bits, check_against, golden_dir, run};
use common::{coop_skipped, gpu_or_skip};
use zerostream::device::{CpuDevice, MatmulInputs};
use zerostream::model::Model;
use zerostream::train::{ModelSource, TrainConfig, Trainer};
use zerostream_checkpoints::{Gpt2Config, HfModel, TokenFile};

const NAME: &str = "gpt2-tiny-accum";

/// The largest relative difference between two runs' losses, and the largest absolute difference between
/// their final parameters.
fn distance(a: &Run, b: &Run) -> (f64, f64) {
    let loss = a.losses.iter().zip(&b.losses).map(|(x, y)| (x - y).abs() / y.abs()).fold(0.0, f64::max);
    let params = a
        .final_params
        .iter()
        .zip(&b.final_params)
        .flat_map(|((_, _, x), (_, _, y))| x.iter().zip(y).map(|(p, q)| (p - q).abs() as f64))
        .fold(0.0, f64::max);
    (loss, params)
}

/// lr x steps of the golden run.
fn tc_lr_steps(golden: &Golden) -> f64 {
    let tc = golden.train_config();
    tc.lr.peak * tc.steps as f64
}

#[test]
fn f16_inputs_on_cpu_follow_the_f32_run_up_to_the_rounding() {
    let golden = Golden::load(NAME);
    let tc = golden.train_config();
    let f32_run = run(&CpuDevice::new(None), NAME, tc.clone());
    // The default is f32 and is still PyTorch's trajectory.
    assert_eq!(tc.matmul_inputs, MatmulInputs::F32);
    check_against(&golden, &f32_run, NAME, "cpu, matmul inputs f32");

    let f16_tc = TrainConfig { matmul_inputs: MatmulInputs::F16, ..tc };
    let f16_run = run(&CpuDevice::new(None), NAME, f16_tc.clone());
    let again = run(&CpuDevice::new(None), NAME, f16_tc);
    assert!(bits(&again) == bits(&f16_run), "two f16-input runs differ");
    assert!(bits(&f16_run) != bits(&f32_run), "f16 inputs changed nothing: were they rounded?");
    let (loss, params) = distance(&f16_run, &f32_run);
    let adam_reach = 2.0 * tc_lr_steps(&golden);
    println!(
        "f16 inputs vs f32 on cpu: losses within {loss:.2e} relative, final parameters within {params:.2e} (AdamW's reach {adam_reach:.2e})"
    );
    // f16 keeps 11 significant bits (relative rounding 2^-11 = 4.9e-4 per input): the losses stay within
    // a few of those. The parameters: AdamW turns the sign of a near-zero gradient into a step of about
    // lr, so two runs can part by up to 2 lr per step however close their gradients; more (or a NaN)
    // would mean the f16 run went astray.
    assert!(loss < 5e-3, "losses {loss:.2e} apart");
    assert!(params <= adam_reach, "final parameters {params:.2e} apart, beyond AdamW's reach {adam_reach:.2e}");
}

/// With a vocabulary of 50257 and 1024 tokens a step, the output gradient of a logit the target is not
/// is about 1 / (1024 x 50257) = 1.9e-8, under half f16's smallest subnormal (6e-8): unscaled, every such
/// gradient rounds to zero and the rows of `wte` no token in the data names get no gradient at all, so
/// AdamW leaves them where the f32 run moves them by about lr (the drift a GPT-2 124M run showed on an
/// H200). Under f16 inputs the trainer scales the loss (by 65536 at first), and those rows move as in
/// the f32 run.
#[test]
fn f16_inputs_scale_the_loss_so_output_gradients_below_f16s_range_survive() {
    let golden = Golden::load(NAME);
    let dir = golden_dir(NAME);
    let Model::Gpt2(small) = Model::of_hf(&HfModel::open(&dir.join("model")).unwrap()).unwrap() else { panic!("a GPT-2 golden") };
    let data_vocab = small.vocab_size;
    let model = Model::Gpt2(Gpt2Config { vocab_size: 50257, ..small });
    let tokens = TokenFile::open(&dir.join("tokens.bin")).unwrap();
    let tc = TrainConfig { steps: 1, batch: 4, seq_len: 32, grad_accum: 8, ..golden.train_config() };
    let one_step = |matmul_inputs| {
        let dev = CpuDevice::new(None);
        let tc = TrainConfig { matmul_inputs, ..tc.clone() };
        let mut trainer = Trainer::new(&dev, &ModelSource::Random { model: model.clone(), seed: 7 }, tc).unwrap();
        let report = trainer.train_step(&tokens).unwrap();
        assert!(report.applied, "{matmul_inputs:?}: the step was skipped");
        (report.loss_scale, trainer.master_weights().unwrap())
    };
    let (f32_scale, exact) = one_step(MatmulInputs::F32);
    let (f16_scale, rounded) = one_step(MatmulInputs::F16);
    // The rows of the tied embedding past the data's vocabulary: moved by the output gradient only.
    let unnamed_rows = |params: &[(String, Vec<usize>, Vec<f32>)]| -> Vec<f32> {
        let (_, shape, values) = params.iter().find(|(name, _, _)| name.ends_with("wte.weight")).expect("wte");
        values[data_vocab * shape[1]..].to_vec()
    };
    let (exact, rounded) = (unnamed_rows(&exact), unnamed_rows(&rounded));
    let lr = tc.lr.peak as f32;
    let apart = exact.iter().zip(&rounded).filter(|(x, y)| (*x - *y).abs() > lr / 2.0).count();
    let share = apart as f64 / exact.len() as f64;
    println!("f16 inputs: {apart} of {} unnamed wte weights ({share:.4}) moved differently from f32", exact.len());
    // Unscaled, nearly all of them would; scaled, only those whose gradient is near zero may.
    assert!(share < 0.02, "{share:.4} of the unnamed wte weights moved differently from the f32 run: did their gradient underflow?");
    assert_eq!((f32_scale, f16_scale), (1.0, 65536.0), "loss scales");
}

#[test]
fn f16_inputs_on_gpu_run_the_coop_kernel_or_are_refused_by_name() {
    let Some(gpu) = gpu_or_skip("f16_inputs_on_gpu_run_the_coop_kernel_or_are_refused_by_name") else { return };
    let golden = Golden::load(NAME);
    let tc = TrainConfig { matmul_inputs: MatmulInputs::F16, steps: 3, ..golden.train_config() };
    if !gpu.has_coop_matmul() {
        coop_skipped("f16_inputs_on_gpu_run_the_coop_kernel_or_are_refused_by_name (the f16 GPU run; checking the refusal)", &gpu);
        let hf = HfModel::open(&golden_dir(NAME).join("model")).unwrap();
        let err = Trainer::new(&gpu, &ModelSource::Hf(&hf), tc).err().expect("the f16 run must be refused on this adapter");
        let text = format!("{err:#}");
        assert!(text.contains("--matmul-inputs f16") && text.contains(&gpu.summary().name), "{text}");
        // The command line refuses before it describes the run or writes anything.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zerostream"))
            .args(["train", "--device", "gpu", "--matmul-inputs", "f16", "--steps", "1", "--sample-tokens", "0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("--matmul-inputs f16") && !err.contains("training:"), "{err}");
        return;
    }
    let on_gpu = run(&gpu, NAME, tc.clone());
    let on_cpu = run(&CpuDevice::new(None), NAME, tc);
    let (loss, params) = distance(&on_gpu, &on_cpu);
    println!("f16 inputs, gpu (cooperative matrices) vs cpu: losses within {loss:.2e}, final parameters within {params:.2e}");
    let adam_reach = 2.0 * 3.0 * golden.train_config().lr.peak;
    assert!(loss < 1e-3 && params <= adam_reach, "gpu f16 run strays from the cpu f16 run: losses {loss:.2e}, params {params:.2e}");
}
