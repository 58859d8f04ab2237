//! Checkpoints end to end through the `zerostream` binary: resuming equals not stopping (bit for bit),
//! resuming at another world size stays on the golden trajectory, SIGKILL at random instants (saves
//! included) loses nothing, corrupt checkpoints are refused by name, SIGINT stops cleanly, and flags
//! that would change a resumed run's meaning are refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

fn zerostream(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zerostream")).args(args).output().expect("running zerostream")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn path(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// (step, loss bits, grad norm bits) of each metrics row.
fn trajectory(metrics: &Path) -> Vec<(u64, u64, u64)> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap().to_bits(), v["grad_norm"].as_f64().unwrap().to_bits())
        })
        .collect()
}

/// Asserts two checkpoints hold the same model, optimizer state and counters, byte for byte.
fn assert_same_checkpoint(a: &Path, b: &Path, label: &str) {
    let ranks =
        std::fs::read_dir(a).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| n.starts_with("optimizer.rank"));
    let mut names: Vec<String> = ["model.safetensors", "config.json"].iter().map(|s| s.to_string()).chain(ranks).collect();
    names.sort();
    assert!(names.iter().any(|n| n == "optimizer.rank0.safetensors"), "[{label}] {names:?}");
    for name in &names {
        let (x, y) = (std::fs::read(a.join(name)).unwrap(), std::fs::read(b.join(name)).unwrap());
        assert!(x == y, "[{label}] {name} differs between {} and {}", a.display(), b.display());
    }
    let state =
        |d: &Path| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(d.join("trainer_state.json")).unwrap()).unwrap() };
    let (sa, sb) = (state(a), state(b));
    for key in ["step", "adam_steps", "next_lr", "loss_scaler", "next_micro_batch"] {
        assert_eq!(sa[key], sb[key], "[{label}] trainer_state {key}");
    }
}

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
    // A resumed run draws the masks the uninterrupted one would have, recomputed activations too.
    check_resume_equality("cpu dropout recompute", &["--device", "cpu", "--dropout", "0.1", "--recompute"]);
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
/// world sizes: the resumed trajectory stays within the golden tolerances.
#[test]
fn a_checkpoint_resumes_at_another_world_size_on_the_golden_trajectory() {
    let golden = common::trajectory::Golden::load("gpt2-tiny-accum");
    let g = common::trajectory::golden_dir("gpt2-tiny-accum");
    let (want_loss, want_norm) = (golden.f64("trajectory.loss"), golden.f64("trajectory.grad_norm"));
    for (before, after) in [(("2", "1", "3"), ("1", "2")), (("1", "2", "2"), ("2", "1"))] {
        let dir = tempfile::tempdir().unwrap();
        let (ck, metrics) = (dir.path().join("ck"), dir.path().join("m.jsonl"));
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
            ])
        };
        let mut a = base("4");
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
        let mut b = base("8");
        b.extend(strings(&["--resume", ck.to_str().unwrap(), "--world-size", after.0, "--zero-stage", "3"]));
        let out = zerostream(&b);
        assert!(out.status.success(), "{}", stderr(&out));
        let rows = trajectory(&metrics);
        assert_eq!(rows.len(), 8);
        for (s, &(step, loss, norm)) in rows.iter().enumerate() {
            assert_eq!(step, s as u64);
            let (loss, norm) = (f64::from_bits(loss), f64::from_bits(norm));
            let le = (loss - want_loss[s]).abs() / want_loss[s].abs();
            let ne = (norm - want_norm[s]).abs() / want_norm[s].abs();
            assert!(
                le < 1e-5 && ne < 1e-4,
                "world {} -> {}: step {s}: loss {loss} vs {} ({le:.2e}), norm {norm} vs {} ({ne:.2e})",
                before.0,
                after.0,
                want_loss[s],
                want_norm[s]
            );
        }
        eprintln!("world {} (stage {}) -> world {}: 8 steps within the golden tolerances", before.0, before.2, after.0);
    }
}

fn demo_args(ck: &Path, steps: u64) -> Vec<String> {
    demo_args_every(ck, steps, 1)
}

fn demo_args_every(ck: &Path, steps: u64, every: u64) -> Vec<String> {
    strings(&[
        "train",
        "--device",
        "cpu",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--steps",
        &steps.to_string(),
        "--warmup-steps",
        "3",
        "--sample-tokens",
        "0",
        "--checkpoint-every",
        &every.to_string(),
        "--keep-checkpoints",
        "2",
        "--checkpoint-dir",
        ck.to_str().unwrap(),
    ])
}

/// SIGKILL at seeded random instants — during steps and during saves — then resume, dozens of times:
/// the run ends bit-identical to one never interrupted.
#[test]
fn sigkill_at_random_instants_loses_nothing() {
    sigkill_and_resume(30, |_| Vec::new());
}

