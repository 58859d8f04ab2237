//! Resuming from a checkpoint through the `zerostream` binary equals not stopping: 10 steps straight
//! and 5 + resume + 5 give bit-identical metrics and checkpoints (both devices, every precision, RAM
//! and NVMe, GPT-2 and Llama); a checkpoint resumed at another world size stays on the golden
//! trajectory; and `eval`, which streams a saved model block by block, gives the golden loss.

mod common;

use common::cli::{assert_same_checkpoint, path, stderr, strings, trajectory, zerostream};

/// The tiny golden model `name` and its tokens, with a cosine schedule whose warm-up ends mid-run.
fn golden_args(name: &str, extra: &[&str]) -> Vec<String> {
    let g = common::trajectory::golden_dir(name);
    let mut a = strings(&[
        "train",
        "--model",
        g.join("model").to_str().unwrap(),
        "--data",
        g.join("tokens.bin").to_str().unwrap(),
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--grad-accum",
        "2",
        "--lr",
        "1e-3",
        "--lr-schedule",
        "cosine",
        "--warmup-steps",
        "4",
        "--min-lr",
        "1e-4",
        "--sample-tokens",
        "0",
    ]);
    a.extend(strings(extra));
    a
}

/// Trains 10 steps straight, and 5 + 5 with a resume between, with `extra` flags; asserts the metrics
/// and the final checkpoints are identical.
fn check_resume_equality(label: &str, extra: &[&str]) {
    check_resume_equality_of("gpt2-tiny-accum", label, extra)
}

fn check_resume_equality_of(golden: &str, label: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    let with = |more: &[&str]| {
        let mut a = golden_args(golden, extra);
        a.extend(strings(more));
        a
    };
    // One run: to `steps`, checkpointing into run `name`'s directory, resuming from it if asked.
    let leg = |name: &str, steps: &str, resume: bool| {
        let (ck, metrics, nvme) = (path(&d(name)), path(&d(&format!("{name}.jsonl"))), path(&d(&format!("nvme-{name}"))));
        let mut args = vec!["--steps", steps, "--checkpoint-dir", &ck, "--metrics", &metrics, "--nvme-dir", &nvme];
        if resume {
            args.extend(["--resume", &ck]);
        }
        let out = zerostream(&with(&args));
        assert!(out.status.success(), "[{label}] {}", stderr(&out));
        out
    };
    leg("a", "10", false);
    leg("b", "5", false);
    // --steps counts from the start; the settings (schedule length included) come from the flags,
    // which must agree with the checkpoint's.
    let second = leg("b", "10", true);
    assert!(stderr(&second).contains("resumed from"), "{}", stderr(&second));
    let (a, b) = (trajectory(&d("a.jsonl")), trajectory(&d("b.jsonl")));
    assert_eq!(a.len(), 10);
    assert_eq!(a, b, "[{label}] losses and gradient norms, bit for bit");
    assert_same_checkpoint(&d("a").join("step-00000010"), &d("b").join("step-00000010"), label);
    eprintln!("[{label}] 10 steps == 5 + resume + 5: losses, norms, weights, moments and counters bit-identical");
}

#[test]
fn resuming_equals_not_stopping_on_the_cpu_device() {
    check_resume_equality("cpu fp32 ram", &["--device", "cpu"]);
    check_resume_equality(
        "cpu bf16 nvme",
        &["--device", "cpu", "--precision", "bf16", "--offload-optimizer", "nvme", "--offload-params", "nvme"],
    );
    check_resume_equality("cpu fp16 ram", &["--device", "cpu", "--precision", "fp16"]);
    // f16 matmul inputs: the dynamic loss scale comes back from the checkpoint as it was.
    check_resume_equality("cpu f16 matmul inputs", &["--device", "cpu", "--matmul-inputs", "f16"]);
    // bf16 moments come back from the checkpoint's BF16 tensors as they were, rounding noise and all.
    check_resume_equality("cpu bf16 moments nvme", &["--device", "cpu", "--adam-state", "bf16", "--offload-optimizer", "nvme"]);
    // Striped over a second directory (each leg's own --nvme-dir is the first).
    let second = tempfile::tempdir().unwrap();
    let second = second.path().to_str().unwrap();
    check_resume_equality(
        "cpu striped nvme",
        &["--device", "cpu", "--offload-optimizer", "nvme", "--offload-params", "nvme", "--nvme-dir", second],
    );
    // A resumed run draws the masks the uninterrupted one would have, recomputed activations too.
    check_resume_equality("cpu dropout recompute", &["--device", "cpu", "--dropout", "0.1", "--recompute"]);
}

