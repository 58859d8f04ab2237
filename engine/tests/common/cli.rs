//! Running the `zerostream` binary from a test and reading what it wrote: its stderr, the metrics
//! file's trajectory, and checkpoints compared byte for byte; plus the small built-in run the
//! checkpoint tests kill, corrupt and resume.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

/// Runs the binary with `args` (string slices or owned strings) and waits for it.
pub fn zerostream<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zerostream")).args(args).output().expect("running zerostream")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

pub fn path(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// `train` of one step of the built-in run on the cpu device at its smallest shape (B=1, T=8, no
/// sample), then `extra`: the quickest whole run, for tests of what a run says or writes.
pub fn one_step_train(extra: &[&str]) -> Vec<String> {
    let base = ["train", "--device", "cpu", "--steps", "1", "--batch-size", "1", "--seq-len", "8", "--sample-tokens", "0"];
    strings(&[&base[..], extra].concat())
}

/// (step, loss bits, grad norm bits) of each metrics row.
pub fn trajectory(metrics: &Path) -> Vec<(u64, u64, u64)> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        // The validation after the last step has a row of its own, with no step trained.
        .filter(|v| v["final_validation"] != true)
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap().to_bits(), v["grad_norm"].as_f64().unwrap().to_bits()))
        .collect()
}

/// Asserts two checkpoints hold the same model, optimizer state and counters, byte for byte.
pub fn assert_same_checkpoint(a: &Path, b: &Path, label: &str) {
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

/// The built-in demo run on the cpu device for `steps` steps, checkpointing into `ck` after every step
/// (the newest two kept).
pub fn demo_args(ck: &Path, steps: u64) -> Vec<String> {
    demo_args_every(ck, steps, 1)
}

/// The same, checkpointing every `every` steps (0: only at the end or when stopped).
pub fn demo_args_every(ck: &Path, steps: u64, every: u64) -> Vec<String> {
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
