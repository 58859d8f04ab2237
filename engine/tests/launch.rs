//! The `zerostream` binary with ranks: `--world-size` in one process, and `mpirun -n 2` (with the `mpi`
//! feature) giving bit-identical losses, gradient norms and saved weights, to each other and (stages
//! 2-3) to one rank given the same micro-batches per step; and the refusals around MPI launches.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn golden(file: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/gpt2-tiny-accum").join(file).to_str().unwrap().to_string()
}

/// `train` on the gpt2-tiny-accum golden with world 2 x accum 1, writing metrics and the model into `dir`.
fn train_args(dir: &Path, stage: &str) -> Vec<String> {
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    [
        "train",
        "--model",
        &golden("model"),
        "--data",
        &golden("tokens.bin"),
        "--device",
        "cpu",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--seq-len",
        "16",
        "--lr",
        "1e-3",
        "--warmup-steps",
        "0",
        "--lr-schedule",
        "constant",
        "--grad-clip",
        "0.5",
        "--zero-stage",
        stage,
        "--sample-tokens",
        "0",
        "--metrics",
        &p("metrics.jsonl"),
        "--save",
        &p("model"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn check(out: &Output, what: &str) {
    assert!(out.status.success(), "{what} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// (loss, grad_norm) of each metrics line, as written (shortest round-trip text: equal text, equal bits).
fn trajectory(dir: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["loss"].to_string(), v["grad_norm"].to_string())
        })
        .collect()
}

#[test]
fn world_size_two_in_process_trains_and_reports_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = train_args(dir.path(), "3");
    args.extend(["--world-size".into(), "2".into()]);
    let out = Command::new(env!("CARGO_BIN_EXE_zerostream")).args(&args).output().unwrap();
    check(&out, "--world-size 2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("2 ranks, ZeRO stage 3, per rank"), "the plan is per rank:\n{stderr}");
    assert_eq!(stderr.matches("done:").count(), 1, "one summary, from rank 0:\n{stderr}");
    let steps = trajectory(dir.path());
    assert_eq!(steps.len(), 4, "one metrics line per step, from rank 0 only");
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap().lines().nth(1).unwrap()).unwrap();
    assert!(line["comm_bytes"].as_u64().unwrap() > 0 && line["comm_s"].as_f64().unwrap() >= 0.0, "{line}");
    assert!(dir.path().join("model/model.safetensors").exists());
}

#[test]
fn world_size_under_an_mpi_launch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = train_args(dir.path(), "2");
    args.extend(["--world-size".into(), "2".into()]);
    let out = Command::new(env!("CARGO_BIN_EXE_zerostream")).args(&args).env("OMPI_COMM_WORLD_SIZE", "2").output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--world-size cannot be combined with an MPI launch"), "{stderr}");
    assert!(!dir.path().join("metrics.jsonl").exists(), "nothing written");
}

#[cfg(not(feature = "mpi"))]
#[test]
fn a_build_without_mpi_says_so_under_mpirun() {
    let dir = tempfile::tempdir().unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_zerostream")).args(train_args(dir.path(), "2")).env("OMPI_COMM_WORLD_SIZE", "2").output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("built without MPI support") && stderr.contains("--features zerostream/mpi"), "{stderr}");
    assert!(!dir.path().join("metrics.config.toml").exists(), "a refused run writes no resolved configuration");
}

/// mpirun -n 2 and --world-size 2 give the same bits, at each stage.
#[cfg(feature = "mpi")]
#[test]
fn mpirun_two_processes_equal_two_in_process_ranks_bit_for_bit() {
    for stage in ["0", "1", "2", "3"] {
        check_mpi_equals_in_process(stage, &[]);
    }
}

