//! Checkpoints survive the process being stopped through the `zerostream` binary: SIGKILL at seeded
//! random instants (saves included) loses nothing, with the state in RAM or on NVMe, and SIGINT
//! finishes the step, checkpoints it and exits 130 (143 for SIGTERM).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cli::{assert_same_checkpoint, demo_args, stderr, strings, zerostream};
use rand::{Rng, SeedableRng};

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

/// Whether `ck` holds a complete checkpoint: a kill between the first checkpoint's move into place and
/// `latest` leaves one that a fresh run would be refused over.
fn holds_a_checkpoint(ck: &Path) -> bool {
    ck.is_dir() && !zerostream::checkpoints::checkpoint::list_checkpoints(ck).unwrap().is_empty()
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
        if holds_a_checkpoint(&ck) {
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
        if holds_a_checkpoint(&ck) {
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

/// SIGINT exits 130 and SIGTERM 143 (128 + the signal, as shells report them), each after its step's
/// checkpoint. (Unix: it sends them with `kill`.)
#[cfg(unix)]
#[test]
fn a_signal_finishes_the_step_checkpoints_and_exits_128_plus_it_even_when_delivered_twice() {
    for (signal, code) in [("-INT", 130), ("-TERM", 143)] {
        stop_by(signal, code);
    }
}

#[cfg(unix)]
fn stop_by(signal: &str, code: i32) {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let metrics = dir.path().join("m.jsonl");
    let mut args = common::cli::demo_args_every(&ck, 100_000, 0);
    args.extend(strings(&["--metrics", metrics.to_str().unwrap()]));
    let child = Command::new(env!("CARGO_BIN_EXE_zerostream")).args(&args).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&metrics).map_or(0, |t| t.lines().count()) < 2 {
        assert!(Instant::now() < deadline, "no steps within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Twice at once, as GNU timeout or a terminal delivers it to a process group: still one stop, with
    // its checkpoint (only a signal a second or more after the first stops at once).
    let pid = child.id().to_string();
    let sent = Command::new("kill").args([signal, &pid, &pid]).status().unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "{signal}: {err}");
    assert!(err.contains("stopped by a signal") && err.contains("--resume"), "{err}");
    let latest = std::fs::read_to_string(ck.join("latest")).unwrap();
    let steps = std::fs::read_to_string(&metrics).unwrap().lines().count();
    assert_eq!(latest.trim(), format!("step-{steps:08}"), "the checkpoint holds every step the metrics recorded");
}