/// A `--matmul-inputs f16` checkpoint from before that flag scaled the loss (its scale fixed at 1) is
/// resumed with a dynamic scale, and the run says so.
#[test]
fn an_unscaled_f16_inputs_checkpoint_resumes_with_a_dynamic_scale() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let metrics = dir.path().join("m.jsonl");
    let run = |steps: &str, resume: bool| {
        let mut more = vec!["--device", "cpu", "--matmul-inputs", "f16", "--steps", steps, "--checkpoint-dir", ck.to_str().unwrap()];
        more.extend(["--metrics", metrics.to_str().unwrap()]);
        if resume {
            more.extend(["--resume", ck.to_str().unwrap()]);
        }
        let out = zerostream(&golden_args("gpt2-tiny-accum", &more));
        assert!(out.status.success(), "{}", stderr(&out));
        out
    };
    run("2", false);
    let state_path = ck.join("step-00000002").join("trainer_state.json");
    let mut state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    assert_eq!(state["loss_scaler"]["scale"], 65536.0, "{}", state["loss_scaler"]);
    state["loss_scaler"] = serde_json::json!({ "scale": 1.0, "clean_steps": 0, "growth_interval": u32::MAX });
    std::fs::write(&state_path, serde_json::to_string(&state).unwrap()).unwrap();
    let out = run("3", true);
    assert!(stderr(&out).contains("loss scale is fixed at 1: this run scales the loss dynamically"), "{}", stderr(&out));
    let last: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&metrics).unwrap().lines().last().unwrap()).unwrap();
    assert_eq!((last["step"].as_u64(), last["loss_scale"].as_f64()), (Some(2), Some(65536.0)), "{last}");
}

#[test]
fn resuming_a_llama_equals_not_stopping() {
    check_resume_equality_of(
        "llama-tiny",
        "llama cpu bf16 nvme",
        &["--device", "cpu", "--precision", "bf16", "--offload-optimizer", "nvme"],
    );
    if common::gpu_or_skip("resuming_a_llama_equals_not_stopping (gpu)").is_some() {
        check_resume_equality_of("llama-tiny", "llama gpu fp32 two ranks", &["--device", "gpu", "--world-size", "2", "--zero-stage", "3"]);
    }
}

/// LAMB's two moments and LARS's one buffer come back from the checkpoint (on the NVMe tier, split
/// over two ranks), and a resume that changes the optimizer is refused by name.
#[test]
fn resuming_with_lamb_or_lars_equals_not_stopping() {
    check_resume_equality(
        "cpu lamb nvme two ranks",
        &["--device", "cpu", "--optimizer", "lamb", "--offload-optimizer", "nvme", "--world-size", "2"],
    );
    check_resume_equality("cpu lars ram stage 3", &["--device", "cpu", "--optimizer", "lars", "--world-size", "2", "--zero-stage", "3"]);

    let dir = tempfile::tempdir().unwrap();
    let ck = path(&dir.path().join("ck"));
    let mut first = golden_args("gpt2-tiny-accum", &["--device", "cpu", "--optimizer", "lars"]);
    first.extend(strings(&["--steps", "2", "--checkpoint-dir", &ck]));
    let out = zerostream(&first);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = std::fs::read(dir.path().join("ck/step-00000002/optimizer.rank0.safetensors")).unwrap();
    let names: Vec<String> = safetensors::SafeTensors::deserialize(&file).unwrap().names().into_iter().map(str::to_string).collect();
    assert!(names.iter().any(|n| n.ends_with(".momentum")) && !names.iter().any(|n| n.contains(".adam_")), "LARS's state: {names:?}");
    let mut changed = golden_args("gpt2-tiny-accum", &["--device", "cpu", "--optimizer", "lamb"]);
    changed.extend(strings(&["--steps", "4", "--checkpoint-dir", &ck, "--resume", &ck]));
    let out = zerostream(&changed);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--optimizer lamb") && err.contains("lars"), "{err}");
}

