//! What the `zerostream` binary refuses around checkpoints, by name and before any work: a corrupt
//! checkpoint (the previous one still resumes), flags that would change a resumed run's meaning, and
//! `--save` targets that are not free to write; and what a resume keeps (the data, the outputs).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::cli::{demo_args, one_step_train, stderr, strings, zerostream};

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
    // The state file, which the manifest inside it cannot cover: its step held to the directory's name.
    let state_text = std::fs::read_to_string(last.join("trainer_state.json")).unwrap();
    let mut state: serde_json::Value = serde_json::from_str(&state_text).unwrap();
    state["step"] = 2.into();
    std::fs::write(last.join("trainer_state.json"), state.to_string()).unwrap();
    let out = resume(&last);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("records step 2, but its directory is step 3's"), "{err}");
    state["step"] = 3.into();
    state["next_micro_batch"] = 5.into();
    std::fs::write(last.join("trainer_state.json"), state.to_string()).unwrap();
    let out = resume(&last);
    assert!(!out.status.success() && stderr(&out).contains("records next micro-batch 5"), "{}", stderr(&out));
    std::fs::write(last.join("trainer_state.json"), "{ not json").unwrap();
    let out = resume(&last);
    assert!(!out.status.success() && stderr(&out).contains("trainer_state.json"), "{}", stderr(&out));
    let out = resume(&prev);
    assert!(out.status.success(), "the previous checkpoint resumes: {}", stderr(&out));
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
        (&["--dropout", "0.2"][..], "--dropout 0.2 differs from the checkpoint's (none: the model config's own rates)"),
        (&["--matmul-inputs", "f16"][..], "--matmul-inputs f16 differs from the checkpoint's f32"),
        (&["--adam-state", "bf16"][..], "--adam-state bf16 differs from the checkpoint's fp32"),
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

/// Each checkpoint's name and state file, as a directory holds them.
fn checkpoints_in(ck: &Path) -> Vec<(String, String)> {
    zerostream_checkpoints::checkpoint::list_checkpoints(ck)
        .unwrap()
        .into_iter()
        .map(|(_, d)| {
            (d.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(d.join("trainer_state.json")).unwrap())
        })
        .collect()
}

#[test]
fn a_checkpoint_dir_of_another_run_is_refused_and_a_resume_from_an_older_step_warns() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let out = zerostream(&demo_args(&ck, 3));
    assert!(out.status.success(), "{}", stderr(&out));
    let before = checkpoints_in(&ck);
    assert_eq!(before.len(), 2, "--keep-checkpoints 2");
    // The same command again, without --resume: it would replace and prune the first run's checkpoints.
    let metrics = dir.path().join("m.jsonl");
    let again = zerostream(&[demo_args(&ck, 3), strings(&["--metrics", metrics.to_str().unwrap()])].concat());
    let said = stderr(&again);
    assert!(!again.status.success(), "{said}");
    assert!(!dir.path().join("m.config.toml").exists() && !said.contains("placement:"), "refused before any work: {said}");
    assert!(said.contains("already holds checkpoints (step-00000002 to step-00000003)") && said.contains("--resume"), "{said}");
    assert_eq!(checkpoints_in(&ck), before, "nothing replaced or removed");
    // Resumed from the older of the two, the run says it replaces the later one when it saves that step.
    let mut args = demo_args(&ck, 3);
    args.extend(strings(&["--resume", ck.join("step-00000002").to_str().unwrap()]));
    let out = zerostream(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("also holds the checkpoint of step 3, later than the step resumed from"), "{}", stderr(&out));
    // The root stands for its latest checkpoint's model where a model directory is asked for.
    let ck = ck.to_str().unwrap();
    let out = zerostream(&["generate", "--device", "cpu", "--model", ck, "--prompt-tokens", "1", "--max-new-tokens", "2", "--json"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\"new_tokens\":2"), "{}", stderr(&out));
}

#[test]
fn save_targets_are_checked_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let busy = dir.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let run = |save: &Path| zerostream(&one_step_train(&["--save", save.to_str().unwrap()]));
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

/// A temporary folder with a run's folder `run/` in it holding the golden tokens as `d.bin`, and the
/// golden model's path.
fn run_folder() -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny");
    std::fs::copy(format!("{golden}/tokens.bin"), run.join("d.bin")).unwrap();
    (dir, run, format!("{golden}/model"))
}

