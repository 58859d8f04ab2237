//! `train --tensorboard` read back by TensorBoard's own loader (tests/tensorboard/read_events.py, in a
//! venv kept under the target directory): every scalar of every step equals the --metrics row's number,
//! the configuration is there as text, a resumed run adds a file, and a bad directory is refused before
//! any work. Without python3, venv or PyPI the comparison prints SKIPPED, unless
//! ZEROSTREAM_REQUIRE_TENSORBOARD=1 (CI) makes that a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn zerostream(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zerostream")).args(args).output().expect("running zerostream")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A python with TensorBoard installed: the venv under the target directory, made (and tensorboard
/// pip-installed) on first use and reused after. Err: why there is none.
fn tensorboard_python() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tensorboard-venv");
    let python = if cfg!(windows) { venv.join("Scripts").join("python.exe") } else { venv.join("bin").join("python") };
    let imports = |python: &Path| Command::new(python).args(["-c", "import tensorboard"]).output().is_ok_and(|o| o.status.success());
    if imports(&python) {
        return Ok(python);
    }
    let system = if cfg!(windows) { "python" } else { "python3" };
    if !python.exists() {
        // A venv left half-made by an interrupted run is made again from scratch.
        let _ = std::fs::remove_dir_all(&venv);
        let made = Command::new(system).args(["-m", "venv"]).arg(&venv).output();
        match made {
            Err(e) => return Err(format!("no {system} ({e})")),
            Ok(o) if !o.status.success() => {
                return Err(format!("`{system} -m venv` failed (install python3-venv): {}", String::from_utf8_lossy(&o.stderr).trim()));
            }
            Ok(_) => {}
        }
    }
    let started = std::time::Instant::now();
    let pip = Command::new(&python).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "tensorboard"]).output();
    match pip {
        Err(e) => return Err(format!("running pip in {}: {e}", venv.display())),
        Ok(o) if !o.status.success() => {
            return Err(format!("`pip install tensorboard` failed (no PyPI?): {}", String::from_utf8_lossy(&o.stderr).trim()));
        }
        Ok(_) => eprintln!("installed tensorboard into {} in {:.0} s", venv.display(), started.elapsed().as_secs_f64()),
    }
    if imports(&python) { Ok(python) } else { Err(format!("tensorboard does not import in {}", venv.display())) }
}

/// The python, or None after printing SKIPPED (a failure when ZEROSTREAM_REQUIRE_TENSORBOARD=1).
fn python_or_skip() -> Option<PathBuf> {
    match tensorboard_python() {
        Ok(python) => Some(python),
        Err(why) if std::env::var("ZEROSTREAM_REQUIRE_TENSORBOARD").is_ok_and(|v| v == "1") => {
            panic!("ZEROSTREAM_REQUIRE_TENSORBOARD=1 but TensorBoard cannot be run: {why}")
        }
        Err(why) => {
            println!("SKIPPED: {why}");
            None
        }
    }
}

/// What TensorBoard's loader reads from `logdir` (see read_events.py).
fn read_events(python: &Path, logdir: &Path) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tensorboard/read_events.py");
    let out = Command::new(python).arg(script).arg(logdir).output().expect("running read_events.py");
    assert!(out.status.success(), "read_events.py failed: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("read_events.py prints JSON")
}

/// Every number of a metrics row but the step, by its path (`loss`, `time.total_s`).
fn numbers_of(row: &Value) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (name, value) in row.as_object().expect("a metrics row is an object") {
        match value {
            Value::Object(inner) => out.extend(inner.iter().filter_map(|(k, v)| Some((format!("{name}.{k}"), v.as_f64()?)))),
            v if name != "step" => out.extend(v.as_f64().map(|x| (name.clone(), x))),
            _ => {}
        }
    }
    out
}

/// Asserts that the scalars read back for each step are exactly the numbers of that step's metrics
/// row, as f32: nested fields under their path (`time/total_s`), top-level ones under a group
/// (`<group>/loss`). A step logged twice counts as its last event, as TensorBoard shows it.
fn assert_scalars_match(events: &Value, rows: &[Value]) {
    let mut by_step: BTreeMap<u64, BTreeMap<String, f64>> = BTreeMap::new();
    for e in events["events"].as_array().unwrap() {
        // A restart purges what earlier files hold from its step on, as TensorBoard does (the first
        // run's validation after its last step, a step the resumed run trains).
        if e["session_log"] == "START" {
            let from = e["step"].as_u64().unwrap();
            by_step.retain(|step, _| *step < from);
        }
        if let Some(scalars) = e["scalars"].as_object().filter(|s| !s.is_empty()) {
            let step = by_step.entry(e["step"].as_u64().unwrap()).or_default();
            step.extend(scalars.iter().map(|(t, v)| (t.clone(), v.as_f64().unwrap())));
        }
    }
    assert_eq!(by_step.keys().copied().collect::<Vec<_>>(), (0..rows.len() as u64).collect::<Vec<_>>(), "steps with scalars");
    for row in rows {
        let step = row["step"].as_u64().unwrap();
        let read = &by_step[&step];
        let numbers = numbers_of(row);
        assert_eq!(read.len(), numbers.len(), "step {step}: scalars {read:?} vs metrics numbers {numbers:?}");
        for (path, want) in &numbers {
            let tags: Vec<&String> = match path.split_once('.') {
                Some((outer, inner)) => read.keys().filter(|t| *t == &format!("{outer}/{inner}")).collect(),
                None => read.keys().filter(|t| t.split_once('/').is_some_and(|(_, name)| name == path)).collect(),
            };
            assert_eq!(tags.len(), 1, "step {step}: {path} should be one scalar, tags {:?}", read.keys());
            let got = read[tags[0]];
            assert_eq!(got as f32, *want as f32, "step {step}: {} = {got}, metrics {path} = {want}", tags[0]);
        }
    }
}