/// The same with the optimizer state and the working copy on NVMe through the portable threads engine.
#[test]
fn sigkill_at_random_instants_loses_nothing_with_the_state_on_nvme_through_the_threads_engine() {
    sigkill_and_resume(30, |ck| {
        let nvme = format!("{}.nvme", ck.display());
        strings(&["--offload-optimizer", "nvme", "--offload-params", "nvme", "--io-engine", "threads", "--nvme-dir", &nvme])
    });
}

/// `kills_wanted` SIGKILLs of the demo run checkpointing into `ck` (with the flags `extra(ck)`) and
/// resumes, against one uninterrupted run.
fn sigkill_and_resume(kills_wanted: usize, extra: impl Fn(&Path) -> Vec<String>) {
    const STEPS: u64 = 16;
    let demo_args = |ck: &Path, steps: u64| {
        let mut args = demo_args(ck, steps);
        args.extend(extra(ck));
        args
    };
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("reference");
    let t0 = Instant::now();
    let out = zerostream(&demo_args(&reference, STEPS));
    assert!(out.status.success(), "{}", stderr(&out));
    let run_ms = t0.elapsed().as_millis() as u64;
    let ck = dir.path().join("killed");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(20261123);
    let last = format!("step-{STEPS:08}");
    let (mut kills, mut in_save, mut attempts, mut finished) = (0, 0, 0, 0);
    while kills < kills_wanted {
        attempts += 1;
        assert!(attempts < 400, "too many attempts");
        // Killed after its last checkpoint was committed: the run is complete.
        if std::fs::read_to_string(ck.join("latest")).is_ok_and(|l| l.trim() == last) {
            assert_same_checkpoint(&reference.join(&last), &ck.join(&last), "killed after its last checkpoint");
            finished += 1;
            std::fs::remove_dir_all(&ck).unwrap();
        }
        let mut args = demo_args(&ck, STEPS);
        if ck.join("latest").exists() {
            args.extend(strings(&["--resume", ck.to_str().unwrap()]));
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_zerostream"))
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Within the first third of a whole run's time: a resumed run has less left to do.
        std::thread::sleep(Duration::from_millis(rng.random_range(0..(run_ms / 3).max(20))));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            kills += 1;
            let partial =
                std::fs::read_dir(&ck).into_iter().flatten().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".partial"));
            in_save += usize::from(partial);
            continue;
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "attempt {attempts} after {kills} kills: {}", stderr(&out));
        // This run reached the end between kills: it must equal the uninterrupted one; then start over.
        assert_same_checkpoint(&reference.join(&last), &ck.join(&last), "killed and resumed");
        finished += 1;
        std::fs::remove_dir_all(&ck).unwrap();
    }
    // The last run, resumed from wherever the last kill left it, to the end.
    if std::fs::read_to_string(ck.join("latest")).map_or(true, |l| l.trim() != last) {
        let mut args = demo_args(&ck, STEPS);
        if ck.join("latest").exists() {
            args.extend(strings(&["--resume", ck.to_str().unwrap()]));
        }
        let out = zerostream(&args);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    assert_same_checkpoint(&reference.join(&last), &ck.join(&last), "killed and resumed");
    finished += 1;
    eprintln!(
        "{kills} SIGKILLs ({in_save} during a save) over {attempts} runs; {finished} killed-and-resumed runs reached step {STEPS}, each bit-identical to the uninterrupted run"
    );
    assert!(in_save > 0, "no kill landed in a save: the test did not test saves");
}

#[test]
fn corrupt_checkpoints_are_refused_by_name_and_the_previous_one_still_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let out = zerostream(&demo_args(&ck, 3));
    assert!(out.status.success(), "{}", stderr(&out));
    let (prev, last) = (ck.join("step-00000002"), ck.join("step-00000003"));
    let resume = |from: &Path| {
        let mut a = demo_args(&dir.path().join("other"), 4);
        a.extend(strings(&["--resume", from.to_str().unwrap()]));
        zerostream(&a)
    };
    // (file, how it is damaged, what the refusal says)
    type Damage = (&'static str, fn(&Path), &'static str);
    let damage: [Damage; 3] = [
        (
            "model.safetensors",
            |p| {
                let b = std::fs::read(p).unwrap();
                std::fs::write(p, &b[..b.len() / 2]).unwrap()
            },
            "truncated",
        ),
        (
            "optimizer.rank0.safetensors",
            |p| {
                let mut b = std::fs::read(p).unwrap();
                let i = b.len() - 100;
                b[i] ^= 0x10;
                std::fs::write(p, b).unwrap()
            },
            "corrupt",
        ),
        ("config.json", |p| std::fs::remove_file(p).unwrap(), "missing"),
    ];
    for (file, hurt, says) in damage {
        let copy = dir.path().join("copy");
        let _ = std::fs::remove_dir_all(&copy);
        std::fs::create_dir(&copy).unwrap();
        for e in std::fs::read_dir(&last).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
        }
        hurt(&copy.join(file));
        let out = resume(&copy);
        let err = stderr(&out);
        assert!(!out.status.success() && err.contains(file) && err.contains(says), "{file}: {err}");
    }
    std::fs::write(last.join("trainer_state.json"), "{ not json").unwrap();
    let out = resume(&last);
    assert!(!out.status.success() && stderr(&out).contains("trainer_state.json"), "{}", stderr(&out));
    let out = resume(&prev);
    assert!(out.status.success(), "the previous checkpoint resumes: {}", stderr(&out));
}

