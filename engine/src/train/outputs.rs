//! What a run writes besides its state, checked before any work: none of its outputs is one of its
//! inputs, `--save` holds nothing but a model, the resolved configuration beside `--metrics` never
//! replaces the `--config-file` it came from; and the model of a finished run saved from its checkpoint.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::checkpoint::{Checkpoint, SaveDtype, saved_dtype};
use super::run::{ModelChoice, RunOptions, plot_path};

/// Whether `a` and `b` name one existing file or directory (a path that does not exist is nobody's).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Whether `a` and `b` name one place, existing or not: the same file or directory, or paths that
/// resolve to the same absolute path (two outputs not yet written), on macOS and Windows whatever
/// their letters' case (their usual file systems ignore it).
fn same_place(a: &Path, b: &Path) -> bool {
    same_file(a, b) || matches!((std::path::absolute(a), std::path::absolute(b)), (Ok(x), Ok(y)) if same_names(&x, &y))
}

fn same_names(x: &Path, y: &Path) -> bool {
    if cfg!(any(target_os = "macos", windows)) {
        let folded = |p: &Path| p.components().map(|c| c.as_os_str().to_string_lossy().to_lowercase()).collect::<Vec<_>>();
        folded(x) == folded(y)
    } else {
        x.components().eq(y.components())
    }
}

/// Checks the run's outputs before any work: none is one of its inputs (the data, the model, the
/// `--config` file, the `--config-file`: each would be overwritten), no two are one path, `--save` can
/// be written (its parent is created if missing) and holds no files but a model's, and `--metrics` is
/// not a directory, nor a file of anything but metrics rows.
pub fn check_outputs(options: &RunOptions, config_file: Option<&Path>, tensorboard: Option<&Path>) -> Result<()> {
    let mut inputs: Vec<(&str, PathBuf)> = options.data.iter().map(|p| ("--data", p.clone())).collect();
    inputs.extend(options.val_data.iter().map(|p| ("--val-data", p.clone())));
    inputs.extend(config_file.map(|p| ("--config-file", p.to_path_buf())));
    match &options.model {
        ModelChoice::Hf(dir) | ModelChoice::Resume(dir) => {
            let flag = if matches!(options.model, ModelChoice::Hf(_)) { "--model" } else { "--resume" };
            inputs.push((flag, dir.clone()));
            inputs.extend(std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| (flag, e.path())));
        }
        ModelChoice::Config(name) if Path::new(name).is_file() => inputs.push(("--config", PathBuf::from(name))),
        ModelChoice::Config(_) | ModelChoice::Demo => {}
    }
    let plot = options.metrics.as_deref().map(plot_path);
    let resolved = options.metrics.as_deref().map(resolved_path);
    const RESOLVED: &str = "--metrics' resolved configuration";
    let outputs: Vec<(&str, &PathBuf)> = [
        ("--metrics", options.metrics.as_ref()),
        ("--metrics' plot", plot.as_ref()),
        (RESOLVED, resolved.as_ref()),
        ("--trace", options.trace.as_ref()),
        ("--save", options.save.as_ref()),
        ("--checkpoint-dir", options.checkpoints.dir.as_ref()),
    ]
    .into_iter()
    .filter_map(|(flag, path)| Some((flag, path?)))
    .collect();
    for (i, &(flag, path)) in outputs.iter().enumerate() {
        // The resolved copy may be the --config-file it came from: `write_resolved` takes that case.
        let replaced = |(input_flag, p): &&(&str, PathBuf)| same_file(p, path) && !(flag == RESOLVED && *input_flag == "--config-file");
        if let Some((input_flag, input)) = inputs.iter().find(replaced) {
            bail!(
                "{flag} {} is the input {} ({input_flag}): it would be overwritten; choose another path",
                path.display(),
                input.display()
            );
        }
        if let Some((other, _)) = outputs[..i].iter().find(|(_, p)| same_place(p, path)) {
            bail!("{flag} {} is also the {other}: each output needs a path of its own", path.display());
        }
    }
    // A file the TensorBoard directory would be made inside of, or one of the run's other files.
    if let Some(dir) = tensorboard
        && let Some((flag, _)) =
            inputs.iter().map(|(f, p)| (*f, p)).chain(outputs.iter().map(|(f, p)| (*f, *p))).find(|(_, p)| same_place(p, dir))
    {
        bail!("--tensorboard {} is also the {flag}: give TensorBoard a directory of its own", dir.display());
    }
    if let Some(save) = &options.save {
        super::save_dir::check_save_dir(save)?;
    }
    // Before the resolved configuration is written beside the metrics, or anything else is done.
    if let Some(dir) = &options.checkpoints.dir {
        let resumed_from = match &options.model {
            ModelChoice::Resume(checkpoint) => Some(checkpoint.as_path()),
            _ => None,
        };
        zerostream_checkpoints::checkpoint::check_root_takes(dir, resumed_from)?;
    }
    // The metrics file is opened after the state is built, which can take minutes on NVMe.
    if let Some(metrics) = &options.metrics {
        if metrics.is_dir() {
            bail!(
                "--metrics {}: is a directory; give the metrics file's path (e.g. {})",
                metrics.display(),
                metrics.join("run.jsonl").display()
            );
        }
        super::metrics_file::count_rows(metrics)?;
    }
    Ok(())
}

