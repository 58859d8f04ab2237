//! The step loop of `zerostream train`: validation on its cadence, one step at a time with metrics and
//! progress, checkpoints on their cadence and on a stop, and the stop itself (a signal, agreed by every
//! rank) or a run of skipped steps.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use zerostream_checkpoints::TokenFile;
use zerostream_checkpoints::checkpoint::CheckpointRoot;

use super::RunOptions;
use crate::device::Backend;
use crate::train::checkpoint::RunRecord;
use crate::train::metrics_file;
use crate::train::trace::Trace;
use crate::train::{StepReport, Trainer};

/// What the step loop did.
pub(super) struct StepsOutcome {
    pub(super) reports: Vec<StepReport>,
    /// Every row went to the metrics file (a regular file), so it can be plotted.
    #[cfg_attr(not(feature = "plot"), allow(dead_code))]
    pub(super) metrics_written: bool,
    pub(super) stopped_at: Option<u64>,
    pub(super) checkpoint: Option<PathBuf>,
    /// The validation loss of the weights the loop left (with `--val-data`).
    pub(super) final_val_loss: Option<f64>,
}

/// Consecutive steps skipped for non-finite gradients after which a run stops: a few without a loss
/// scale (nothing will change), more with one (fp16, f16 matmul inputs), which halves each time until
/// it fits.
fn skip_limit(loss_scaled: bool) -> u64 {
    if loss_scaled { 24 } else { 3 }
}

/// Runs the steps from the trainer's current step to `--steps`, with metrics, progress, checkpoints
/// and a clean stop when asked.
#[allow(clippy::too_many_arguments)]
pub(super) fn train_steps<D: Backend>(
    trainer: &mut Trainer<'_, D>,
    tokens: &TokenFile,
    validation: Option<(&TokenFile, usize)>,
    options: &RunOptions,
    root: Option<&CheckpointRoot>,
    record: &RunRecord,
    predicted_step_s: Option<f64>,
    say: &dyn Fn(String),
) -> Result<StepsOutcome> {
    let lead = trainer.sharding.rank == 0;
    let steps = trainer.train.steps;
    let first_step = trainer.step;
    let mut sinks = StepSinks::open(options, lead, first_step, steps)?;
    trainer.set_trace(sinks.trace.clone());
    let regular = options.metrics.as_deref().is_some_and(metrics_file::is_regular_file);
    let mut out = StepsOutcome {
        reports: Vec::new(),
        metrics_written: sinks.metrics.is_some() && regular,
        stopped_at: None,
        checkpoint: None,
        final_val_loss: None,
    };
    let mut skipped_in_a_row = 0;
    while trainer.step < steps {
        // Validation of the weights this step starts from, so step 0's is the initial model's.
        let val_loss = match validation {
            Some((v, batches)) if options.eval_every > 0 && trainer.step.is_multiple_of(options.eval_every) => {
                Some(trainer.validation_loss(v, batches)?)
            }
            _ => None,
        };
        let mut r = trainer.train_step(tokens)?;
        r.val_loss = val_loss;
        r.predicted_step_s = predicted_step_s;
        sinks.record(&r, trainer.scaler.scale);
        skipped_in_a_row = if r.applied { 0 } else { skipped_in_a_row + 1 };
        let (loss, step) = (r.loss, r.step);
        out.reports.push(r);
        if skipped_in_a_row >= skip_limit(trainer.train.loss_scaled()) {
            sinks.bar.finish();
            let f16_inputs = trainer.train.matmul_inputs == crate::device::MatmulInputs::F16;
            return Err(diverged(step + 1 - skipped_in_a_row..=step, loss, f16_inputs, out.checkpoint.as_deref()));
        }
        let asked = options.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed));
        let stop = trainer.agree_any(asked)?;
        let cadence = options.checkpoints.every > 0 && trainer.step.is_multiple_of(options.checkpoints.every);
        if let Some(dir) = &options.checkpoints.dir
            && (cadence || stop || trainer.step == steps)
        {
            let path = trainer.save_checkpoint(dir, root, record, loss)?;
            if sinks.bar.is_hidden() {
                say(format!("checkpoint: {}", path.display()))
            } else {
                sinks.bar.println(format!("checkpoint: {}", path.display()))
            }
            out.checkpoint = Some(path);
        }
        if stop && trainer.step < steps {
            out.stopped_at = Some(trainer.step);
            break;
        }
    }
    sinks.bar.finish();
    // The weights the steps left, validated and recorded like a step's start: the row of step N holds
    // the validation of the weights step N starts from. Not on a stop: the resumed run validates at its end.
    if let (Some((v, batches)), None) = (validation, out.stopped_at) {
        let loss = super::data::final_validation(trainer, v, batches, say)?;
        sinks.record_validation(trainer.step, loss);
        out.final_val_loss = Some(loss);
    }
    trainer.set_trace(None);
    if let Some(Err(e)) = sinks.trace.take().map(|t| t.finish()) {
        // Like the metrics: a record of the run, whose failure stops the record only; said under
        // --quiet too, as every warning is.
        sinks.bar.println(format!("warning: {e:#}"));
    }
    Ok(out)
}