#[test]
fn sigint_finishes_the_step_checkpoints_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let metrics = dir.path().join("m.jsonl");
    let mut args = demo_args_every(&ck, 100_000, 0);
    args.extend(strings(&["--metrics", metrics.to_str().unwrap()]));
    let child = Command::new(env!("CARGO_BIN_EXE_zerostream")).args(&args).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&metrics).map_or(0, |t| t.lines().count()) < 2 {
        assert!(Instant::now() < deadline, "no steps within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("stopped by a signal") && err.contains("--resume"), "{err}");
    let latest = std::fs::read_to_string(ck.join("latest")).unwrap();
    let steps = std::fs::read_to_string(&metrics).unwrap().lines().count();
    assert_eq!(latest.trim(), format!("step-{steps:08}"), "the checkpoint holds every step the metrics recorded");
}

#[test]
fn flags_that_change_a_resumed_runs_meaning_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let out = zerostream(&demo_args(&ck, 2));
    assert!(out.status.success(), "{}", stderr(&out));
    let resume_to = |steps: u64, extra: &[&str]| {
        let mut a = demo_args(&dir.path().join("next"), steps);
        a.extend(strings(&["--resume", ck.to_str().unwrap()]));
        a.extend(strings(extra));
        zerostream(&a)
    };
    for (extra, says) in [
        (&["--lr", "0.1"][..], "--lr 0.1 differs from the checkpoint's 0.002"),
        (&["--precision", "bf16"][..], "--precision bf16 differs from the checkpoint's fp32"),
        (&["--weight-decay", "0"][..], "--weight-decay 0.0 differs from the checkpoint's 0.1"),
        (&["--lr-schedule", "constant"][..], "--lr-schedule constant differs from the checkpoint's cosine"),
        (&["--grad-accum", "3"][..], "micro-batches per step"),
        (&["--seed", "5"][..], "--seed 5 differs"),
        (&["--dropout", "0.2"][..], "--dropout 0.2 differs from the checkpoint's (none)"),
        (&["--matmul-inputs", "f16"][..], "--matmul-inputs f16 differs from the checkpoint's f32"),
        (&["--config", "gpt2"][..], "is not the checkpoint's model"),
    ] {
        let out = resume_to(4, extra);
        assert!(!out.status.success() && stderr(&out).contains(says), "{extra:?}: {}", stderr(&out));
    }
    let other = dir.path().join("other.bin");
    std::fs::write(&other, [7u8, 0].repeat(2000)).unwrap();
    let out = resume_to(4, &["--data", other.to_str().unwrap()]);
    assert!(!out.status.success() && stderr(&out).contains("resume on the same data"), "{}", stderr(&out));
    // A checkpoint already at --steps is a finished run: done at once, not an error (tests/cli_ux.rs).
    let out = resume_to(2, &[]);
    assert!(out.status.success() && stderr(&out).contains("nothing left to train"), "{}", stderr(&out));
    // Harmless ones may change: more steps, another cadence.
    let out = resume_to(3, &["--zero-stage", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn save_targets_are_checked_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let busy = dir.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let run = |save: &Path| {
        zerostream(&strings(&[
            "train",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--batch-size",
            "1",
            "--seq-len",
            "8",
            "--sample-tokens",
            "0",
            "--save",
            save.to_str().unwrap(),
        ]))
    };
    let out = run(&busy);
    assert!(!out.status.success() && stderr(&out).contains("notes.txt"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(busy.join("notes.txt")).unwrap(), "mine");
    let out = run(Path::new("/dev/null/model"));
    assert!(!out.status.success() && stderr(&out).contains("--save /dev/null/model"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("step "), "refused before training: {}", stderr(&out));
    // Saving twice into the same directory replaces the model, leaving no partial directory behind.
    let model = dir.path().join("model");
    for _ in 0..2 {
        let out = run(&model);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    zerostream_checkpoints::HfModel::open(&model).unwrap();
    let names: Vec<PathBuf> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(names.iter().all(|p| !p.to_string_lossy().ends_with(".partial")), "{names:?}");
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