/// Where the resolved configuration of a run with `--metrics METRICS` goes: `run.jsonl` ->
/// `run.config.toml`, beside it.
pub fn resolved_path(metrics: &Path) -> PathBuf {
    super::run::beside(metrics, "config.toml")
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
    zerostream_checkpoints::checkpoint::create_parent_dir("--metrics", metrics)?;
    zerostream_checkpoints::checkpoint::write_file_atomic(&path, text.as_bytes())
        .with_context(|| format!("--metrics {}: writing the run's resolved configuration beside it", metrics.display()))?;
    Ok(path)
}

/// `--save` of a resumed run whose checkpoint `dir` is at `--steps` already: the checkpoint's model
/// files copied aside, then renamed into place (a crash leaves no half-written `--save`). Asked for a
/// `dtype` other than the one the checkpoint saved, the weights are written in it from the f32
/// master weights instead. An existing `--save` is left as it is. Says what it did on stderr.
pub fn save_finished_model(dir: &Path, save: &Path, dtype: Option<SaveDtype>) -> Result<()> {
    if save.exists() {
        eprintln!("train: --save {} exists already; left as it is", save.display());
        return Ok(());
    }
    // The hidden name a run's own save is written under (`with_extension` had named `final.v2`'s
    // `final.partial`, a directory of the user's, and removed it).
    let partial = super::checkpoint::save_partial_dir(save)?;
    if partial.exists() {
        std::fs::remove_dir_all(&partial).with_context(|| format!("removing the leftover {}", partial.display()))?;
    }
    std::fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut converted = None;
    let copied = (|| {
        // Another dtype than the checkpoint saved: the model file and config.json written anew, the
        // rest copied.
        // A dtype that cannot be read is converted too: the master weights are right whatever it was.
        let saved = saved_dtype(dir).ok();
        let convert = dtype.filter(|&asked| saved != Some(asked));
        copy_model_files(dir, &partial, convert.is_some())?;
        if let Some(asked) = convert {
            Checkpoint::open(dir)?.write_model(&partial, asked)?;
            converted = Some((saved, asked));
        }
        std::fs::rename(&partial, save).with_context(|| format!("renaming {} to {}", partial.display(), save.display()))
    })();
    if let Err(e) = copied {
        // Not left to fill the disk that refused it.
        let _ = std::fs::remove_dir_all(&partial);
        return Err(e).with_context(|| format!("--save {}", save.display()));
    }
    match converted {
        Some((from, to)) => eprintln!(
            "train: saved the checkpoint's model to {} in {} (from its f32 master weights; the checkpoint saved {})",
            save.display(),
            to.flag(),
            from.map_or("a dtype its config.json does not name", SaveDtype::flag)
        ),
        None => eprintln!("train: saved the checkpoint's model to {}", save.display()),
    }
    Ok(())
}

/// Warnings for a `--checkpoint-dir` or `--save` whose file system has less room free than one
/// checkpoint (or the model) of `model` takes, an estimate from its parameters: a full disk would
/// otherwise be found at the first save, after the steps before it. Warned, not refused: the bytes
/// are estimated, and a disk may be freed while the run trains.
pub fn room_warnings(options: &RunOptions, model: &crate::model::Model, train: &super::TrainConfig) -> Vec<String> {
    let params: u64 = super::layout::group_layouts(model).iter().map(|g| g.len as u64).sum();
    let dtype = options.save_dtype.unwrap_or(SaveDtype::of(train.precision));
    let model_bytes = params * if dtype == SaveDtype::F32 { 4 } else { 2 };
    let moment_bytes = match train.adam_state {
        super::choices::AdamState::Fp32 => 4,
        super::choices::AdamState::Bf16 => 2,
    };
    // The master weights in f32 and the moments, over all ranks' optimizer files.
    let optimizer_bytes = params * (4 + moment_bytes * train.optimizer.moment_names().len() as u64);
    // (flag, path, bytes it needs, what they hold)
    let mut outputs: Vec<(&str, &Path, u64, &str)> = Vec::new();
    if let Some(dir) = &options.checkpoints.dir {
        outputs.push(("--checkpoint-dir", dir, model_bytes + optimizer_bytes, "a checkpoint (the model and the optimizer's state)"));
    }
    if let Some(save) = &options.save {
        outputs.push(("--save", save, model_bytes, "the model"));
    }
    short_of_room(&outputs, |path| zerostream_offload::free_bytes(path).ok())
}

