//! The streaming trainer against PyTorch's training trajectories (`golden/gpt2-tiny`: 10 steps, clip
//! 1.0; `golden/gpt2-tiny-accum`: 8 steps of 2 micro-batches, clip 0.5), on the cpu and gpu devices;
//! and bit-identity of losses and final state across offload tiers, GPU budgets and recompute.
//!
//! The data is the copy of shared/golden in `tests/golden/` (see tests/golden.rs for its origin).

mod common;

use common::gpu_or_skip;
use common::trajectory::{Golden, bits, check_trajectory, golden_dir, run};
use zerostream::device::{AllocCosts, Backend, CpuDevice};
use zerostream::train::{Precision, TrainConfig};
use zerostream_checkpoints::HfModel;
use zerostream_offload::Tier;

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

#[test]
fn tiers_budgets_and_recompute_give_bit_identical_runs() {
    let golden = Golden::load("gpt2-tiny-accum");
    let base = TrainConfig { steps: 4, ..golden.train_config() };
    let reference = run(&CpuDevice::new(None), "gpt2-tiny-accum", base.clone());
    let [nvme, grads_in_ram, grads_alone] = [(); 3].map(|_| tempfile::tempdir().unwrap());
    let variants = [
        (
            "optimizer and params on nvme",
            TrainConfig { offload_optimizer: Tier::Nvme, offload_params: Tier::Nvme, nvme_dirs: vec![nvme.path().into()], ..base.clone() },
        ),
        (
            "optimizer and params on nvme, gradients in ram",
            TrainConfig {
                offload_optimizer: Tier::Nvme,
                offload_gradients: Some(Tier::Ram),
                offload_params: Tier::Nvme,
                nvme_dirs: vec![grads_in_ram.path().into()],
                ..base.clone()
            },
        ),
        (
            "gradients alone on nvme",
            TrainConfig { offload_gradients: Some(Tier::Nvme), nvme_dirs: vec![grads_alone.path().into()], ..base.clone() },
        ),
        ("recompute", TrainConfig { recompute: true, ..base.clone() }),
        ("the strictly sequential schedule", TrainConfig { sequential: true, ..base.clone() }),
        ("smallest budget with recompute", TrainConfig { recompute: true, gpu_mem_budget: Some(0), ..base.clone() }),
    ];
    for (what, mut tc) in variants {
        if tc.gpu_mem_budget == Some(0) {
            // The smallest budget the planner accepts; one byte less is refused.
            let cfg = zerostream::model::Model::of_hf(&HfModel::open(&golden_dir("gpt2-tiny-accum").join("model")).unwrap()).unwrap();
            let minimum = zerostream::train::minimum_device_bytes_on(&cfg, &tc, AllocCosts::CPU);
            let one_less = TrainConfig { gpu_mem_budget: Some(minimum - 1), ..tc.clone() };
            assert!(zerostream::train::plan_on(&cfg, &one_less, 1, AllocCosts::CPU).is_err());
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
    // The files each NVMe directory holds, by kind: one per parameter group for each kind of state on
    // the tier. With the optimizer state on NVMe the gradient accumulator was there too (accumulated
    // across the two micro-batches of each step), unless --offload-gradients kept it in RAM.
    let files = |dir: &std::path::Path, kind: &str| {
        std::fs::read_dir(dir.join("rank0"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(&format!(".{kind}.rank0.bin")))
            .count()
    };
    let model = zerostream::model::Model::of_hf(&HfModel::open(&golden_dir("gpt2-tiny-accum").join("model")).unwrap()).unwrap();
    let groups = zerostream::train::layout::group_layouts(&model).len();
    assert_eq!([files(nvme.path(), "grad"), files(nvme.path(), "master")], [groups; 2], "everything on nvme");
    assert_eq!([files(grads_in_ram.path(), "grad"), files(grads_in_ram.path(), "master")], [0, groups], "gradients in ram");
    assert_eq!([files(grads_alone.path(), "grad"), files(grads_alone.path(), "master")], [groups, 0], "gradients alone on nvme");
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
    // The overlapped schedule (uploads ahead, downloads behind the next backward, AdamW behind the next
    // step) against the strictly sequential one.
    let sequential = run(&unlimited, "gpt2-tiny-accum", TrainConfig { sequential: true, ..base.clone() });
    assert!(bits(&sequential) == bits(&reference), "the overlapped GPU run differs from the sequential schedule");
    drop(unlimited);
    let tc = TrainConfig { recompute: true, ..base };
    let cfg = zerostream::model::Model::of_hf(&HfModel::open(&golden_dir("gpt2-tiny-accum").join("model")).unwrap()).unwrap();
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

/// Working copies in pinned host memory (the default on a gpu device) train bit for bit as those in
/// ordinary memory, in fp32 and bf16, and the pinned runs do upload from there (every tensor, however
/// small: the golden's are all under the 1 MiB below which uploads go through `write_buffer`) (two ranks at stage 2,
/// whose gather completes the copy in place: `tests/ranks.rs`).
#[test]
fn pinned_working_copies_give_bit_identical_runs() {
    let Some(gpu) = gpu_or_skip("pinned_working_copies_give_bit_identical_runs") else { return };
    if let Some(why) = gpu.host_staging_unavailable() {
        eprintln!("SKIPPED pinned_working_copies_give_bit_identical_runs: no host-memory buffers here ({why})");
        return;
    }
    gpu.set_pinned_copy_min_bytes(0);
    let golden = Golden::load("gpt2-tiny-accum");
    let base = TrainConfig { steps: 3, ..golden.train_config() };
    for precision in [Precision::Fp32, Precision::Bf16] {
        let tc = TrainConfig { precision, ..base.clone() };
        let before = gpu.pinned_upload_bytes();
        let pinned = run(&gpu, "gpt2-tiny-accum", tc.clone());
        assert!(gpu.pinned_upload_bytes() > before, "{precision:?}: nothing was uploaded from pinned memory");
        let before = gpu.pinned_upload_bytes();
        let plain = run(&gpu, "gpt2-tiny-accum", TrainConfig { pin_memory: false, ..tc });
        assert_eq!(gpu.pinned_upload_bytes(), before, "{precision:?}: --no-pin-memory uploaded from pinned memory");
        assert!(bits(&pinned) == bits(&plain), "{precision:?}: pinned working copies changed the run");
    }
}

/// `--copy-queue` (the pinned uploads and read-backs on a second queue, ordered against wgpu's by
/// timeline semaphores and the buffers each submission uses) trains bit for bit as wgpu's one queue,
/// in fp32 and bf16, overlapped, sequential and at the minimum budget (blocks re-uploaded in the
/// backward), and both kinds of copy do run there. Lavapipe has one queue, so its own stands in: the
/// semaphores, the tracking, the raw copies and the waits all run, though nothing overlaps.
#[test]
fn copy_queue_gives_bit_identical_runs() {
    use zerostream::device::ReadBack;
    let test = "copy_queue_gives_bit_identical_runs";
    let Some(gpu) = gpu_or_skip(test) else { return };
    if let Some(why) = gpu.pinned_read_back_unavailable() {
        eprintln!("SKIPPED {test}: no host-memory buffers here ({why})");
        return;
    }
    gpu.set_pinned_copy_min_bytes(0);
    // Mapped read-backs chosen: --copy-queue reads back through pinned memory all the same, and
    // gives the choice back after.
    gpu.set_read_back(ReadBack::Mapped).unwrap();
    let golden = Golden::load("gpt2-tiny-accum");
    let base = TrainConfig { steps: 3, ..golden.train_config() };
    for tc in [base.clone(), TrainConfig { precision: Precision::Bf16, ..base.clone() }, TrainConfig { sequential: true, ..base.clone() }] {
        let one_queue = run(&gpu, "gpt2-tiny-accum", tc.clone());
        assert_eq!((gpu.copy_queue_in_use(), gpu.read_back()), (None, ReadBack::Mapped));
        let two_queues = run(&gpu, "gpt2-tiny-accum", TrainConfig { copy_queue: true, ..tc.clone() });
        assert_eq!(gpu.read_back(), ReadBack::Pinned);
        let (up, down) = gpu.copy_queue_bytes();
        assert!(up > 0 && down > 0, "{:?}: {up} bytes up and {down} down on the copy queue", tc.precision);
        assert!(bits(&two_queues) == bits(&one_queue), "{:?} sequential {}: the copy queue changed the run", tc.precision, tc.sequential);
    }
    // A read-back kind chosen while the route is on stands after it.
    gpu.set_copy_queue(false).unwrap();
    gpu.set_copy_queue(true).unwrap();
    gpu.set_read_back(ReadBack::Pinned).unwrap();
    gpu.set_copy_queue(false).unwrap();
    assert_eq!(gpu.read_back(), ReadBack::Pinned, "turning --copy-queue off undid a later choice");
    drop(gpu);
    let tc = TrainConfig { recompute: true, ..base };
    let cfg = zerostream::model::Model::of_hf(&HfModel::open(&golden_dir("gpt2-tiny-accum").join("model")).unwrap()).unwrap();
    let minimum = zerostream::train::minimum_device_bytes(&cfg, &tc);
    let gpu = zerostream::device::GpuDevice::open(None, Some(minimum)).unwrap();
    gpu.set_pinned_copy_min_bytes(0);
    gpu.set_read_back(ReadBack::Pinned).unwrap();
    let tc = TrainConfig { gpu_mem_budget: Some(minimum), ..tc };
    let one_queue = run(&gpu, "gpt2-tiny-accum", tc.clone());
    let two_queues = run(&gpu, "gpt2-tiny-accum", TrainConfig { copy_queue: true, ..tc });
    assert!(gpu.copy_queue_bytes().0 > 0, "nothing uploaded on the copy queue at the minimum budget");
    assert!(bits(&two_queues) == bits(&one_queue), "the copy queue changed the run at the minimum budget");
}

/// Gradients read back through pinned host memory (`ReadBack::Pinned`, where `zerostream tune` finds it
/// faster) give the same run, bit for bit, as through wgpu's mapped buffers, in fp32 and bf16 (16-bit
/// reads among them), with gradient accumulation; and they are read there.
#[test]
fn pinned_read_backs_give_bit_identical_runs() {
    use zerostream::device::ReadBack;
    let Some(gpu) = gpu_or_skip("pinned_read_backs_give_bit_identical_runs") else { return };
    if let Some(why) = gpu.pinned_read_back_unavailable() {
        eprintln!("SKIPPED pinned_read_backs_give_bit_identical_runs: no host-memory buffers here ({why})");
        return;
    }
    let golden = Golden::load("gpt2-tiny-accum");
    let base = TrainConfig { steps: 3, ..golden.train_config() };
    for precision in [Precision::Fp32, Precision::Bf16] {
        let tc = TrainConfig { precision, ..base.clone() };
        gpu.set_read_back(ReadBack::Pinned).unwrap();
        let before = gpu.pinned_read_bytes();
        let pinned = run(&gpu, "gpt2-tiny-accum", tc.clone());
        assert!(gpu.pinned_read_bytes() > before, "{precision:?}: nothing was read through pinned memory");
        gpu.set_read_back(ReadBack::Mapped).unwrap();
        let before = gpu.pinned_read_bytes();
        let mapped = run(&gpu, "gpt2-tiny-accum", tc);
        assert_eq!(gpu.pinned_read_bytes(), before, "{precision:?}: mapped read-backs went through pinned memory");
        assert!(bits(&pinned) == bits(&mapped), "{precision:?}: pinned read-backs changed the run");
    }
}

/// A library caller's data reaches the trainer without `run`'s vocabulary check: an input id past the
/// vocabulary is refused where it is embedded, and so is a target id (it would fall in no chunk of
/// the loss and count as logit 0); a configuration that cannot train is refused by the trainer too,
/// and so is a validation of more micro-batches than the data holds (it would count some twice).
#[test]
fn the_trainer_refuses_ids_past_the_vocabulary_and_a_configuration_that_cannot_train() {
    use zerostream::model::Model;
    use zerostream::train::{ModelSource, Trainer};
    use zerostream_checkpoints::TokenFile;
    let dir = golden_dir("gpt2-tiny");
    let model = Model::of_hf(&HfModel::open(&dir.join("model")).unwrap()).unwrap();
    let vocab = model.vocab_size() as u32;
    let tc = TrainConfig { steps: 1, batch: 1, seq_len: 4, ..TrainConfig::default() };
    let dev = CpuDevice::new(None);
    let source = ModelSource::Random { model: model.clone(), seed: 1 };
    // One micro-batch of 4 inputs: ids 0..4, and the target after the last, past the vocabulary.
    let target_past = TokenFile::from_ids("target-past", &[1, 2, 3, 4, vocab]);
    let err = Trainer::new(&dev, &source, tc.clone()).unwrap().train_step(&target_past).unwrap_err().to_string();
    assert!(err.contains(&format!("target token id {vocab}")), "{err}");
    // The first input, which is no target.
    let input_past = TokenFile::from_ids("input-past", &[vocab, 2, 3, 4, 5]);
    let err = Trainer::new(&dev, &source, tc.clone()).unwrap().train_step(&input_past).unwrap_err().to_string();
    assert!(err.contains(&format!("token id {vocab} (position 0 of the micro-batch)")), "{err}");
    // Two micro-batches of 4 tokens (9 ids): the first two are read, a third is refused.
    let held_out = TokenFile::from_ids("held-out", &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let mut trainer = Trainer::new(&dev, &source, tc.clone()).unwrap();
    assert!(trainer.validation_loss(&held_out, 2).unwrap().is_finite());
    let err = trainer.validation_loss(&held_out, 3).unwrap_err().to_string();
    assert!(err.contains("held-out holds 2 micro-batches of B x T tokens, fewer than the 3 asked"), "{err}");
    let err = Trainer::new(&dev, &source, TrainConfig { steps: 0, ..tc }).err().expect("refused").to_string();
    assert!(err.contains("--steps must be at least 1"), "{err}");
}

/// A program builds a run with `RunRequest::new` and launches it as the command line does: the steps
/// run, and `--metrics` gets its rows and the resolved configuration beside it, made from the
/// program's settings.
#[test]
fn a_run_request_built_by_a_program_launches_as_the_command_line_does() {
    use zerostream::DeviceChoice;
    use zerostream::train::launch::{Launched, RunRequest, launch};
    use zerostream::train::run::{ModelChoice, RunOptions};
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("run.jsonl");
    let mut options = RunOptions::new(ModelChoice::Demo);
    (options.progress, options.sample_tokens, options.metrics) = (false, 0, Some(metrics.clone()));
    let mut req = RunRequest::new(options, TrainConfig { steps: 2, batch: 2, seq_len: 16, ..TrainConfig::default() });
    req.ranks.device = DeviceChoice::Cpu;
    let Launched::Ran { rank: 0, summary } = launch(req).unwrap() else { panic!("nothing was trained") };
    assert_eq!(summary.steps.len(), 2);
    assert_eq!(std::fs::read_to_string(&metrics).unwrap().lines().filter(|l| l.contains("\"loss\"")).count(), 2);
    let resolved: toml::Table = std::fs::read_to_string(dir.path().join("run.config.toml")).unwrap().parse().unwrap();
    assert_eq!((resolved["steps"].as_integer(), resolved["batch-size"].as_integer()), (Some(2), Some(2)), "{resolved}");
}

/// A program saving a checkpoint on one rank without the root it holds is refused before anything is
/// written (nothing would commit the files); with the root, the checkpoint is committed.
#[test]
fn a_checkpoint_saved_without_its_root_on_rank_zero_is_refused() {
    use zerostream::train::{ModelSource, RunRecord, SaveDtype, Trainer};
    use zerostream_checkpoints::checkpoint::CheckpointRoot;
    let demo = zerostream::train::demo::Demo::get().unwrap();
    let dev = CpuDevice::new(None);
    let source = ModelSource::Random { model: demo.model(), seed: 1 };
    let mut trainer = Trainer::new(&dev, &source, TrainConfig { steps: 1, batch: 1, seq_len: 8, ..TrainConfig::default() }).unwrap();
    trainer.train_step(&demo.train_tokens()).unwrap();
    let record = RunRecord {
        seed: 1,
        data: "hamlet".into(),
        data_tokens: demo.train_tokens().len,
        settings: trainer.train().to_flags(),
        outputs: Default::default(),
        save_dtype: SaveDtype::F32,
        keep: 0,
        extras: Default::default(),
    };
    let dir = tempfile::tempdir().unwrap();
    let err = trainer.save_checkpoint(dir.path(), None, &record, 1.0).unwrap_err().to_string();
    assert!(err.contains("rank 0 commits it and needs its root"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing written");
    let root = CheckpointRoot::open(dir.path(), None).unwrap();
    let saved = trainer.save_checkpoint(dir.path(), Some(&root), &record, 1.0).unwrap();
    assert!(saved.join("trainer_state.json").is_file() && saved.join("model.safetensors").is_file(), "{}", saved.display());
}