fn train(dir: &Path, extra: &[&str]) -> Output {
    let (metrics, tb, checkpoints) = (dir.join("m.jsonl"), dir.join("tb"), dir.join("ckpt"));
    let mut args = vec!["train", "--device", "cpu", "--batch-size", "2", "--seq-len", "32", "--eval-every", "2"];
    args.extend(["--sample-tokens", "0", "--metrics", metrics.to_str().unwrap(), "--tensorboard", tb.to_str().unwrap()]);
    args.extend(["--checkpoint-dir", checkpoints.to_str().unwrap()]);
    args.extend(extra);
    zerostream(&args)
}

#[test]
fn tensorboard_reads_back_every_metrics_number_and_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    // Three steps, then a resumed run to six: two event files in one directory.
    let first = train(dir.path(), &["--steps", "3"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let first_config = std::fs::read_to_string(dir.path().join("m.config.toml")).unwrap();
    let ckpt = dir.path().join("ckpt");
    let second = train(dir.path(), &["--steps", "6", "--resume", ckpt.to_str().unwrap()]);
    assert!(second.status.success(), "{}", stderr(&second));
    let second_config = std::fs::read_to_string(dir.path().join("m.config.toml")).unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.path().join("tb")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files.len(), 2, "one event file per run: {files:?}");
    assert!(files.iter().all(|f| f.to_string_lossy().starts_with("events.out.tfevents.")), "{files:?}");

    let Some(python) = python_or_skip() else { return };
    let events = read_events(&python, &dir.path().join("tb"));
    let rows: Vec<Value> =
        std::fs::read_to_string(dir.path().join("m.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 7, "steps 0-5 and the validation after the last");
    assert!(rows.iter().filter(|r| r["val_loss"].is_number()).count() == 4, "steps 0, 2, 4 and the end are validated");
    assert!(rows[6]["final_validation"] == true && rows[6]["step"] == 6, "{}", rows[6]);
    assert_scalars_match(&events, &rows);

    // Each file starts with its version; the resumed one marks the restart at its first step.
    let list = events["events"].as_array().unwrap();
    let starts: Vec<&Value> = list.iter().filter(|e| e["file_version"].is_string()).collect();
    assert_eq!(starts.len(), 2);
    assert!(starts.iter().all(|e| e["file_version"] == "brain.Event:2"));
    let restarts: Vec<u64> = list.iter().filter(|e| e["session_log"] == "START").map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(restarts, [3]);
    // The configuration as text at each run's first step: the resolved TOML written beside the metrics.
    let texts: Vec<(u64, &str)> = list.iter().filter_map(|e| Some((e["step"].as_u64()?, e["texts"]["config"].as_str()?))).collect();
    let fenced = |toml: &str| format!("```toml\n{}\n```", toml.trim_end());
    assert_eq!(texts, [(0, fenced(&first_config).as_str()), (3, fenced(&second_config).as_str())]);
    assert!(first_config.contains("steps = 3") && first_config.contains("tensorboard = "), "{first_config}");
    assert!(list.iter().all(|e| e["other"].as_array().is_none_or(|o| o.is_empty()) && e["unexpected"].is_null()), "{events}");
    // The dashboards' own view: every scalar under the scalars plugin, the configuration under text.
    let tags = |plugin: &str| {
        events["plugin_tags"][plugin].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert!(
        ["loss/loss", "loss/val_loss", "optimizer/lr", "time/total_s", "links/upload_bytes"]
            .iter()
            .all(|t| tags("scalars").contains(&t.to_string())),
        "{events}"
    );
    assert_eq!(tags("text"), ["config"]);
}

#[test]
fn a_tensorboard_path_that_cannot_be_a_directory_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    for (bad, why) in [(file.clone(), "not a directory"), (file.join("below"), "cannot create the directory")] {
        let out = zerostream(&["train", "--device", "cpu", "--steps", "1", "--sample-tokens", "0", "--tensorboard", bad.to_str().unwrap()]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(&format!("--tensorboard {}", bad.display())) && err.contains(why), "{err}");
        assert!(!err.contains("placement") && !err.contains("step "), "refused before training: {err}");
    }
}