/// `--grad-compression`'s error-feedback residuals are checkpointed per rank: with two ranks, 10 steps
/// straight equal 5 + resume + 5 bit for bit (the residuals among the files compared), the residuals
/// saved are not zero (so restoring them matters), and a resume that changes the mode is refused by name.
#[test]
fn resuming_with_grad_compression_restores_the_error_feedback() {
    let two = ["--device", "cpu", "--world-size", "2"];
    check_resume_equality(
        "cpu onebit two ranks",
        &[&two[..], &["--grad-compression", "onebit", "--grad-compression-chunk", "64"]].concat(),
    );
    check_resume_equality("cpu topk stage 1", &[&two[..], &["--zero-stage", "1", "--grad-compression", "topk:0.1"]].concat());
    // Stage 0: each rank's residual covers the whole of every group.
    check_resume_equality("cpu onebit stage 0", &[&two[..], &["--zero-stage", "0", "--grad-compression", "onebit"]].concat());
    // Three ranks: the two-phase all-reduce, whose residual is the reduce-scatter's and the owner's.
    let three = ["--device", "cpu", "--world-size", "3", "--zero-stage", "0", "--grad-compression", "onebit"];
    check_resume_equality("cpu onebit stage 0, three ranks", &three);
    // 1-bit Adam's frozen variance, frozen before the split: the resumed run keeps it frozen.
    // The state on NVMe: rank 1 pages in its master weights (for the replicas' CRC), not its moments.
    let frozen = [
        "--zero-stage",
        "0",
        "--grad-compression",
        "onebit",
        "--grad-compression-warmup",
        "3",
        "--freeze-variance",
        "--offload-optimizer",
        "nvme",
    ];
    check_resume_equality("cpu onebit stage 0 frozen variance", &[&two[..], &frozen[..]].concat());
    // The resumed run gathers the working copy through the codec again, as the uninterrupted one had.
    check_resume_equality("cpu int8 parameters stage 2", &[&two[..], &["--param-compression", "int8"]].concat());
    check_resume_equality("cpu int8 parameters stage 3", &[&two[..], &["--zero-stage", "3", "--param-compression", "int8"]].concat());

    let dir = tempfile::tempdir().unwrap();
    let ck = path(&dir.path().join("ck"));
    let mut first = golden_args("gpt2-tiny-accum", &two);
    first.extend(strings(&["--grad-compression", "int8", "--steps", "2", "--checkpoint-dir", &ck]));
    let out = zerostream(&first);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = std::fs::read(dir.path().join("ck/step-00000002/optimizer.rank1.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&file).unwrap();
    let residuals: Vec<_> = st.names().into_iter().filter(|n| n.ends_with(".grad_residual")).collect();
    assert!(!residuals.is_empty(), "no residual saved");
    let nonzero = residuals.iter().any(|n| st.tensor(n).unwrap().data().iter().any(|&b| b != 0));
    assert!(nonzero, "every saved residual is zero");
    let mut changed = golden_args("gpt2-tiny-accum", &two);
    changed.extend(strings(&["--grad-compression", "bf16", "--steps", "4", "--checkpoint-dir", &ck, "--resume", &ck]));
    let out = zerostream(&changed);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--grad-compression bf16") && err.contains("int8"), "{err}");

    // Stage 0's residuals cover whole groups: a sharded stage resumes without them, saying so.
    let dir = tempfile::tempdir().unwrap();
    let ck = path(&dir.path().join("ck"));
    let mut zero = golden_args("gpt2-tiny-accum", &two);
    zero.extend(strings(&["--zero-stage", "0", "--grad-compression", "onebit", "--steps", "2", "--checkpoint-dir", &ck]));
    let out = zerostream(&zero);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut sharded = golden_args("gpt2-tiny-accum", &two);
    sharded.extend(strings(&[
        "--zero-stage",
        "2",
        "--grad-compression",
        "onebit",
        "--steps",
        "4",
        "--checkpoint-dir",
        &ck,
        "--resume",
        &ck,
    ]));
    let out = zerostream(&sharded);
    let err = stderr(&out);
    assert!(
        out.status.success()
            && err.contains("at ZeRO stage 0, laid out as whole group do not map onto")
            && err.contains("start again from zero"),
        "{err}"
    );
}

/// `--freeze-variance`: the checkpoints after the warm-up's last step hold that step's second moment
/// bit for bit while the first moment goes on (AdamW and LAMB), and a resume that adds the flag to a
/// run without it is refused by name (one that leaves it out keeps the checkpoint's).
#[test]
fn a_frozen_variance_stays_as_the_warmup_left_it() {
    for optimizer in ["adamw", "lamb"] {
        let dir = tempfile::tempdir().unwrap();
        let ck = path(&dir.path().join("ck"));
        let flags = ["--device", "cpu", "--world-size", "2", "--zero-stage", "0", "--grad-compression", "onebit", "--optimizer", optimizer];
        let mut a = golden_args("gpt2-tiny-accum", &flags);
        a.extend(strings(&[
            "--grad-compression-warmup",
            "2",
            "--freeze-variance",
            "--steps",
            "4",
            "--checkpoint-every",
            "1",
            "--checkpoint-dir",
            &ck,
        ]));
        let out = zerostream(&a);
        assert!(out.status.success(), "{optimizer}: {}", stderr(&out));
        let file = |step: u32| std::fs::read(dir.path().join(format!("ck/step-{step:08}/optimizer.rank0.safetensors"))).unwrap();
        let files: Vec<Vec<u8>> = (1..=4).map(file).collect();
        let tensors: Vec<_> = files.iter().map(|f| safetensors::SafeTensors::deserialize(f).unwrap()).collect();
        let (m, v) = ("adam_m", "adam_v"); // LAMB's moments share AdamW's names
        let moment = |step: usize, kind: &str| -> Vec<Vec<u8>> {
            let st = &tensors[step - 1];
            let mut names: Vec<_> = st.names().into_iter().filter(|n| n.ends_with(&format!(".{kind}"))).collect();
            names.sort();
            assert!(!names.is_empty(), "{optimizer}: no {kind} at step {step}");
            names.iter().map(|n| st.tensor(n).unwrap().data().to_vec()).collect()
        };
        assert_ne!(moment(1, v), moment(2, v), "{optimizer}: the variance changes during the warm-up");
        assert_eq!(moment(2, v), moment(3, v), "{optimizer}: the variance changed after the freeze");
        assert_eq!(moment(2, v), moment(4, v), "{optimizer}: the variance changed after the freeze");
        assert_ne!(moment(3, m), moment(4, m), "{optimizer}: the first moment stood still");
    }
    let dir = tempfile::tempdir().unwrap();
    let ck = path(&dir.path().join("ck"));
    let flags = ["--device", "cpu", "--world-size", "2", "--grad-compression", "onebit", "--grad-compression-warmup", "1"];
    let mut a = golden_args("gpt2-tiny-accum", &flags);
    a.extend(strings(&["--steps", "2", "--checkpoint-dir", &ck]));
    let out = zerostream(&a);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut b = golden_args("gpt2-tiny-accum", &flags);
    b.extend(strings(&["--freeze-variance", "--steps", "3", "--checkpoint-dir", &ck, "--resume", &ck]));
    let out = zerostream(&b);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("freeze-variance"), "{err}");
}

#[test]
fn resuming_equals_not_stopping_on_the_gpu() {
    if common::gpu_or_skip("resuming_equals_not_stopping_on_the_gpu").is_none() {
        return;
    }
    check_resume_equality("gpu fp32 nvme", &["--device", "gpu", "--offload-optimizer", "nvme"]);
    check_resume_equality("gpu bf16 ram dropout", &["--device", "gpu", "--precision", "bf16", "--dropout", "0.1"]);
    check_resume_equality("gpu fp16 nvme", &["--device", "gpu", "--precision", "fp16", "--offload-params", "nvme"]);
}

/// The golden contract's run (gpt2-tiny-accum: 8 steps of 2 micro-batches) split at step 4 between two
/// world sizes, or between stage 0 (every rank's file the whole state) and a sharded stage: the resumed
/// trajectory is the uninterrupted one-rank run's bit for bit (one micro-batch per rank, so every
/// stage sums in the micro-batches' order), which stays within the golden tolerances.
#[test]
fn a_checkpoint_resumes_at_another_world_size_on_the_golden_trajectory() {
    let golden = common::trajectory::Golden::load("gpt2-tiny-accum");
    let g = common::trajectory::golden_dir("gpt2-tiny-accum");
    let (want_loss, want_norm) = (golden.f64("trajectory.loss"), golden.f64("trajectory.grad_norm"));
    // (world, accumulation, stage) before; (world, stage) after.
    let splits = [
        (("2", "1", "3"), ("1", "3")),
        (("1", "2", "2"), ("2", "3")),
        (("2", "1", "0"), ("2", "3")),
        (("2", "1", "3"), ("2", "0")),
        (("2", "1", "0"), ("1", "2")),
    ];
    let mut uninterrupted = None;
    for (before, after) in std::iter::once((("1", "2", "2"), ("", ""))).chain(splits) {
        let dir = tempfile::tempdir().unwrap();
        let (ck, metrics, nvme) = (dir.path().join("ck"), dir.path().join("m.jsonl"), dir.path().join("nvme"));
        // The optimizer state on NVMe, in one directory both runs use: the resume finds the first
        // run's files, of another world size's shard sizes, and sizes them anew.
        let base = |steps: &str| {
            strings(&[
                "train",
                "--device",
                "cpu",
                "--batch-size",
                "4",
                "--seq-len",
                "16",
                "--lr",
                "1e-3",
                "--lr-schedule",
                "constant",
                "--warmup-steps",
                "0",
                "--beta2",
                "0.95",
                "--weight-decay",
                "0.1",
                "--grad-clip",
                "0.5",
                "--sample-tokens",
                "0",
                "--data",
                g.join("tokens.bin").to_str().unwrap(),
                "--steps",
                steps,
                "--checkpoint-dir",
                ck.to_str().unwrap(),
                "--metrics",
                metrics.to_str().unwrap(),
                "--offload-optimizer",
                "nvme",
                "--nvme-dir",
                nvme.to_str().unwrap(),
            ])
        };
        let mut a = base(if after.0.is_empty() { "8" } else { "4" });
        a.extend(strings(&[
            "--model",
            g.join("model").to_str().unwrap(),
            "--world-size",
            before.0,
            "--grad-accum",
            before.1,
            "--zero-stage",
            before.2,
        ]));
        let out = zerostream(&a);
        assert!(out.status.success(), "{}", stderr(&out));
        if before.2 == "0" {
            // Every rank holds and updates the whole, the same bits (the save checks): rank 0's file
            // holds the state once, and rank 1's only its residuals (none without --grad-compression).
            let step = ck.join("step-00000004");
            let read = |r: usize| std::fs::read(step.join(format!("optimizer.rank{r}.safetensors"))).unwrap();
            let (zero, one) = (read(0), read(1));
            let (zero, one) = (safetensors::SafeTensors::deserialize(&zero).unwrap(), safetensors::SafeTensors::deserialize(&one).unwrap());
            assert!(zero.names().iter().any(|n| n.ends_with(".master")) && zero.names().iter().any(|n| n.ends_with(".adam_v")));
            assert!(one.names().is_empty(), "stage 0: rank 1 wrote {:?}; expected no state (rank 0 holds it)", one.names());
        }
        if after.0.is_empty() {
            uninterrupted = Some(trajectory(&metrics));
            continue;
        }
        let mut b = base("8");
        b.extend(strings(&["--resume", ck.to_str().unwrap(), "--world-size", after.0, "--zero-stage", after.1]));
        let out = zerostream(&b);
        assert!(out.status.success(), "{}", stderr(&out));
        let rows = trajectory(&metrics);
        assert_eq!(rows.len(), 8);
        let what = format!("world {} stage {} -> {} stage {}", before.0, before.2, after.0, after.1);
        assert_eq!(
            Some(&rows),
            uninterrupted.as_ref(),
            "{what}: (step, loss bits, norm bits) differ from the uninterrupted one-rank run's"
        );
        for (s, &(step, loss, norm)) in rows.iter().enumerate() {
            assert_eq!(step, s as u64);
            let (loss, norm) = (f64::from_bits(loss), f64::from_bits(norm));
            let le = (loss - want_loss[s]).abs() / want_loss[s].abs();
            let ne = (norm - want_norm[s]).abs() / want_norm[s].abs();
            assert!(
                le < 1e-5 && ne < 1e-4,
                "world {} stage {} -> {} stage {}: step {s}: loss {loss} vs {} ({le:.2e}), norm {norm} vs {} ({ne:.2e})",
                before.0,
                before.2,
                after.0,
                after.1,
                want_loss[s],
                want_norm[s]
            );
        }
        eprintln!("{what}: 8 steps equal to the uninterrupted run's bits, within the golden tolerances");
    }
}

/// `eval` streams the model block by block; its loss is the golden's first-step loss (the same model,
/// micro-batch 0) on both devices.
#[test]
fn streamed_eval_gives_the_golden_loss() {
    let golden = common::trajectory::Golden::load("gpt2-tiny");
    let g = common::trajectory::golden_dir("gpt2-tiny");
    let want = golden.f64("trajectory.loss")[0];
    let mut devices = vec!["cpu"];
    if common::gpu_or_skip("streamed_eval_gives_the_golden_loss (gpu)").is_some() {
        devices.push("gpu");
    }
    for device in devices {
        let out = zerostream(&strings(&[
            "eval",
            "--device",
            device,
            "--model",
            g.join("model").to_str().unwrap(),
            "--data",
            g.join("tokens.bin").to_str().unwrap(),
            "--batch-size",
            "4",
            "--seq-len",
            "16",
        ]));
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let loss = v["loss"].as_f64().unwrap();
        assert!((loss - want).abs() / want < 1e-5, "{device}: eval loss {loss}, golden {want}");
    }
}