/// The warnings for `outputs` (flag, path, bytes needed, what they hold) whose file system has less
/// free (`free_bytes`, None where it cannot be told) than they need. Outputs on one file system share
/// its free space: checked together.
fn short_of_room(outputs: &[(&str, &Path, u64, &str)], free_bytes: impl Fn(&Path) -> Option<u64>) -> Vec<String> {
    let paths: Vec<&Path> = outputs.iter().map(|o| o.1).collect();
    let mut warnings = Vec::new();
    for group in zerostream_offload::by_file_system(&paths) {
        let Some(free) = free_bytes(paths[group[0]]) else { continue };
        let need: u64 = group.iter().map(|&o| outputs[o].2).sum();
        if free >= need {
            continue;
        }
        let named: Vec<String> = group.iter().map(|&o| format!("{} {}", outputs[o].0, outputs[o].1.display())).collect();
        let held: Vec<&str> = group.iter().map(|&o| outputs[o].3).collect();
        let (takes, fs) = if group.len() == 1 { ("takes", "its file system has") } else { ("take together", "their one file system has") };
        warnings.push(format!(
            "warning: {}: {} {takes} about {}, but {fs} {} free: the save would fail for want of room (free some space, \
             or name a roomier place)",
            named.join(" and "),
            held.join(" and "),
            crate::words::size(need),
            crate::words::size(free)
        ));
    }
    warnings
}

/// Copies the model files of the checkpoint `dir` (a model directory plus the optimizer's and the
/// trainer's state) into `into`; `but_weights`: not its model file and config.json either.
fn copy_model_files(dir: &Path, into: &Path, but_weights: bool) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let state_file = name.starts_with("optimizer.rank") || name == zerostream_checkpoints::checkpoint::STATE_FILE;
        let weights = name == "model.safetensors" || name == "config.json";
        if path.is_file() && !state_file && !(but_weights && weights) {
            std::fs::copy(&path, into.join(&name)).with_context(|| format!("copying {} into {}", path.display(), into.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two outputs differing only in case are one place where the file system ignores case.
    #[test]
    fn paths_differing_in_case_are_one_place_on_macos_and_windows() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("Run.jsonl"), dir.path().join("run.jsonl"));
        assert_eq!(same_place(&a, &b), cfg!(any(target_os = "macos", windows)));
        assert!(same_place(&a, &a.clone()) && !same_place(&a, &dir.path().join("other.jsonl")));
    }

    /// A checkpoint folder and `--save` on one file system are warned about together when each fits
    /// its free space alone but not both; on file systems of their own, neither is.
    #[test]
    fn outputs_on_one_file_system_share_its_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let (ckpt, save) = (dir.path().join("ckpt"), dir.path().join("final"));
        let outputs = [("--checkpoint-dir", ckpt.as_path(), 3 << 30, "a checkpoint"), ("--save", save.as_path(), 1 << 30, "the model")];
        let warnings = short_of_room(&outputs, |_| Some(7 << 29));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let want = format!(
            "--checkpoint-dir {} and --save {}: a checkpoint and the model take together about 4.0 GiB, but their one file system has 3.5 GiB free",
            ckpt.display(),
            save.display()
        );
        assert!(warnings[0].contains(&want), "{warnings:?}");
        assert!(short_of_room(&outputs, |_| Some(4 << 30)).is_empty());
        assert!(short_of_room(&outputs[..1], |_| Some(7 << 29)).is_empty());
        #[cfg(target_os = "linux")]
        {
            let apart = [outputs[0], ("--save", Path::new("/proc/final"), 1 << 30, "the model")];
            assert!(short_of_room(&apart, |_| Some(7 << 29)).is_empty());
        }
    }
}