/// With --grad-compression every rank decodes the same bytes and sums in rank order, so MPI and
/// in-process ranks stay bit-identical in every mode.
#[cfg(feature = "mpi")]
#[test]
fn mpirun_with_grad_compression_equals_in_process_bit_for_bit() {
    for mode in ["bf16", "int8", "onebit", "topk:0.05"] {
        check_mpi_equals_in_process("2", &["--grad-compression", mode]);
    }
    check_mpi_equals_in_process("3", &["--grad-compression", "onebit", "--grad-compression-chunk", "100"]);
    check_mpi_equals_in_process("2", &["--grad-compression", "onebit", "--param-compression", "int8"]);
    check_mpi_equals_in_process("0", &["--grad-compression", "onebit", "--optimizer", "lamb"]);
    check_mpi_equals_in_process("0", &["--grad-compression", "onebit", "--grad-compression-warmup", "1", "--freeze-variance"]);
    // Three ranks: stage 0's two-phase compressed all-reduce.
    check_mpi_equals_in_process_at("3", "0", &["--grad-compression", "onebit"]);
    check_mpi_equals_in_process_at("3", "0", &["--grad-compression", "onebit", "--all-reduce-phases", "1"]);
}

/// LAMB's norms are summed from the optimizer thread on a communicator of its own while the device
/// thread exchanges gradients: MPI with MPI_THREAD_MULTIPLE gives what in-process ranks give.
#[cfg(feature = "mpi")]
#[test]
fn mpirun_with_lamb_equals_in_process_bit_for_bit() {
    check_mpi_equals_in_process("2", &["--optimizer", "lamb"]);
    check_mpi_equals_in_process("3", &["--optimizer", "lars"]);
}

/// With the state on NVMe: the update's fresh working copies, `--params-ram-cache auto` (each process
/// sizes it, MPI agrees on the smallest: shown here to complete, as the size changes no result) and
/// LAMB's own communicator give what in-process ranks give.
#[cfg(feature = "mpi")]
#[test]
fn mpirun_with_the_state_on_nvme_equals_in_process_bit_for_bit() {
    // A directory each: another stage's shards have other sizes, and are refused.
    for (stage, optimizer) in [("2", "adamw"), ("3", "lamb")] {
        let nvme = tempfile::tempdir().unwrap();
        let dir = nvme.path().to_str().unwrap();
        let on_nvme = ["--offload-optimizer", "nvme", "--offload-params", "nvme", "--nvme-dir", dir, "--params-ram-cache", "auto"];
        check_mpi_equals_in_process(stage, &[&on_nvme[..], &["--optimizer", optimizer]].concat());
    }
}

/// At stages 2-3 each micro-batch's gradient is exchanged on its own and added in the order of its
/// global index, and the global norm is exact: mpirun -n 2 x accum 2 is one process x accum 4, bit for
/// bit (losses, norms, saved weights).
#[cfg(feature = "mpi")]
#[test]
fn mpirun_two_processes_equal_one_rank_with_the_same_micro_batches() {
    for stage in ["2", "3"] {
        let (one, mpi) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut args = train_args(one.path(), stage);
        args.extend(["--grad-accum".into(), "4".into()]);
        check(&Command::new(env!("CARGO_BIN_EXE_zerostream")).args(&args).output().unwrap(), "one rank x accum 4");
        train_under_mpirun("2", mpi.path(), stage, &["--grad-accum", "2"]);
        let what = format!("stage {stage}, one rank x accum 4 vs mpirun -n 2 x accum 2");
        let a = assert_same_run(one.path(), mpi.path(), &what);
        println!("stage {stage}: mpirun -n 2 x accum 2 equals one rank x accum 4 over {} steps: {a:?}", a.len());
    }
}

/// `train_args(dir, stage)` plus `extra` under `mpirun -n world`, which must succeed.
#[cfg(feature = "mpi")]
fn train_under_mpirun(world: &str, dir: &Path, stage: &str, extra: &[&str]) {
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", world, env!("CARGO_BIN_EXE_zerostream")])
        .args(train_args(dir, stage))
        .args(extra)
        .output()
        .expect("running mpirun (apt-get install openmpi-bin)");
    check(&out, &format!("mpirun -n {world} {}", extra.join(" ")));
}