/// Where each step's report goes on the lead rank: the metrics file and TensorBoard (one row for both,
/// so they always agree), the progress bar and the log lines; and the `--trace` file the trainer
/// writes its spans to.
struct StepSinks {
    metrics: Option<std::io::BufWriter<std::fs::File>>,
    trace: Option<Arc<Trace>>,
    tensorboard: crate::train::tensorboard::Sink,
    bar: crate::progress::Progress,
    lines: bool,
    steps: u64,
}

impl StepSinks {
    fn open(options: &RunOptions, lead: bool, first_step: u64, steps: u64) -> Result<Self> {
        let metrics = match &options.metrics {
            Some(path) if lead => Some(open_metrics(path, first_step)?),
            _ => None,
        };
        let trace = match &options.trace {
            Some(path) if lead => Some(Arc::new(open_trace(path)?)),
            _ => None,
        };
        let tensorboard = crate::train::tensorboard::Sink::open(options.tensorboard.as_ref().filter(|_| lead), first_step)?;
        let bar = crate::progress::Progress::new(steps, first_step, options.progress && lead);
        Ok(StepSinks { metrics, trace, tensorboard, bar, lines: options.progress && lead, steps })
    }

    fn record(&mut self, r: &StepReport, loss_scale: f32) {
        self.write_row(r.step, &r.to_json());
        self.bar.step(progress_message(r, loss_scale));
        // Beside a bar on a terminal, a line every 25 steps; with no bar (a log file, a pipe), a line a step.
        let line_due = self.bar.is_hidden() || r.step.is_multiple_of(25) || r.step + 1 == self.steps || r.val_loss.is_some();
        if self.lines && line_due {
            self.bar.println(step_line(r));
        }
    }

    /// `row` (of step `step`) into the metrics file and TensorBoard.
    fn write_row(&mut self, step: u64, row: &serde_json::Value) {
        if let Some(warning) = self.tensorboard.write_step(step, row) {
            self.bar.println(warning);
        }
        if let Some(m) = self.metrics.as_mut()
            && let Err(e) = writeln!(m, "{row}").and_then(|()| m.flush())
        {
            // The metrics are a record of the training, not the training: a full disk there stops
            // the record, not the run (its checkpoints go on, or fail on their own).
            self.bar.println(format!("warning: writing --metrics failed at step {step} ({e}); training continues without metrics"));
            self.metrics = None;
        }
    }

    /// The validation after the last step, as a row of its own: the step the weights would start, no
    /// training fields (`final_validation`: true).
    fn record_validation(&mut self, step: u64, loss: f64) {
        let row = serde_json::json!({ "step": step, "val_loss": loss, "val_perplexity": loss.exp(), "final_validation": true });
        self.write_row(step, &row);
    }
}

