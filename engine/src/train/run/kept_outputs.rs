//! Where a run writes and how often, kept across a resume: each checkpoint records the run's outputs
//! by flag name (`TrainerState::outputs`, paths from the root), and a resume takes every one not
//! given again. The files it writes (`--metrics`, trimmed to the step resumed from; `--save`;
//! `--tensorboard`) and the checkpoint directory are taken only where the resume continues the run's
//! line, from the newest checkpoint of the directory the run checkpointed into: a branch from an
//! older or copied checkpoint would trim, replace or mix the run's own, so there they are named in a
//! warning instead. `--trace`, one process's timeline, is never taken.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use zerostream_checkpoints::checkpoint::{list_checkpoints, parse_step_name};

use super::RunOptions;
use crate::train::Flags;
use crate::train::checkpoint::SaveDtype;

/// The run's outputs as its checkpoints record them: paths made absolute, so a resume from another
/// folder writes where the run did.
pub fn record(options: &RunOptions) -> Flags {
    let path = |p: Option<&Path>| p.map(|p| super::absolute(p).display().to_string()).into();
    let c = &options.checkpoints;
    Flags::from([
        ("checkpoint-dir".into(), path(c.dir.as_deref())),
        ("checkpoint-every".into(), c.every.into()),
        ("keep-checkpoints".into(), c.keep.into()),
        ("val-data".into(), path(options.val_data.as_deref())),
        ("eval-every".into(), options.eval_every.into()),
        ("eval-batches".into(), options.eval_batches.into()),
        ("metrics".into(), path(options.metrics.as_deref())),
        ("tensorboard".into(), path(options.tensorboard.as_ref().map(|t| t.dir.as_path()))),
        ("save".into(), path(options.save.as_deref())),
        ("save-dtype".into(), options.save_dtype.map(SaveDtype::flag).into()),
        ("sample-tokens".into(), options.sample_tokens.into()),
        ("prompt".into(), options.prompt.clone().into()),
    ])
}

/// What a resume took from its checkpoint's record, as flags, the files it did not take (a branch),
/// and those whose file or folder is no longer there (not made again at the old place), each to be
/// said.
#[derive(Debug, Default, PartialEq)]
pub struct Taken {
    pub taken: Vec<String>,
    pub withheld: Vec<String>,
    pub missing: Vec<String>,
}

/// Takes into `options` (and `tensorboard`, set apart until it is prepared) each output `recorded`
/// by the checkpoint `checkpoint` that the user did not give (`explicit`, by flag name); see the
/// module's text for which files are taken where.
pub fn take(
    checkpoint: &Path,
    recorded: &Flags,
    explicit: &BTreeSet<String>,
    options: &mut RunOptions,
    tensorboard: &mut Option<PathBuf>,
) -> Taken {
    let mut out = Taken::default();
    let wanted = |name: &str| (!explicit.contains(name)).then(|| recorded.get(name)).flatten();
    let path = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(PathBuf::from);
    let number = |v: &Value| v.as_u64();
    let line = continues_its_line(checkpoint, recorded);
    if let Some(root) = line.as_ref().filter(|_| !explicit.contains("checkpoint-dir")) {
        out.taken.push(format!("--checkpoint-dir {}", root.display()));
        options.checkpoints.dir = Some(root.clone());
    }
    // How often and how many only where checkpoints are written at all.
    if options.checkpoints.dir.is_some() {
        if let Some(every) = wanted("checkpoint-every").and_then(number).filter(|&n| n != options.checkpoints.every) {
            options.checkpoints.every = every;
            out.taken.push(format!("--checkpoint-every {every}"));
        }
        if let Some(keep) = wanted("keep-checkpoints").and_then(number).filter(|&n| n as usize != options.checkpoints.keep) {
            options.checkpoints.keep = keep as usize;
            out.taken.push(format!("--keep-checkpoints {keep}"));
        }
    }
    // The validation data is read, never written: taken wherever the run is resumed, if it is there.
    if let Some(p) = wanted("val-data").and_then(path).filter(|p| options.val_data.as_ref() != Some(p)) {
        if p.exists() {
            out.taken.push(format!("--val-data {}", p.display()));
            options.val_data = Some(p);
        } else {
            out.missing.push(format!("--val-data {}", p.display()));
        }
    }
    for (name, slot) in [("metrics", &mut options.metrics), ("save", &mut options.save), ("tensorboard", tensorboard)] {
        if let Some(p) = wanted(name).and_then(path).filter(|p| slot.as_ref() != Some(p)) {
            if line.is_none() {
                out.withheld.push(format!("--{name} {}", p.display()));
            } else if !folder_is_there(&p) {
                out.missing.push(format!("--{name} {}", p.display()));
            } else {
                out.taken.push(format!("--{name} {}", p.display()));
                *slot = Some(p);
            }
        }
    }
    if let Some(every) = wanted("eval-every").and_then(number).filter(|&n| n != options.eval_every) {
        options.eval_every = every;
        out.taken.push(format!("--eval-every {every}"));
    }
    if let Some(batches) = wanted("eval-batches").and_then(number).filter(|&n| n as usize != options.eval_batches) {
        options.eval_batches = batches as usize;
        out.taken.push(format!("--eval-batches {batches}"));
    }
    if let Some(dtype) = wanted("save-dtype").and_then(Value::as_str).and_then(|s| <SaveDtype as clap::ValueEnum>::from_str(s, false).ok())
    {
        if options.save_dtype != Some(dtype) {
            out.taken.push(format!("--save-dtype {}", dtype.flag()));
        }
        options.save_dtype = Some(dtype);
    }
    if let Some(n) = wanted("sample-tokens").and_then(number).filter(|&n| n as usize != options.sample_tokens) {
        options.sample_tokens = n as usize;
        out.taken.push(format!("--sample-tokens {n}"));
    }
    if let Some(prompt) = wanted("prompt").and_then(Value::as_str).filter(|p| *p != options.prompt) {
        out.taken.push(format!("--prompt {prompt:?}"));
        options.prompt = prompt.to_string();
    }
    out
}