/// A checkpoint records its data from the root, so a resume from another folder trains on the same
/// file; a recorded data file that is gone is named with the checkpoint, before any work.
#[test]
fn a_resume_from_another_folder_finds_the_data_and_a_missing_one_is_named() {
    let (dir, run, model) = run_folder();
    let bin = env!("CARGO_BIN_EXE_zerostream");
    let shape = ["--device", "cpu", "--batch-size", "1", "--seq-len", "8", "--sample-tokens", "0"];
    let first = ["train", "--model", &model, "--data", "d.bin", "--steps", "1", "--checkpoint-dir", "ck"];
    let out = Command::new(bin).args([&first[..], &shape].concat()).current_dir(&run).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let state_path = run.join("ck/step-00000001/trainer_state.json");
    let mut state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    let recorded = std::path::absolute(run.join("d.bin")).unwrap();
    assert_eq!(state["settings"]["data"].as_str(), recorded.to_str(), "{}", state["settings"]);
    assert_eq!(state["data"].as_str(), recorded.to_str());
    // From the folder above, where no d.bin lies.
    let resume = ["train", "--resume", "run/ck", "--steps", "2"];
    let out = Command::new(bin).args([&resume[..], &shape].concat()).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success() && stderr(&out).contains(recorded.to_str().unwrap()), "{}", stderr(&out));
    // An older checkpoint's path as typed, not found from here: named with the checkpoint.
    state["settings"]["data"] = "d.bin".into();
    std::fs::write(&state_path, state.to_string()).unwrap();
    let older = ["train", "--resume", "run/ck/step-00000001", "--steps", "2"];
    let out = Command::new(bin).args([&older[..], &shape].concat()).current_dir(dir.path()).output().unwrap();
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("the checkpoint run/ck/step-00000001 was trained on d.bin") && err.contains("give --data"),
        "{err}"
    );
    assert!(!err.contains("placement:"), "refused before any work: {err}");
    // `plan`, which reads no data, goes on without it.
    let out = Command::new(bin).args(["plan", "--resume", "run/ck/step-00000001"]).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A resume given no output flags goes on writing where the run did, from any folder: checkpoints
/// in the directory the checkpoint lies in at the run's cadence and count, validation, and the
/// metrics appended; a flag given wins.
#[test]
fn a_resume_keeps_the_runs_outputs_unless_told_otherwise() {
    let (dir, run, model) = run_folder();
    let bin = env!("CARGO_BIN_EXE_zerostream");
    let shape = ["--device", "cpu", "--batch-size", "1", "--seq-len", "8", "--sample-tokens", "0"];
    let outputs = ["--checkpoint-dir", "ck", "--checkpoint-every", "1", "--keep-checkpoints", "2", "--metrics", "m.jsonl"];
    let first =
        [&["train", "--model", &model, "--data", "d.bin", "--val-data", "d.bin", "--eval-every", "1", "--steps", "2"][..], &outputs]
            .concat();
    let out = Command::new(bin).args([&first[..], &shape].concat()).current_dir(&run).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // From the folder above, with no output flag.
    let resume = ["train", "--resume", "run/ck", "--steps", "4"];
    let out = Command::new(bin).args([&resume[..], &shape].concat()).current_dir(dir.path()).output().unwrap();
    let err = stderr(&out);
    let root = run.join("ck").canonicalize().unwrap();
    assert!(
        out.status.success() && err.contains(&format!("note: resumed with the run's own --checkpoint-dir {}", root.display())),
        "{err}"
    );
    assert_eq!(checkpoints_in(&run.join("ck")).iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["step-00000003", "step-00000004"]);
    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(run.join("m.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let steps: Vec<u64> = rows.iter().filter(|r| r["final_validation"] != true).map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [0, 1, 2, 3], "appended to the run's own metrics");
    assert!(rows.iter().filter(|r| r["final_validation"] != true).all(|r| r["val_loss"].is_number()), "validated every step: {rows:?}");
    assert!(!dir.path().join("m.jsonl").exists() && !dir.path().join("ck").exists(), "nothing written in the folder resumed from");
    // A flag given wins: no checkpoint between here and the end.
    let more = ["train", "--resume", "run/ck", "--steps", "6", "--checkpoint-every", "0"];
    let out = Command::new(bin).args([&more[..], &shape].concat()).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(checkpoints_in(&run.join("ck")).iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["step-00000004", "step-00000006"]);
    // The run's resolved configuration beside its metrics is the run's still (a resume's would not repeat it).
    let resolved = std::fs::read_to_string(run.join("m.config.toml")).unwrap();
    assert!(resolved.contains("checkpoint-every = 1") && !resolved.contains("resume ="), "{resolved}");
    // A branch from an older checkpoint writes none of the run's files: its metrics stay as they are.
    let metrics_before = std::fs::read_to_string(run.join("m.jsonl")).unwrap();
    let branch = ["train", "--resume", "run/ck/step-00000004", "--steps", "5"];
    let out = Command::new(bin).args([&branch[..], &shape].concat()).current_dir(dir.path()).output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success() && err.contains("so this run branches from it") && err.contains("--metrics"), "{err}");
    assert!(err.contains("this resumed run writes no checkpoints"), "{err}");
    assert_eq!(std::fs::read_to_string(run.join("m.jsonl")).unwrap(), metrics_before);
    assert_eq!(checkpoints_in(&run.join("ck")).len(), 2);
}

/// A resume goes on writing the run's `--save` and `--tensorboard` too; one refused after reading
/// its checkpoint (here for a flag its run cannot use) has said nothing of what it took and made no
/// output.
#[test]
fn a_resume_keeps_save_and_tensorboard_and_a_refused_one_says_and_makes_nothing() {
    let (dir, run, model) = run_folder();
    let bin = env!("CARGO_BIN_EXE_zerostream");
    let shape = ["--device", "cpu", "--batch-size", "1", "--seq-len", "8", "--sample-tokens", "0"];
    let first = ["train", "--model", &model, "--data", "d.bin", "--steps", "2", "--checkpoint-dir", "ck", "--save", "final"];
    let out = Command::new(bin).args([&first[..], &["--tensorboard", "tb"], &shape].concat()).current_dir(&run).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let weights = |p: &Path| std::fs::read(p.join("model.safetensors")).unwrap();
    let events_bytes = |p: &Path| std::fs::read_dir(p).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum::<u64>();
    let (saved_before, events_before) = (weights(&run.join("final")), events_bytes(&run.join("tb")));
    // Refused for --params-ram-cache (parameters are not on NVMe): no note, no new directory.
    let refused = ["train", "--resume", "run/ck", "--steps", "4", "--params-ram-cache", "1GiB", "--tensorboard", "tb2"];
    let out = Command::new(bin).args([&refused[..], &shape].concat()).current_dir(dir.path()).output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--params-ram-cache"), "{err}");
    assert!(!err.contains("resumed with"), "a refused run says nothing of what it took: {err}");
    assert!(!dir.path().join("tb2").exists() && !run.join("tb2").exists(), "a refused run makes no output");
    // From the folder above, with no output flag: the run's --save is replaced, its TensorBoard grows.
    let resume = ["train", "--resume", "run/ck", "--steps", "4"];
    let out = Command::new(bin).args([&resume[..], &shape].concat()).current_dir(dir.path()).output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success() && err.contains("--save ") && err.contains("--tensorboard "), "{err}");
    assert_ne!(weights(&run.join("final")), saved_before, "the run's --save holds the resumed run's model");
    assert!(events_bytes(&run.join("tb")) > events_before, "the run's TensorBoard directory has the resumed steps");
    assert!(!dir.path().join("final").exists() && !dir.path().join("tb").exists(), "nothing written in the folder resumed from");
}

