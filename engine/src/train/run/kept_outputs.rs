//! Where a run writes and how often, kept across a resume: each checkpoint records the run's outputs
//! by flag name (`TrainerState::outputs`, paths from the root), and a resume takes every one not
//! given again, so `train --resume DIR` goes on checkpointing, validating and writing its metrics as
//! the run did. Checkpoints go on into the directory the resumed checkpoint lies in. `--trace`, one
//! process's timeline, is never taken (it would replace the earlier run's).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use zerostream_checkpoints::checkpoint::parse_step_name;

use super::RunOptions;
use crate::train::Flags;
use crate::train::checkpoint::SaveDtype;

/// The run's outputs as its checkpoints record them: paths made absolute, so a resume from another
/// folder writes where the run did.
pub fn record(options: &RunOptions) -> Flags {
    let path = |p: Option<&Path>| p.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string()).into();
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

/// Takes into `options` (and `tensorboard`, set apart until it is prepared) each output `recorded`
/// by the checkpoint `checkpoint` that the user did not give (`explicit`, by flag name); the
/// checkpoint directory is the one the checkpoint lies in (where it was found, whatever the record
/// says, so a moved root goes on where it now is). Returns what was taken, as flags, to be said.
pub fn take(
    checkpoint: &Path,
    recorded: &Flags,
    explicit: &BTreeSet<String>,
    options: &mut RunOptions,
    tensorboard: &mut Option<PathBuf>,
) -> Vec<String> {
    let mut taken = Vec::new();
    let wanted = |name: &str| (!explicit.contains(name)).then(|| recorded.get(name)).flatten();
    let path = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(PathBuf::from);
    let number = |v: &Value| v.as_u64();
    if !explicit.contains("checkpoint-dir")
        && let Some(root) = root_of(checkpoint)
    {
        taken.push(format!("--checkpoint-dir {}", root.display()));
        options.checkpoints.dir = Some(root);
    }
    // How often and how many only where checkpoints are written at all.
    if options.checkpoints.dir.is_some() {
        if let Some(every) = wanted("checkpoint-every").and_then(number).filter(|&n| n != options.checkpoints.every) {
            options.checkpoints.every = every;
            taken.push(format!("--checkpoint-every {every}"));
        }
        if let Some(keep) = wanted("keep-checkpoints").and_then(number).filter(|&n| n as usize != options.checkpoints.keep) {
            options.checkpoints.keep = keep as usize;
            taken.push(format!("--keep-checkpoints {keep}"));
        }
    }
    for (name, slot) in
        [("val-data", &mut options.val_data), ("metrics", &mut options.metrics), ("save", &mut options.save), ("tensorboard", tensorboard)]
    {
        if let Some(p) = wanted(name).and_then(path).filter(|p| slot.as_ref() != Some(p)) {
            taken.push(format!("--{name} {}", p.display()));
            *slot = Some(p);
        }
    }
    if options.val_data.is_some() {
        if let Some(every) = wanted("eval-every").and_then(number).filter(|&n| n != options.eval_every) {
            options.eval_every = every;
            taken.push(format!("--eval-every {every}"));
        }
        if let Some(batches) = wanted("eval-batches").and_then(number).filter(|&n| n as usize != options.eval_batches) {
            options.eval_batches = batches as usize;
            taken.push(format!("--eval-batches {batches}"));
        }
    }
    if let Some(dtype) = wanted("save-dtype").and_then(Value::as_str).and_then(|s| <SaveDtype as clap::ValueEnum>::from_str(s, false).ok())
    {
        if options.save_dtype != Some(dtype) {
            taken.push(format!("--save-dtype {}", dtype.flag()));
        }
        options.save_dtype = Some(dtype);
    }
    if let Some(n) = wanted("sample-tokens").and_then(number).filter(|&n| n as usize != options.sample_tokens) {
        options.sample_tokens = n as usize;
        taken.push(format!("--sample-tokens {n}"));
    }
    if let Some(prompt) = wanted("prompt").and_then(Value::as_str).filter(|p| *p != options.prompt) {
        taken.push(format!("--prompt {prompt:?}"));
        options.prompt = prompt.to_string();
    }
    taken
}

