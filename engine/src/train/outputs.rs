//! What a run writes besides its state, checked before any work: none of its outputs is one of its
//! inputs, `--save` holds nothing but a model, the resolved configuration beside `--metrics` never
//! replaces the `--config-file` it came from; and the model of a finished run saved from its checkpoint.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::run::{ModelChoice, RunOptions};

/// Files a model directory `--save` may replace holds.
pub const MODEL_FILES: &[&str] = &[
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// Whether `a` and `b` name one existing file or directory (a path that does not exist is nobody's).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Checks the run's outputs before any work: none is one of its inputs (it would be overwritten),
/// `--save` can be written (its parent is created if missing) and holds no files but a model's, and
/// `--metrics` is not a directory.
pub fn check_outputs(options: &RunOptions) -> Result<()> {
    let mut inputs: Vec<PathBuf> = options.data.iter().chain(&options.val_data).cloned().collect();
    if let ModelChoice::Hf(dir) | ModelChoice::Resume(dir) = &options.model {
        inputs.push(dir.clone());
        inputs.extend(std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()));
    }
    let outputs = [("--metrics", &options.metrics), ("--save", &options.save), ("--checkpoint-dir", &options.checkpoints.dir)];
    for (flag, path) in outputs {
        let Some(path) = path else { continue };
        if let Some(input) = inputs.iter().find(|p| same_file(p, path)) {
            bail!("{flag} {} is the input {}: it would be overwritten; choose another path", path.display(), input.display());
        }
    }
    if let (Some(save), Some(root)) = (&options.save, &options.checkpoints.dir)
        && same_file(save, root)
    {
        bail!("--save {} is also the --checkpoint-dir: give the saved model its own directory", save.display());
    }
    if let Some(save) = &options.save {
        check_save_dir(save)?;
    }
    // The metrics file is opened after the state is built, which can take minutes on NVMe.
    if let Some(metrics) = &options.metrics
        && metrics.is_dir()
    {
        bail!(
            "--metrics {}: is a directory; give the metrics file's path (e.g. {})",
            metrics.display(),
            metrics.join("run.jsonl").display()
        );
    }
    Ok(())
}

/// `--save DIR`: refused unless it is new or a model directory (so replacing it loses nothing else), and
/// unless its parent accepts the directory it is written into first.
pub fn check_save_dir(save: &Path) -> Result<()> {
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
    let partial = super::checkpoint::save_partial_dir(save)?;
    if let Some(parent) = partial.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("--save {}: creating {}", save.display(), parent.display()))?;
    }
    // A probe now rather than an error after the whole run; named for this process, since every rank
    // of an MPI launch probes at once (a shared name raced: one rank removed the other's probe).
    let mut probe = partial.into_os_string();
    probe.push(format!(".probe-{}", std::process::id()));
    let probe = PathBuf::from(probe);
    std::fs::create_dir(&probe)
        .with_context(|| format!("--save {}: cannot write {} (is it writable?)", save.display(), probe.display()))?;
    std::fs::remove_dir(&probe).with_context(|| format!("removing {}", probe.display()))?;
    Ok(())
}

/// Where the resolved configuration of a run with `--metrics METRICS` goes: `run.jsonl` ->
/// `run.config.toml`, beside it.
pub fn resolved_path(metrics: &Path) -> PathBuf {
    let stem = metrics.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    metrics.with_file_name(format!("{stem}.config.toml"))
}

/// Writes `text` as the resolved configuration beside `metrics`, unless that path is the config file
/// the run was started from and holds something else (it would be lost): then it is refused.
pub fn write_resolved(metrics: &Path, text: &str, config_file: Option<&Path>) -> Result<PathBuf> {
    let path = resolved_path(metrics);
    if let Some(input) = config_file
        && same_file(input, &path)
    {
        if std::fs::read_to_string(input).ok().as_deref() == Some(text) {
            return Ok(path);
        }
        bail!(
            "--metrics {} would write the resolved configuration to {}, which is the --config-file: it would be overwritten; \
             choose another --metrics path",
            metrics.display(),
            path.display()
        );
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    zerostream_checkpoints::checkpoint::write_file_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// `--save` of a resumed run whose checkpoint `dir` is at `--steps` already: the checkpoint's model
/// files copied aside, then renamed into place (a crash leaves no half-written `--save`). An existing
/// `--save` is left as it is. Says what it did on stderr.
pub fn save_finished_model(dir: &Path, save: &Path) -> Result<()> {
    if save.exists() {
        eprintln!("train: --save {} exists already; left as it is", save.display());
        return Ok(());
    }
    let partial = save.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).with_context(|| format!("removing the leftover {}", partial.display()))?;
    }
    std::fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    // The checkpoint is a model directory plus the optimizer's and trainer's state.
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let state_file = name.starts_with("optimizer.rank") || name == zerostream_checkpoints::checkpoint::STATE_FILE;
        if path.is_file() && !state_file {
            std::fs::copy(&path, partial.join(&name)).with_context(|| format!("copying {} into {}", path.display(), partial.display()))?;
        }
    }
    std::fs::rename(&partial, save).with_context(|| format!("renaming {} to {}", partial.display(), save.display()))?;
    eprintln!("train: saved the checkpoint's model to {}", save.display());
    Ok(())
}