/// The runs written into `a` and `b` have the same four (loss, grad norm) rows and saved weights, bit
/// for bit; returns the rows.
#[cfg(feature = "mpi")]
fn assert_same_run(a: &Path, b: &Path, what: &str) -> Vec<(String, String)> {
    let (rows, other) = (trajectory(a), trajectory(b));
    assert_eq!(rows.len(), 4);
    assert_eq!(rows, other, "{what}: losses and gradient norms");
    let weights = |d: &Path| std::fs::read(d.join("model/model.safetensors")).unwrap();
    assert!(weights(a) == weights(b), "{what}: saved weights differ");
    rows
}

#[cfg(feature = "mpi")]
fn check_mpi_equals_in_process(stage: &str, extra: &[&str]) {
    check_mpi_equals_in_process_at("2", stage, extra)
}

#[cfg(feature = "mpi")]
fn check_mpi_equals_in_process_at(world: &str, stage: &str, extra: &[&str]) {
    let (local, mpi) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let what = format!("{world} ranks, stage {stage} {}", extra.join(" "));
    let mut args = train_args(local.path(), stage);
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--world-size".into(), world.into()]);
    check(&Command::new(env!("CARGO_BIN_EXE_zerostream")).args(&args).output().unwrap(), &format!("--world-size {world}"));
    train_under_mpirun(world, mpi.path(), stage, extra);
    let a = assert_same_run(local.path(), mpi.path(), &format!("{what}: in-process vs MPI"));
    println!("{what}: mpirun -n {world} and --world-size {world} are bit-identical over {} steps: {a:?}", a.len());
}

/// Under mpirun each process reads its own command line and files: ranks given other data (here
/// the same flags but another token file) are refused, naming it, and a `--devices` list too short
/// for the node's ranks, or a rank whose model is not there, ends the job with its error rather than
/// leaving the others waiting, before any rank has made an output; `plan` prints once, not once a
/// process.
#[cfg(feature = "mpi")]
#[test]
fn mpirun_ranks_given_other_data_or_too_few_devices_are_refused_and_plan_prints_once() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.bin");
    let mut tokens = std::fs::read(golden("tokens.bin")).unwrap();
    let low_byte = tokens.len() - 2;
    tokens[low_byte] ^= 1; // the last token's low bit: the count and the header are the same
    std::fs::write(&other, &tokens).unwrap();
    let bin = env!("CARGO_BIN_EXE_zerostream");
    let mpirun = || {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe"]);
        c
    };
    let mine = train_args(dir.path(), "2");
    let mut theirs = mine.clone();
    let data = theirs.iter().position(|a| a == "--data").unwrap() + 1;
    theirs[data] = other.to_str().unwrap().to_string();
    let out = mpirun().args(["-n", "1", bin]).args(&mine).arg(":").args(["-n", "1", bin]).args(&theirs).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("were not given the same --data (the tokens read) (ranks [1])"), "{err}");
    // (The refusal above comes once the run has started: in a fresh folder.)
    let fresh = tempfile::tempdir().unwrap();
    // A rank refused before any collective (its model is not there) ends the whole job with its error,
    // the others having made nothing.
    let mine = train_args(fresh.path(), "2");
    let mut missing = mine.clone();
    let model = missing.iter().position(|a| a == "--model").unwrap() + 1;
    missing[model] = fresh.path().join("no-model").to_str().unwrap().to_string();
    let out = mpirun().args(["-n", "1", bin]).args(&mine).arg(":").args(["-n", "1", bin]).args(&missing).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("rank 1: ") && err.contains("no-model"), "{err}");
    assert!(!fresh.path().join("metrics.config.toml").exists(), "rank 0 made an output for a refused run");
    let out = mpirun().args(["-n", "2", bin]).args(train_args(fresh.path(), "2")).args(["--devices", "cpu"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--devices lists 1 device, but this node runs at least 2 ranks"), "{err}");
    assert!(!fresh.path().join("metrics.config.toml").exists(), "rank 0 wrote its resolved configuration for a refused run");
    let out = mpirun().args(["-n", "2", bin, "plan", "--config", "gpt2", "--device", "cpu"]).output().unwrap();
    check(&out, "plan under mpirun");
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(said.matches("placement").count(), 1, "{said}");
}