/// The metrics file: new, or — when resuming at `first_step` — the earlier rows kept and the new
/// ones appended.
fn open_metrics(path: &Path, first_step: u64) -> Result<std::io::BufWriter<std::fs::File>> {
    zerostream_checkpoints::checkpoint::create_parent_dir("--metrics", path)?;
    let file = if first_step > 0 {
        // Rows past the checkpoint are a stopped run's (or, resumed from an older step, a later line's).
        let dropped = metrics_file::keep_rows_before(path, first_step)
            .with_context(|| format!("--metrics {}: keeping the rows before step {first_step}", path.display()))?;
        if dropped > 0 {
            eprintln!(
                "note: --metrics {}: the {} from step {first_step} on left out, the resumed run's follow from there",
                path.display(),
                crate::words::counted(dropped, "row")
            );
        } else if !path.exists() {
            eprintln!("note: --metrics {} is not there: its rows start again at step {first_step}", path.display());
        }
        std::fs::OpenOptions::new().create(true).append(true).open(path)
    } else {
        // The command line names the file to write, as --save names the model it replaces; still,
        // an earlier run's rows going is said (under --quiet too).
        let rows = metrics_file::count_rows(path)?;
        if rows > 0 {
            eprintln!(
                "note: --metrics {}: replacing the {} an earlier run wrote there",
                path.display(),
                crate::words::counted(rows, "row")
            );
        }
        std::fs::File::create(path)
    };
    Ok(std::io::BufWriter::new(file.with_context(|| format!("opening --metrics {}", path.display()))?))
}

/// A step's line in the log: loss, gradient norm, learning rate, speed and any validation loss.
fn step_line(r: &StepReport) -> String {
    let val = r.val_loss.map_or(String::new(), |v| format!(", validation loss {v:.4} (perplexity {:.1})", v.exp()));
    format!("step {:>5}: loss {:.4}, grad norm {:.3}, lr {:.2e}, {:.0} tok/s{val}", r.step, r.loss, r.grad_norm, r.lr, r.tokens_per_s())
}

/// The error that stops a run whose `steps` were all skipped for non-finite gradients.
fn diverged(steps: std::ops::RangeInclusive<u64>, loss: f64, f16_inputs: bool, checkpoint: Option<&Path>) -> anyhow::Error {
    anyhow::anyhow!(
        "steps {} to {} were all skipped: the gradients held non-finite values (loss {loss}); the model or the learning rate has \
         diverged{}{}",
        steps.start(),
        steps.end(),
        // f16 inputs: a forward value past 65504 is infinity, which no loss scale undoes.
        if f16_inputs && !loss.is_finite() {
            ", or a matmul input passed f16's range (65504) under --matmul-inputs f16 (try f32)"
        } else {
            ""
        },
        checkpoint.map(|p| format!("; the last checkpoint is {}", p.display())).unwrap_or_default()
    )
}

/// `--trace`'s file, its folder made where missing.
fn open_trace(path: &Path) -> Result<Trace> {
    zerostream_checkpoints::checkpoint::create_parent_dir("--trace", path)?;
    Trace::create(path)
}

fn progress_message(r: &StepReport, scale: f32) -> String {
    format!(
        "loss {:.4} | {:.0} tok/s | compute {:.0}% upload {:.0}% download {:.0}% update-wait {:.0}% io {:.0}%{}",
        r.loss,
        r.tokens_per_s(),
        100.0 * r.compute_s / r.seconds,
        100.0 * r.upload_s / r.seconds,
        100.0 * r.download_s / r.seconds,
        100.0 * r.update_wait_s / r.seconds,
        100.0 * r.io_wait_s / r.seconds,
        if r.applied { String::new() } else { format!(" | overflow: skipped, loss scale {scale}") }
    )
}
