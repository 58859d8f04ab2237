//! `--resume` as the launch takes it: the checkpoint's settings and outputs merged into the request,
//! what a run says and checks before going on from it, and a resumed run with nothing left to train.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use zerostream_checkpoints::TokenWidth;

use super::{Launched, RunRequest, check_checkpoint_flags, first_process};
use crate::train::checkpoint::{SaveDtype, TrainerState};
use crate::train::run::kept_outputs::{self, Taken};
use crate::train::run::{ModelChoice, model_config};
use crate::train::{metrics_file, outputs, resume};

/// With `--resume`, the run's settings: the checkpoint's, except the flags given that may change (see
/// [`resume::merge`]); its seed, its outputs (`run::kept_outputs`), and its data unless `--data` is
/// given.
pub(super) fn resume_from_checkpoint(req: &mut RunRequest, world: usize) -> Result<Option<Resumed>> {
    let ModelChoice::Resume(dir) = &req.options.model else { return Ok(None) };
    let dir = dir.clone();
    let state = resume::read_state(&dir)?;
    if let Some((flag, given)) = &req.named_model {
        check_named_model(flag, given, &dir)?;
    }
    req.train = resume::merge(&dir, &state, &req.train, &req.explicit_flags, req.train.seed, world)?;
    let kept = kept_outputs::take(&dir, &state.outputs, &req.explicit_flags, &mut req.options, &mut req.tensorboard);
    check_checkpoint_flags(&req.options)?;
    req.train.seed = state.seed;
    // The built-in text has no path; anything else trained on is a file.
    if req.options.data.is_none() {
        req.options.data = state.settings.get("data").and_then(|d| d.as_str()).map(PathBuf::from);
    }
    if !req.explicit_flags.contains("data-dtype") && state.settings.get("data-dtype").and_then(|d| d.as_str()) == Some("u32") {
        req.options.data_dtype = TokenWidth::U32;
    }
    let finished = resume::is_finished(&state, &req.train);
    Ok(Some(Resumed { dir, state, kept, finished }))
}

/// What [`resume_from_checkpoint`] found: the checkpoint, its state, the outputs taken from it and
/// whether it is at `--steps` already.
pub(super) struct Resumed {
    pub(super) dir: PathBuf,
    pub(super) state: TrainerState,
    kept: Taken,
    pub(super) finished: bool,
}

impl Resumed {
    /// Refuses a `--metrics` file the run would append to that holds another run's rows; returns the
    /// warning to give where it holds rows but not the checkpoint's last step.
    pub(super) fn check(&self, req: &RunRequest) -> Result<Option<String>> {
        match &req.options.metrics {
            Some(metrics) => metrics_file::check_metrics_continue(metrics, &self.dir, &self.state),
            None => Ok(None),
        }
    }

    /// What a run (not `plan`) says before going on from the checkpoint, once nothing refuses it: the
    /// outputs it took or left (said under --quiet too: they decide what is written), the schedule's
    /// change, and [`Self::check`]'s warning.
    pub(super) fn say(&self, req: &RunRequest, metrics_warning: Option<String>) {
        if !first_process() {
            return;
        }
        if !self.finished && !self.kept.taken.is_empty() {
            eprintln!("note: resumed with the run's own {} (give a flag to change it)", self.kept.taken.join(", "));
        }
        if !self.kept.withheld.is_empty() {
            eprintln!(
                "warning: {} is neither the newest checkpoint nor latest of the directory its run checkpointed into, so \
                 this run branches from it and writes none of that run's files ({}): give new paths to write them (the \
                 same paths would trim or replace that run's)",
                self.dir.display(),
                self.kept.withheld.join(", ")
            );
        }
        if !self.kept.missing.is_empty() {
            eprintln!(
                "warning: the checkpoint's run wrote or read {}, whose file or folder is not there now: this run leaves them \
                 out (give them to write or read them)",
                self.kept.missing.join(", ")
            );
        }
        if let Some(note) = resume::schedule_note(&self.state, &req.train).filter(|_| req.options.progress) {
            eprintln!("note: {note}");
        }
        if let Some(warning) = metrics_warning {
            eprintln!("{warning}");
        }
        if !self.finished && req.options.checkpoints.dir.is_none() {
            // A branch (an older or copied checkpoint) has no directory of its own to go on in: a
            // resume that keeps nothing must not go unsaid.
            eprintln!(
                "train: warning: this resumed run writes no checkpoints: {} does not continue its run's checkpoint directory (it \
                 is neither its newest checkpoint nor its latest); give --checkpoint-dir DIR to checkpoint",
                self.dir.display()
            );
        }
    }
}

/// A resumed run trains on the data its checkpoint recorded, unless `--data` says otherwise: refused
/// before any work, naming the checkpoint, where that file is not there (a finished run or `plan`,
/// which read no data, go on without it). Recorded validation data that is not there is left out
/// with a warning (`run::kept_outputs`): the run can go on without it.
pub(super) fn check_recorded_data(req: &RunRequest) -> Result<()> {
    let (ModelChoice::Resume(dir), Some(data)) = (&req.options.model, &req.options.data) else { return Ok(()) };
    if req.explicit_flags.contains("data") || data.exists() {
        return Ok(());
    }
    // Checkpoints before absolute paths recorded the path as typed, from wherever that run started.
    bail!(
        "the checkpoint {} was trained on {}, which is not there{}: give --data",
        dir.display(),
        data.display(),
        if data.is_relative() { " from this folder (the path is the one that run was given)" } else { "" }
    )
}

/// With `--resume`, a `--model` or `--config` given as well must describe the checkpoint's model.
fn check_named_model(flag: &str, given: &ModelChoice, checkpoint: &Path) -> Result<()> {
    let ours = model_config(&ModelChoice::Resume(checkpoint.to_path_buf()))?;
    let theirs = model_config(given)?;
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

/// A resumed run whose checkpoint is at `--steps` already (a preemption loop re-running its command
/// after the last save, say): nothing to train, so it ends at once with success, after writing
/// `--save` from the checkpoint's model if that is asked for and missing (rank 0 only under mpirun).
pub(super) fn finished_run(dir: &Path, step: u64, steps: u64, save: Option<&Path>, dtype: Option<SaveDtype>) -> Result<Launched> {
    eprintln!(
        "train: the checkpoint {} is at step {step} and --steps is {steps} (counted from the start of training): nothing left to train",
        dir.display()
    );
    if let Some(save) = save.filter(|_| first_process()) {
        outputs::save_finished_model(dir, save, dtype)?;
    }
    Ok(Launched::AlreadyDone)
}
