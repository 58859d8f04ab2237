//! `plan --measure` end to end on the built-in model: it times the links, prints the predicted steady
//! step and keeps the rates; `train` with the same flags finds them, says the same prediction and
//! records it in every metrics row; with other flags (or no rates) it says none was made.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::cli::{path, stderr};

/// The binary with its tuning directory (where the rates are kept) at `tune`.
fn zerostream_with(tune: &Path, args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zerostream")).env("ZEROSTREAM_TUNE_DIR", tune).args(args).output().expect("running zerostream")
}

/// The seconds after "predicted steady step: " in `text`.
fn predicted_s(text: &str) -> f64 {
    let at = text.find("predicted steady step: ").unwrap_or_else(|| panic!("no prediction in:\n{text}")) + "predicted steady step: ".len();
    text[at..].split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn plan_measure_predicts_the_step_and_train_records_the_prediction() {
    let dir = tempfile::tempdir().unwrap();
    let (tune, nvme, metrics) = (dir.path().join("tune"), dir.path().join("nvme"), dir.path().join("m.jsonl"));
    let run: Vec<String> =
        ["--device", "cpu", "--batch-size", "2", "--seq-len", "32", "--offload-optimizer", "nvme", "--nvme-dir", &path(&nvme)]
            .iter()
            .map(|s| s.to_string())
            .collect();

    let plan = zerostream_with(&tune, &[vec!["plan".into(), "--measure".into()], run.clone()].concat());
    assert!(plan.status.success(), "{}", stderr(&plan));
    let said = String::from_utf8_lossy(&plan.stdout).into_owned();
    let predicted = predicted_s(&said);
    assert!(predicted > 0.0 && predicted.is_finite(), "{said}");
    assert!(said.contains("GB/s read+write") && said.contains("a block") && said.contains("Gparam/s"), "every link timed:\n{said}");
    assert!(said.contains("the rates are kept in"), "{said}");
    assert!(!nvme.join(".zerostream-measure").exists(), "the drive's rehearsal files are removed");

    let train = |tune: &Path| {
        let args = [vec!["train".into(), "--steps".into(), "3".into(), "--sample-tokens".into(), "0".into()], run.clone()].concat();
        let out = zerostream_with(tune, &[args, vec!["--metrics".into(), path(&metrics)]].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        // The steps' rows: the built-in run's validation after its last step has a row of its own.
        let rows: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|row| row["final_validation"] != true)
            .collect();
        (stderr(&out), rows)
    };
    let (said, rows) = train(&tune);
    assert_eq!(predicted_s(&said), predicted, "train says plan's prediction:\n{said}");
    assert_eq!(rows.len(), 3);
    for row in &rows {
        let p = row["predicted_step_s"].as_f64().unwrap_or_else(|| panic!("no predicted_step_s in {row}"));
        assert!((p - predicted).abs() <= 5e-4, "metrics {p} against the printed {predicted} (3 decimals)");
        assert!(row["time"]["total_s"].as_f64().unwrap() > 0.0);
    }

    // No rates for these flags: said so, and no prediction recorded.
    let (said, rows) = train(&dir.path().join("elsewhere"));
    assert!(said.contains("no step-time prediction") && said.contains("plan --measure"), "{said}");
    assert!(rows.iter().all(|r| r.get("predicted_step_s").is_none()), "{rows:?}");
}

#[test]
fn measure_is_plans_flag_and_a_missing_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = zerostream_with(dir.path(), &["train".into(), "--device".into(), "cpu".into(), "--measure".into()]);
    assert!(!out.status.success() && stderr(&out).contains("--measure is plan's"), "{}", stderr(&out));
    let out =
        zerostream_with(dir.path(), &["plan".into(), "--device".into(), "cpu".into(), "--measure".into(), "/proc/nonexistent/dir".into()]);
    assert!(!out.status.success() && stderr(&out).contains("/proc/nonexistent/dir: no such directory"), "{}", stderr(&out));
    // A path that does not exist is not created (`-1` read as a directory made one where the command ran).
    let missing = dir.path().join("typo");
    let out =
        zerostream_with(dir.path(), &["plan".into(), "--device".into(), "cpu".into(), "--measure".into(), missing.display().to_string()]);
    assert!(!out.status.success() && !missing.exists(), "{}", stderr(&out));
}

/// The drive's rehearsal sweeps the run's own state: LARS's one moment (and its two passes), LAMB's two,
/// each read and written, and its files removed afterwards.
#[test]
fn the_drive_rehearsal_sweeps_each_optimizers_state() {
    let dir = tempfile::tempdir().unwrap();
    for optimizer in ["lars", "lamb"] {
        let nvme = dir.path().join(optimizer);
        let args: Vec<String> = ["plan", "--measure", "--device", "cpu", "--batch-size", "2", "--seq-len", "32"]
            .into_iter()
            .chain(["--optimizer", optimizer, "--offload-optimizer", "nvme", "--nvme-dir", &path(&nvme)])
            .map(String::from)
            .collect();
        let plan = zerostream_with(&dir.path().join("tune"), &args);
        assert!(plan.status.success(), "{optimizer}: {}", stderr(&plan));
        let said = String::from_utf8_lossy(&plan.stdout).into_owned();
        assert!(predicted_s(&said) > 0.0 && said.contains("GB/s read+write"), "{optimizer}:\n{said}");
        assert!(!nvme.join(".zerostream-measure").exists(), "{optimizer}: the rehearsal files are removed");
    }
}
