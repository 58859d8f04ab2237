//! `zerostream train` and `zerostream plan`: their flags (`args.rs`), resolved into one [`RunRequest`] handed to
//! the library once ([`zerostream::train::launch`] checks and runs it), SIGINT/SIGTERM (`signals.rs`), the exit code;
//! and where the first run (no arguments at all) keeps its files.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use zerostream::train::launch::Launched;
use zerostream::train::run::RunOptions;

mod args;
mod resolve;
mod signals;
pub use args::TrainArgs;
use args::{OffloadTarget, RamCache};
use resolve::resolve_train;

/// `zerostream train`: the flags resolved into one request, handed to the library once; then the exit
/// code, with a line saying how to continue a run a signal stopped (rank 0's).
/// `quiet`: no progress, description or summary (warnings and errors still print).
pub fn train(a: TrainArgs, given: &crate::Given, resolved: &str, quiet: bool) -> Result<i32> {
    let explicit = &given.explicit;
    if a.measure.is_some() {
        bail!("--measure is plan's: `zerostream plan --measure [DIR] ...` with the same flags predicts this run's step time");
    }
    let mut request = resolve_train(&a, true, given, resolved)?;
    request.options.progress = !quiet;
    if explicit.is_empty() {
        keep_first_run_files(&mut request.options)?;
    }
    request.options.stop = Some(signals::stop_on_signals()?);
    let (rank, summary) = match zerostream::train::launch::launch(request)? {
        Launched::AlreadyDone => return Ok(0),
        Launched::Ran { rank, summary } => (rank, summary),
    };
    // The sample is the run's one text result: stdout, as generate's is.
    if let Some(text) = &summary.sample {
        if !quiet {
            eprintln!("sample, on stdout:");
        }
        println!("{text}");
    }
    let Some(step) = summary.stopped_at else { return Ok(0) };
    if rank == 0 {
        match &summary.checkpoint {
            Some(path) => {
                eprintln!(
                    "stopped by a signal {}; checkpoint {}; continue with --resume {}",
                    after_steps(step),
                    path.display(),
                    path.display()
                )
            }
            None => eprintln!("stopped by a signal {}; no --checkpoint-dir was given, so nothing was saved", after_steps(step)),
        }
    }
    Ok(signals::stopped_exit_code())
}

/// When a run stopped by a signal stopped, given the steps done (`done`): steps count from 0, as the
/// progress lines and the metrics do, and a checkpoint is named by the steps done.
fn after_steps(done: u64) -> String {
    match done.checked_sub(1) {
        Some(last) => format!("after step {last} ({} done)", zerostream::words::counted(done, "step")),
        None => "before the first step".into(),
    }
}

/// `plan`'s exit code when every rank's host state would not fit in this machine's available RAM:
/// apart from 1 (an error, or a device budget too small) since ranks on several machines may still fit.
pub const PLAN_EXCEEDS_RAM_HERE: i32 = 3;

/// `zerostream plan`: the placement `train` would use with the same flags; returns the exit code.
pub fn plan(a: TrainArgs, given: &crate::Given) -> Result<i32> {
    let request = resolve_train(&a, false, given, "")?;
    // Taken with the rest of a train command line, but plan trains nothing: say so rather than ignore them unsaid.
    if let Some(line) = zerostream::train::ignored::ignored_by_plan(&given.changed) {
        eprintln!("note: {line}");
    }
    let (placement, predicted) = match &a.measure {
        Some(dir) => {
            eprintln!("plan --measure: timing the drive, the update and the device on this run's shapes ...");
            let (placement, line) = zerostream::train::launch::plan_measured(request, std::path::Path::new(dir))?;
            (placement, Some(line))
        }
        None => (zerostream::train::launch::plan(request)?, None),
    };
    println!("{}", placement.describe());
    let (host, fits) = placement.host_verdict();
    println!("{host}");
    if let Some(line) = predicted {
        println!("{line}");
    }
    Ok(if fits == Some(false) { PLAN_EXCEEDS_RAM_HERE } else { 0 })
}

/// Where `zerostream train` with no arguments at all keeps what it made.
pub const FIRST_RUN_DIR: &str = "zerostream-hamlet";

/// `zerostream train` with no arguments at all (the README's first command) keeps its metrics, the
/// loss plot and the model in [`FIRST_RUN_DIR`], so the run can be looked at and generated from. Only
/// this run's own file names are ever replaced there: a directory holding anything else is left alone.
fn keep_first_run_files(options: &mut RunOptions) -> Result<()> {
    let dir = PathBuf::from(FIRST_RUN_DIR);
    // `loss.svg`: the plot's name before it followed the metrics file's.
    let ours = ["metrics.jsonl", "metrics.config.toml", "metrics.svg", "loss.svg", "model"];
    if dir.exists() {
        let entries = std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries {
            let name = entry?.file_name();
            if !ours.iter().any(|o| name == *o) && !zerostream::train::save_dir::is_browser_litter(&name.to_string_lossy()) {
                eprintln!(
                    "note: {} holds {} (not this run's): the run writes no files; give --metrics/--save to keep them elsewhere",
                    dir.display(),
                    dir.join(&name).display()
                );
                return Ok(());
            }
        }
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    options.metrics = Some(dir.join("metrics.jsonl"));
    options.save = Some(dir.join("model"));
    Ok(())
}