/// The run's checkpoint directory where `checkpoint` continues the run's line: the checkpoint its
/// directory's `latest` names, or its newest complete one, in the directory the run checkpointed
/// into (both resolved, so any spelling of either agrees). Where that directory is no longer there
/// (the run's folder moved), or the checkpoint is older than the record of it, the directory the
/// checkpoint lies in stands for it.
fn continues_its_line(checkpoint: &Path, recorded: &Flags) -> Option<PathBuf> {
    let resolved = checkpoint.canonicalize().ok()?;
    let name = resolved.file_name()?.to_str()?;
    let step = parse_step_name(name)?;
    let root = resolved.parent()?;
    if let Some(Ok(dir)) = recorded.get("checkpoint-dir").and_then(Value::as_str).map(|d| Path::new(d).canonicalize())
        && dir != root
    {
        return None;
    }
    let latest = std::fs::read_to_string(root.join(zerostream_checkpoints::checkpoint::LATEST)).unwrap_or_default();
    let newest = list_checkpoints(root).ok()?.last().map(|(s, _)| *s);
    (latest.trim() == name || newest == Some(step)).then(|| root.to_path_buf())
}

/// Whether the output file `path` can be written where the run wrote it: its folder is still there
/// (a run folder moved or removed since would otherwise be made again at the old place).
fn folder_is_there(path: &Path) -> bool {
    path.parent().is_none_or(|p| p.as_os_str().is_empty() || p.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::run::{CheckpointOptions, ModelChoice};

    fn options() -> RunOptions {
        RunOptions::new(ModelChoice::Demo)
    }

    /// A checkpoint root `ck` holding complete checkpoints of `steps`.
    fn root_with(dir: &Path, steps: &[u64]) -> PathBuf {
        let root = dir.join("ck");
        for &s in steps {
            let step = root.join(zerostream_checkpoints::checkpoint::step_name(s));
            std::fs::create_dir_all(&step).unwrap();
            std::fs::write(step.join(zerostream_checkpoints::checkpoint::STATE_FILE), "{}").unwrap();
        }
        root
    }

    fn recorded(root: &Path) -> Flags {
        let mut run = options();
        run.checkpoints = CheckpointOptions { dir: Some(root.to_path_buf()), every: 2, keep: 3 };
        let val = root.with_file_name("val.bin");
        std::fs::write(&val, b"").unwrap();
        run.val_data = Some(val);
        run.eval_every = 5;
        run.eval_batches = 7;
        run.metrics = Some("m.jsonl".into());
        run.save = Some("out".into());
        run.save_dtype = Some(SaveDtype::Bf16);
        run.sample_tokens = 0;
        record(&run)
    }

    #[test]
    fn a_resume_of_the_newest_checkpoint_takes_every_output_not_given_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = root_with(dir.path(), &[2, 4]);
        let recorded = recorded(&root);
        let here = std::env::current_dir().unwrap();
        assert_eq!(recorded["metrics"], here.join("m.jsonl").display().to_string(), "paths from the root");

        let (mut resumed, mut tensorboard) = (options(), None);
        let taken = take(&root.join("step-00000004"), &recorded, &BTreeSet::new(), &mut resumed, &mut tensorboard);
        assert_eq!(resumed.checkpoints.dir, Some(root.canonicalize().unwrap()), "where the checkpoint lies");
        assert_eq!((resumed.checkpoints.every, resumed.checkpoints.keep), (2, 3));
        assert_eq!(resumed.val_data, Some(dir.path().join("val.bin")));
        assert_eq!((resumed.eval_every, resumed.eval_batches), (5, 7));
        assert_eq!((resumed.metrics, resumed.save), (Some(here.join("m.jsonl")), Some(here.join("out"))));
        assert_eq!((resumed.save_dtype, resumed.sample_tokens, tensorboard), (Some(SaveDtype::Bf16), 0, None));
        assert_eq!((taken.taken.len(), taken.withheld.len()), (10, 0), "{taken:?}");

        // A flag given wins, even where it is the default.
        let explicit: BTreeSet<String> = ["checkpoint-every", "metrics", "sample-tokens"].map(String::from).into();
        let (mut resumed, mut tensorboard) = (options(), None);
        take(&root.join("step-00000004"), &recorded, &explicit, &mut resumed, &mut tensorboard);
        assert_eq!((resumed.checkpoints.every, resumed.checkpoints.keep, resumed.metrics, resumed.sample_tokens), (0, 3, None, 300));
    }

    /// A branch (an older checkpoint, or one copied elsewhere) takes the settings and the data read,
    /// never the files the run writes, which it names instead.
    #[test]
    fn a_branch_takes_no_file_the_run_writes() {
        let dir = tempfile::tempdir().unwrap();
        let root = root_with(dir.path(), &[2, 4]);
        let recorded = recorded(&root);
        let copy = dir.path().join("copies");
        std::fs::create_dir_all(copy.join("step-00000004")).unwrap();
        std::fs::write(copy.join("step-00000004").join(zerostream_checkpoints::checkpoint::STATE_FILE), "{}").unwrap();
        for branch in [root.join("step-00000002"), copy.join("step-00000004")] {
            let (mut resumed, mut tensorboard) = (options(), None);
            let taken = take(&branch, &recorded, &BTreeSet::new(), &mut resumed, &mut tensorboard);
            assert_eq!((resumed.checkpoints.dir, resumed.metrics, resumed.save), (None, None, None), "{}", branch.display());
            assert_eq!(taken.withheld.len(), 2, "--metrics and --save named: {taken:?}");
            assert!(resumed.val_data.is_some() && resumed.eval_every == 5 && resumed.checkpoints.every == 0);
        }
        // The checkpoint `latest` names continues the line, newest or not (a resume from an older step
        // in place, or a stop between a checkpoint's rename and latest's).
        std::fs::write(root.join("latest"), "step-00000002").unwrap();
        let (mut resumed, mut tensorboard) = (options(), None);
        let taken = take(&root.join("step-00000002"), &recorded, &BTreeSet::new(), &mut resumed, &mut tensorboard);
        assert!(resumed.checkpoints.dir.is_some() && resumed.metrics.is_some() && taken.withheld.is_empty(), "{taken:?}");
    }

    /// A run folder moved away: the checkpoint's own directory continues the line, and outputs whose
    /// folder or file is gone are named rather than made again at the old place.
    #[test]
    fn outputs_no_longer_there_are_named_not_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = root_with(dir.path(), &[2]);
        let mut recorded = recorded(&root);
        recorded.insert("checkpoint-dir".into(), dir.path().join("gone/ck").display().to_string().into());
        recorded.insert("save".into(), dir.path().join("gone/out").display().to_string().into());
        std::fs::remove_file(dir.path().join("val.bin")).unwrap();
        let (mut resumed, mut tensorboard) = (options(), None);
        let taken = take(&root.join("step-00000002"), &recorded, &BTreeSet::new(), &mut resumed, &mut tensorboard);
        assert_eq!(resumed.checkpoints.dir, Some(root.canonicalize().unwrap()));
        assert_eq!((resumed.save, resumed.val_data), (None, None));
        assert_eq!(taken.missing.len(), 2, "{taken:?}");
        assert!(resumed.metrics.is_some(), "the metrics' folder is there");
    }

    #[test]
    fn an_older_checkpoint_without_a_record_takes_only_its_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = root_with(dir.path(), &[2]);
        let (mut resumed, mut tensorboard) = (options(), None);
        let taken = take(&root.join("step-00000002"), &Flags::new(), &BTreeSet::new(), &mut resumed, &mut tensorboard);
        assert_eq!(taken.taken, [format!("--checkpoint-dir {}", root.canonicalize().unwrap().display())]);
        assert_eq!(resumed.metrics, None);
    }
}