/// `--metrics` naming a file of anything but metrics rows is refused before any work (a run would
/// replace it), and so are another run's rows on a resume (it would trim and continue them); the
/// run's own rows resume.
#[test]
fn metrics_of_another_kind_or_another_run_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, metrics) = (dir.path().join("ck"), dir.path().join("m.jsonl"));
    let m = metrics.to_str().unwrap();
    let out = zerostream(&[demo_args(&ck, 2), strings(&["--metrics", m])].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ck.join("step-00000002/trainer_state.json")).unwrap()).unwrap();
    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(state["last_loss"], rows[1]["loss"], "the checkpoint records step 1's loss as its row holds it");
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "the run's notes\n").unwrap();
    let out = zerostream(&one_step_train(&["--metrics", text.to_str().unwrap()]));
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("line 1 is not a metrics row") && !err.contains("placement:"), "{err}");
    assert_eq!(std::fs::read_to_string(&text).unwrap(), "the run's notes\n");
    // Another run's rows: step 1's loss is not the checkpoint's.
    let other = dir.path().join("other.jsonl");
    let mut changed = rows.clone();
    changed[1]["loss"] = (rows[1]["loss"].as_f64().unwrap() + 0.5).into();
    let other_text: String = changed.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&other, &other_text).unwrap();
    let resume = |metrics: &Path| {
        let ck = ck.to_str().unwrap();
        zerostream(&[demo_args(Path::new(ck), 3), strings(&["--resume", ck, "--metrics", metrics.to_str().unwrap()])].concat())
    };
    let out = resume(&other);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("the rows are another run's") && err.contains("row of step 1"), "{err}");
    assert_eq!(std::fs::read_to_string(&other).unwrap(), other_text, "left as it was");
    // The run's own rows, with a half-written last line a stop could leave: resumed.
    std::fs::write(&metrics, format!("{}{{\"step\": 2, \"lo", std::fs::read_to_string(&metrics).unwrap())).unwrap();
    let out = resume(&metrics);
    assert!(out.status.success(), "{}", stderr(&out));
    let steps: Vec<u64> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps[..3], [0, 1, 2], "{steps:?}");
    // Rows, but none of the checkpoint's last step: said, not refused (a crash can lose that row).
    let gap = dir.path().join("gap.jsonl");
    std::fs::write(&gap, format!("{}\n", rows[0])).unwrap();
    let from = ck.join("step-00000002");
    let args = [demo_args(&ck, 3), strings(&["--resume", from.to_str().unwrap(), "--metrics", gap.to_str().unwrap()])].concat();
    let out = zerostream(&args);
    assert!(out.status.success() && stderr(&out).contains("holds 1 row but none of step 1"), "{}", stderr(&out));
}