/// The checkpoint root `checkpoint` lies in: its folder, where the checkpoint is one of a root's
/// (`step-NNNNNNNN`); None for a checkpoint copied elsewhere under another name.
fn root_of(checkpoint: &Path) -> Option<PathBuf> {
    parse_step_name(checkpoint.file_name()?.to_str()?)?;
    Some(checkpoint.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::run::ModelChoice;

    fn options() -> RunOptions {
        RunOptions::new(ModelChoice::Demo)
    }

    #[test]
    fn a_resume_takes_every_output_not_given_again() {
        let mut run = options();
        run.checkpoints = super::super::CheckpointOptions { dir: Some("ck".into()), every: 2, keep: 3 };
        run.val_data = Some("val.bin".into());
        run.eval_every = 5;
        run.eval_batches = 7;
        run.metrics = Some("m.jsonl".into());
        run.save = Some("out".into());
        run.save_dtype = Some(SaveDtype::Bf16);
        run.sample_tokens = 0;
        let recorded = record(&run);
        let here = std::env::current_dir().unwrap();
        assert_eq!(recorded["metrics"], here.join("m.jsonl").display().to_string(), "paths from the root");

        let (mut resumed, mut tensorboard) = (options(), None);
        let checkpoint = Path::new("/runs/ck/step-00000004");
        let taken = take(checkpoint, &recorded, &BTreeSet::new(), &mut resumed, &mut tensorboard);
        assert_eq!(resumed.checkpoints.dir.as_deref(), Some(Path::new("/runs/ck")), "where the checkpoint lies");
        assert_eq!((resumed.checkpoints.every, resumed.checkpoints.keep), (2, 3));
        assert_eq!(resumed.val_data, Some(here.join("val.bin")));
        assert_eq!((resumed.eval_every, resumed.eval_batches), (5, 7));
        assert_eq!(resumed.metrics, Some(here.join("m.jsonl")));
        assert_eq!(resumed.save, Some(here.join("out")));
        assert_eq!((resumed.save_dtype, resumed.sample_tokens, tensorboard), (Some(SaveDtype::Bf16), 0, None));
        assert_eq!(taken.len(), 10, "{taken:?}");

        // A flag given wins, even where it is the default; a checkpoint under another name keeps no root.
        let explicit: BTreeSet<String> = ["checkpoint-every", "metrics", "sample-tokens"].map(String::from).into();
        let (mut resumed, mut tensorboard) = (options(), None);
        resumed.checkpoints.dir = Some("elsewhere".into());
        take(Path::new("/runs/ck/step-00000004"), &recorded, &explicit, &mut resumed, &mut tensorboard);
        assert_eq!(resumed.checkpoints.dir.as_deref(), Some(Path::new("/runs/ck")), "--checkpoint-dir not among the given");
        assert_eq!((resumed.checkpoints.every, resumed.checkpoints.keep, resumed.metrics, resumed.sample_tokens), (0, 3, None, 300));
        let (mut resumed, mut tensorboard) = (options(), None);
        take(Path::new("/copies/best"), &recorded, &BTreeSet::new(), &mut resumed, &mut tensorboard);
        assert_eq!(resumed.checkpoints.dir, None);
        assert_eq!(resumed.checkpoints.every, 0, "no cadence without a directory");
    }

    #[test]
    fn an_older_checkpoint_without_a_record_takes_only_its_root() {
        let (mut resumed, mut tensorboard) = (options(), None);
        let taken = take(Path::new("step-00000002"), &Flags::new(), &BTreeSet::new(), &mut resumed, &mut tensorboard);
        assert_eq!(taken, ["--checkpoint-dir ."]);
        assert_eq!(resumed.metrics, None);
    }
}
