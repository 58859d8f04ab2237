//! What `zerostream train` checks before any work (the flags against each other, the resumed model, the
//! outputs it would write), and where the first run — `train` with no arguments at all — keeps its files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use zerostream::train::run::{ModelChoice, RunOptions};

use super::TrainArgs;

/// With --resume, a --model or --config given as well must describe the checkpoint's model.
pub(super) fn check_resumed_model(a: &TrainArgs, checkpoint: &Path) -> Result<()> {
    let (flag, given) = match (&a.model, &a.config) {
        (Some(dir), _) => ("--model", ModelChoice::Hf(dir.clone())),
        (None, Some(spec)) => ("--config", ModelChoice::Config(spec.clone())),
        _ => return Ok(()),
    };
    let ours = zerostream::train::run::model_config(&ModelChoice::Resume(checkpoint.to_path_buf()))?;
    let theirs = zerostream::train::run::model_config(&given)?;
    // Dropout is how the model was trained, not what it is: a checkpoint's config.json records the
    // probabilities it trained with (--dropout included), and resume compares --dropout on its own.
    if ours.with_dropout(0.0)? != theirs.with_dropout(0.0)? {
        bail!(
            "{flag} is not the checkpoint's model ({}): the checkpoint has {}; {flag} has {}. Leave {flag} out: the model comes from \
             the checkpoint",
            checkpoint.display(),
            ours.describe(),
            theirs.describe()
        );
    }
    Ok(())
}

/// Where `zerostream train` with no arguments at all keeps what it made.
pub const FIRST_RUN_DIR: &str = "zerostream-hamlet";

/// `zerostream train` with no arguments at all (the README's first command) keeps its metrics, the
/// loss plot and the model in [`FIRST_RUN_DIR`], so the run can be looked at and generated from. Only
/// this run's own file names are ever replaced there: a directory holding anything else is left alone.
pub(super) fn keep_first_run_files(options: &mut RunOptions) -> Result<()> {
    let dir = PathBuf::from(FIRST_RUN_DIR);
    let ours = ["metrics.jsonl", "metrics.config.toml", "loss.svg", "model"];
    if dir.exists() {
        let entries = std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries {
            let name = entry?.file_name();
            if !ours.iter().any(|o| name == *o) {
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

/// Refuses optimizer settings that cannot train: each named with the range it must lie in.
pub(super) fn check_hyperparameters(a: &TrainArgs) -> Result<()> {
    /// A flag, its value, whether the value is in range, and the range in words.
    type Check<'a> = (&'a str, f64, fn(f64) -> bool, &'a str);
    let checks: [Check; 7] = [
        ("--lr", a.lr, |x| x > 0.0, "a finite number > 0"),
        ("--min-lr", a.min_lr, |x| x >= 0.0, "a finite number >= 0"),
        ("--beta1", a.beta1, |x| (0.0..1.0).contains(&x), "in [0, 1)"),
        ("--beta2", a.beta2, |x| (0.0..1.0).contains(&x), "in [0, 1)"),
        ("--eps", a.eps, |x| x > 0.0, "a finite number > 0"),
        ("--weight-decay", a.weight_decay, |x| x >= 0.0, "a finite number >= 0"),
        ("--grad-clip", a.grad_clip, |x| x >= 0.0, "a finite number >= 0 (0 = no clipping)"),
    ];
    for (flag, value, ok, range) in checks {
        if !value.is_finite() || !ok(value) {
            bail!("{flag} {value}: must be {range}");
        }
    }
    Ok(())
}

/// Checks the run's outputs before any work: none is one of its inputs (it would be overwritten), and
/// `--save` can be written (its parent is created if missing) and holds no files but a model's.
pub(super) fn check_outputs(a: &TrainArgs, model: &ModelChoice, data: Option<&Path>) -> Result<()> {
    let mut inputs: Vec<PathBuf> = data.iter().map(|p| p.to_path_buf()).chain(a.val_data.iter().cloned()).collect();
    let model_dir = match model {
        ModelChoice::Hf(dir) | ModelChoice::Resume(dir) => Some(dir.clone()),
        _ => None,
    };
    if let Some(dir) = &model_dir {
        inputs.push(dir.clone());
        inputs.extend(std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()));
    }
    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    };
    let outputs = [("--metrics", &a.metrics), ("--save", &a.save), ("--checkpoint-dir", &a.checkpoint_dir)];
    for (flag, path) in outputs {
        let Some(path) = path else { continue };
        if let Some(input) = inputs.iter().find(|p| same(p, path)) {
            bail!("{flag} {} is the input {}: it would be overwritten; choose another path", path.display(), input.display());
        }
    }
    if let (Some(save), Some(root)) = (&a.save, &a.checkpoint_dir)
        && same(save, root)
    {
        bail!("--save {} is also the --checkpoint-dir: give the saved model its own directory", save.display());
    }
    if let Some(save) = &a.save {
        check_save_dir(save)?;
    }
    Ok(())
}

/// Files a model directory `--save` may replace holds.
pub(super) const MODEL_FILES: &[&str] = &[
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// `--save DIR`: refused unless it is new or a model directory (so replacing it loses nothing else), and
/// unless its parent accepts the directory it is written into first.
pub(super) fn check_save_dir(save: &Path) -> Result<()> {
    if save.exists() {
        if !save.is_dir() {
            bail!("--save {}: exists and is not a directory", save.display());
        }
        let entries = std::fs::read_dir(save).with_context(|| format!("--save {}: cannot list it", save.display()))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !MODEL_FILES.contains(&name.as_str()) {
                bail!(
                    "--save {} holds {name}, which is not part of a model: saving replaces the whole directory; choose a new or empty one",
                    save.display()
                );
            }
        }
    }
    let partial = zerostream::train::checkpoint::save_partial_dir(save)?;
    if let Some(parent) = partial.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("--save {}: creating {}", save.display(), parent.display()))?;
    }
    // A probe now rather than an error after the whole run.
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir(&partial)
        .with_context(|| format!("--save {}: cannot write {} (is it writable?)", save.display(), partial.display()))?;
    std::fs::remove_dir(&partial).with_context(|| format!("removing {}", partial.display()))?;
    Ok(())
}
