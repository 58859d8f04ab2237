//! `zerostream train` as a library call: resolve the model and data, print the resolved configuration,
//! run the steps with a progress bar and a metrics file, checkpoint, stop cleanly on a signal, save,
//! summarise, and sample some text.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::{DataTokenizer, HfModel, TextTokenizer, TokenFile, TokenWidth, Tokenizer};

use super::checkpoint::{Checkpoint, RunRecord, SaveDtype};
use super::summary::{Traffic, summarise, what_it_did};
use super::{ModelSource, StepReport, TrainConfig, Trainer};
use crate::comm::Comm;
use crate::device::{AnyDevice, Backend};
use crate::model::Model;

use super::demo::Demo;
pub use super::demo::TEXT as DEMO_TEXT;

mod agree;
mod data;
pub mod kept_outputs;
mod record;
mod steps;
use data::{eval_batches, open_data};
use record::{checkpoint_root, run_record};
use steps::train_steps;

/// `path` from the root, as a checkpoint records its data and outputs: a resume from another folder
/// finds them (and never a file of the same name there).
fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Where the weights come from.
pub enum ModelChoice {
    /// A Hugging Face directory.
    Hf(PathBuf),
    /// A preset name or a config.json path, randomly initialised.
    Config(String),
    /// The built-in demo model.
    Demo,
    /// A checkpoint (`step-NNNNNNNN/`) to resume: weights, optimizer state and counters.
    Resume(PathBuf),
}

/// Checkpointing: where, how often, how many to keep.
#[derive(Clone, Debug, Default)]
pub struct CheckpointOptions {
    /// The root holding `step-NNNNNNNN/` directories (None: no checkpoints).
    pub dir: Option<PathBuf>,
    /// Every this many steps (0: only at the end and when stopped by a signal).
    pub every: u64,
    /// Checkpoints to keep, the newest (0: all).
    pub keep: usize,
}

/// What to do besides the steps themselves.
pub struct RunOptions {
    pub model: ModelChoice,
    /// None: the built-in run's text ([`Demo`]), in words, its last scenes the validation data.
    pub data: Option<PathBuf>,
    /// Token width of a raw (headerless) --data file.
    pub data_dtype: TokenWidth,
    /// Held-out tokens for the validation loss (same width rule as --data).
    pub val_data: Option<PathBuf>,
    /// Validation before every step that is a multiple of this (0: only at the end).
    pub eval_every: u64,
    /// Micro-batches of --val-data per validation (at most as many as it holds).
    pub eval_batches: usize,
    pub metrics: Option<PathBuf>,
    /// A timeline of rank 0's steps in the Chrome trace format ([`super::trace`]).
    pub trace: Option<PathBuf>,
    /// TensorBoard event files with the metrics' numbers and the configuration (rank 0 writes).
    pub tensorboard: Option<super::tensorboard::TensorBoard>,
    pub save: Option<PathBuf>,
    /// The saved model's dtype (None: the working precision).
    pub save_dtype: Option<SaveDtype>,
    pub checkpoints: CheckpointOptions,
    /// The tokenizer the data was prepared with, written into every saved model directory and
    /// checkpoint. None: the record `zerostream prepare` left beside --data (`NAME.tokenizer`), or
    /// the word tokenizer of the built-in text; with neither, no tokenizer files are written.
    pub tokenizer: Option<DataTokenizer>,
    /// Checked after each step: once set (the command line's SIGINT/SIGTERM handler does, or another
    /// thread), the run finishes the step, checkpoints and stops, without `--save` or the sample.
    pub stop: Option<Arc<AtomicBool>>,
    pub sample_tokens: usize,
    pub prompt: String,
    /// Progress bar and summaries on stderr (off in tests).
    pub progress: bool,
}

impl RunOptions {
    /// `model` with the command line's defaults: the built-in text, no files written, a
    /// 300-token sample after "HAMLET", progress on stderr.
    pub fn new(model: ModelChoice) -> Self {
        RunOptions {
            model,
            data: None,
            data_dtype: TokenWidth::U16,
            val_data: None,
            eval_every: 0,
            eval_batches: 4,
            metrics: None,
            trace: None,
            tensorboard: None,
            save: None,
            save_dtype: None,
            checkpoints: CheckpointOptions::default(),
            tokenizer: None,
            stop: None,
            sample_tokens: 300,
            prompt: "HAMLET\n".into(),
            progress: true,
        }
    }
}

/// What a run did.
pub struct RunSummary {
    pub steps: Vec<StepReport>,
    pub seconds: f64,
    pub sample: Option<String>,
    /// Stopped by a signal before the last step (the step it stopped after, counted from the start).
    pub stopped_at: Option<u64>,
    /// The last checkpoint written, if any.
    pub checkpoint: Option<PathBuf>,
    /// The validation loss of the final weights (with --val-data).
    pub val_loss: Option<f64>,
}

/// The model a choice names, without loading weights (for `zerostream plan`).
pub fn model_config(choice: &ModelChoice) -> Result<Model> {
    match choice {
        ModelChoice::Hf(dir) => Model::from_config_file(&dir.join("config.json")),
        ModelChoice::Config(spec) => resolve_config(spec),
        ModelChoice::Demo => Ok(Demo::get()?.model()),
        ModelChoice::Resume(dir) => {
            let state = super::resume::read_state(dir)?;
            Model::from_hf_json(&state.model).with_context(|| format!("{}: the model configuration", dir.display()))
        }
    }
}

fn resolve_config(spec: &str) -> Result<Model> {
    if let Some(model) = Model::preset(spec) {
        return Ok(model);
    }
    let path = std::path::Path::new(spec);
    if !path.exists() {
        bail!("--config {spec:?}: not a preset ({}) and no such file", Model::PRESETS);
    }
    Model::from_config_file(path)
}

/// Runs `zerostream train` on one rank, on whichever device was opened, with `train` as given: the
/// hyper-parameters are checked ([`TrainConfig::check`]) and `--save` must name a model directory or a
/// new one, but a `ModelChoice::Resume` trains `train`'s settings, not the checkpoint's, and no other
/// output is checked against the inputs. [`super::launch::launch`] is the whole walk the command
/// line takes: the checkpoint's settings and outputs merged in, every output checked, the RAM and the
/// disks sized, the ranks started.
pub fn run_on(dev: &AnyDevice, options: &RunOptions, train: TrainConfig) -> Result<RunSummary> {
    run_rank_on(dev, options, train, Comm::single())
}

/// This rank's part of `zerostream train` (see [`run`]), on whichever device was opened.
pub fn run_rank_on(dev: &AnyDevice, options: &RunOptions, train: TrainConfig, comm: Comm) -> Result<RunSummary> {
    match dev {
        AnyDevice::Cpu(d) => run(d, options, train, comm),
        AnyDevice::Gpu(d) => run(d, options, train, comm),
    }
}

/// This rank's part of `zerostream train`. Every rank trains; rank 0 alone prints, writes the metrics,
/// checkpoints' shared files, saves the model and samples.
pub fn run<D: Backend>(dev: &D, options: &RunOptions, train: TrainConfig, comm: Comm) -> Result<RunSummary> {
    let lead = comm.rank() == 0;
    let world = comm.world_size();
    // Here too, not only in `launch`: a library caller's --save reaches the run directly, and saving
    // replaces the whole directory.
    if let Some(save) = options.save.as_ref().filter(|_| lead) {
        super::save_dir::check_save_dir(save)?;
    }
    // Held only until the trainer has its state: their files stay mapped while they live, and a
    // mapped file cannot be removed on Windows (pruning the checkpoint resumed from would fail).
    let (mut hf, mut resumed) = (None, None::<Checkpoint>);
    let source = match &options.model {
        ModelChoice::Hf(dir) => {
            let hf = hf.insert(HfModel::open(dir)?);
            if let Some(warning) = Model::of_hf(hf)?.unused_tensors_warning(hf).filter(|_| lead) {
                eprintln!("{warning}");
            }
            ModelSource::Hf(hf)
        }
        ModelChoice::Config(spec) => ModelSource::Random { model: resolve_config(spec)?, seed: train.seed },
        ModelChoice::Demo => ModelSource::Random { model: Demo::get()?.model(), seed: train.seed },
        ModelChoice::Resume(dir) => ModelSource::Checkpoint(resumed.insert(Checkpoint::open(dir)?)),
    };
    let model = source.trained_model(&train)?;
    let (tokens, validation) = open_data(options, &train, &model, &source)?;
    agree::check_ranks_agree(&comm, options, &tokens, validation.as_ref())?;
    // Before anything is said or written: a gpu adapter without the f16 cooperative matrices refuses
    // `--matmul-inputs f16` here, naming itself (the trainer sets it again, for library callers).
    dev.set_matmul_inputs(train.matmul_inputs)?;
    dev.set_copy_queue(train.copy_queue)?;
    let say = |line: String| {
        if options.progress && lead {
            eprintln!("{line}");
        }
    };
    describe_run(&say, options, &train, &model, &tokens, dev, &comm);
    // The held-out tokens with the micro-batches each validation reads.
    let validation = validation.as_ref().map(|v| Ok::<_, anyhow::Error>((v, eval_batches(v, options, &train, &say)?))).transpose()?;
    let root = checkpoint_root(&say, options, lead)?;
    let record = run_record(options, &train, &model, &tokens, world, &say)?;
    announce_nvme_state(&say, &train, &model, world, dev.alloc_costs());
    let mut trainer = Trainer::with_comm(dev, &source, train, comm)?;
    if let ModelSource::Checkpoint(c) = &source {
        say(format!("resumed from {} at step {} (next micro-batch {})", c.dir.display(), c.state.step, c.state.next_micro_batch));
    }
    drop(source);
    drop((hf, resumed));
    say(trainer.placement.describe());
    for note in &trainer.io_notes {
        say(note.clone());
    }
    let predicted_step_s = predict_step(dev, &model, &trainer, &say);
    let start = Instant::now();
    let adam_before_s = trainer.adam_seconds();
    let outcome = train_steps(&mut trainer, &tokens, validation, options, root.as_ref(), &record, predicted_step_s, &say)?;
    trainer.finish()?;
    let adam_total_s = trainer.adam_seconds() - adam_before_s;
    let final_val_loss = outcome.final_val_loss;
    let seconds = start.elapsed().as_secs_f64();
    if lead {
        say_records(options, outcome.metrics_written, &say);
    }
    summarise(&say, &outcome.reports, seconds, adam_total_s, dev.alloc_stats().peak_bytes);
    // A stopped run saves, samples and sums up nothing: its resumed run will.
    let mut sample = None;
    if outcome.stopped_at.is_none() {
        if let Some(dir) = &options.save {
            save_model(&mut trainer, dir, &record, &say)?;
        }
        sample = sample_text(&mut trainer, options, &model, lead, &say)?;
        let traffic = Traffic::of(&outcome.reports, trainer.nvme_traffic());
        let did = what_it_did(&model, &trainer.placement, &outcome.reports, tokens.len, seconds, final_val_loss, &dev.describe(), &traffic);
        for (i, line) in did.into_iter().enumerate() {
            say(if i == 0 { format!("what it did: {line}") } else { line });
        }
    }
    let steps::StepsOutcome { reports, stopped_at, checkpoint, .. } = outcome;
    Ok(RunSummary { steps: reports, seconds, sample, stopped_at, checkpoint, val_loss: final_val_loss })
}

/// The steady step predicted from the rates `plan --measure` kept for this run (said, and returned for
/// the metrics), or a line saying how to get one.
fn predict_step<D: Backend>(dev: &D, model: &Model, trainer: &Trainer<'_, D>, say: &dyn Fn(String)) -> Option<f64> {
    use super::predict::{predict, saved_rates, shares_cores};
    let Some(rates) = saved_rates(&dev.describe(), model, &trainer.train) else {
        say("no step-time prediction: `zerostream plan --measure` with these flags times this machine's links (in about a minute) for train to predict from".into());
        return None;
    };
    let prediction = predict(&rates, &trainer.placement, model, &trainer.train, shares_cores(dev));
    say(prediction.describe(&rates, &trainer.placement));
    Some(prediction.step_s)
}

/// Large models spend minutes writing their initial state to NVMe before the first step: say so.
fn announce_nvme_state(say: &dyn Fn(String), train: &TrainConfig, model: &Model, world: usize, costs: crate::device::AllocCosts) {
    let Some(dirs) = super::config::join_dirs(&train.nvme_dirs) else { return };
    let Ok(placement) = super::plan_on(model, train, world, costs) else { return };
    let nvme_bytes = placement.host_bytes_per_rank().1;
    if nvme_bytes > 0 {
        say(format!(
            "writing the initial state to the NVMe tier: {:.2} GiB per rank in {dirs}{} ...",
            nvme_bytes as f64 / (1u64 << 30) as f64,
            if train.nvme_dirs.len() > 1 { " (striped: an equal share in each)" } else { "" }
        ));
    }
}

/// `--save DIR`: the trained model, in the record's dtype, with the data's tokenizer files and what
/// it keeps from its source.
fn save_model<D: Backend>(trainer: &mut Trainer<'_, D>, dir: &std::path::Path, record: &RunRecord, say: &dyn Fn(String)) -> Result<()> {
    trainer.save_model(dir, record.save_dtype, &record.extras)?;
    let names: Vec<&str> = record.extras.files.iter().map(|(n, _)| n.as_str()).collect();
    let tokenizer = if names.is_empty() { String::new() } else { format!(", {}", names.join(", ")) };
    say(format!("saved {} (config.json, model.safetensors{tokenizer}; {})", dir.display(), record.save_dtype.flag()));
    Ok(())
}

/// `v` as written by hand: 0.002, 1e-8, 1e30 (not 0.00000001 or thirty digits).
fn number(v: f64) -> String {
    if v != 0.0 && !(1e-4..1e6).contains(&v.abs()) { format!("{v:e}") } else { format!("{v}") }
}

/// The loss curves a run draws beside its metrics: `NAME.svg` for `NAME.jsonl`, so two runs' metrics in
/// one folder keep a picture each.
pub fn plot_path(metrics: &std::path::Path) -> PathBuf {
    beside(metrics, "svg")
}

/// `NAME.{extension}` beside the metrics file `NAME.EXT` (its plot, its resolved configuration).
pub(crate) fn beside(metrics: &std::path::Path, extension: &str) -> PathBuf {
    let stem = metrics.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    metrics.with_file_name(format!("{stem}.{extension}"))
}

/// Where the run's records went (the plot drawn from the metrics first, where they were written),
/// as the checkpoints say theirs.
fn say_records(options: &RunOptions, metrics_written: bool, say: &dyn Fn(String)) {
    if metrics_written {
        plot_metrics(options, say);
    }
    if let Some(path) = &options.trace {
        say(format!("trace: {} (open in https://ui.perfetto.dev)", path.display()));
    }
    if let Some(tb) = &options.tensorboard {
        say(format!("tensorboard: {} (tensorboard --logdir {})", tb.dir.display(), tb.dir.display()));
    }
}

/// The curves beside the metrics ([`plot_path`]); a failure to draw them costs the picture, not the run.
fn plot_metrics(options: &RunOptions, say: &dyn Fn(String)) {
    #[cfg(feature = "plot")]
    if let Some(metrics) = options.metrics.as_ref().filter(|m| !super::metrics_file::is_a_stream(m)) {
        let svg = plot_path(metrics);
        match crate::plot::read_metrics(metrics).and_then(|c| crate::plot::plot(&[c], &svg)) {
            Ok(()) => say(format!("plot: {}", svg.display())),
            // A warning, so said under --quiet too (`plot_metrics` runs on the lead rank only).
            Err(e) => eprintln!("warning: no plot ({e:#})"),
        }
    }
    #[cfg(not(feature = "plot"))]
    let _ = (options, say);
}

/// The lines a run starts with: devices, ranks, model, data and the training settings.
fn describe_run<D: Backend>(
    say: &dyn Fn(String),
    options: &RunOptions,
    train: &TrainConfig,
    model: &Model,
    tokens: &TokenFile,
    dev: &D,
    comm: &Comm,
) {
    let world = comm.world_size();
    if world > 1 {
        // Every rank names its device; the rest is rank 0's to say.
        if options.progress {
            eprintln!("rank {}/{world}: device {}", comm.rank(), dev.describe());
        }
        say(format!("ranks: {world} ({}), ZeRO stage {}", comm.describe(), train.zero_stage.number()));
    } else {
        say(format!("device: {}", dev.describe()));
    }
    say(format!("model: {}; data: {} ({} tokens)", model.describe(), tokens.path.display(), tokens.len));
    let flag = |v: &serde_json::Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    let f = train.to_flags();
    say(format!(
        "training: {} x {} of {}x{} tokens{}; lr {} ({}, warmup {}{}), {}, weight decay {}, clip {}, {}{}{}{}{}",
        crate::words::counted(train.steps, "step"),
        crate::words::counted((train.grad_accum * world) as u64, "micro-batch"),
        train.batch,
        train.seq_len,
        if world > 1 { format!(" ({} per rank)", train.grad_accum) } else { String::new() },
        number(train.lr.peak),
        flag(&f["lr-schedule"]),
        train.lr.warmup_steps,
        // A constant schedule never decays to --min-lr.
        if train.lr.schedule == super::LrSchedule::Constant { String::new() } else { format!(", min {}", number(train.lr.min)) },
        match train.optimizer {
            super::Optimizer::Lars => format!("LARS momentum {}, trust coefficient {}", train.momentum, train.trust_coefficient),
            o => format!(
                "{} betas {}/{}, eps {}{}",
                if o == super::Optimizer::Lamb { "LAMB" } else { "AdamW" },
                train.beta1,
                train.beta2,
                number(train.eps),
                match super::variance_frozen_after(train) {
                    Some(step) => format!(" (variance frozen after step {step})"),
                    None => String::new(),
                }
            ),
        },
        train.weight_decay,
        train.grad_clip,
        flag(&f["precision"]),
        if train.matmul_inputs == crate::device::MatmulInputs::F16 { ", matmul inputs rounded to f16" } else { "" },
        if train.loss_scaled() { ", dynamic loss scale" } else { "" },
        if train.adam_state == super::AdamState::Bf16 { ", bf16 AdamW moments (stochastically rounded)" } else { "" },
        if train.recompute { ", recompute" } else { "" }
    ));
    if let Some(dropout) = model.describe_dropout() {
        say(format!("dropout: {dropout} (training steps only; masks keyed by seed {}, step and micro-batch)", train.seed));
    }
    if let Some(dir) = &options.checkpoints.dir {
        let every = options.checkpoints.every;
        say(format!(
            "checkpoints: {} ({}; keep {})",
            dir.display(),
            if every > 0 { format!("every {} and at the end", crate::words::counted(every, "step")) } else { "at the end".into() },
            if options.checkpoints.keep > 0 { options.checkpoints.keep.to_string() } else { "all".into() }
        ));
    }
}

/// The end-of-run sample, streamed from the trainer's state group by group (rank 0 prints it; every rank
/// computes it, taking part in each group's gather).
fn sample_text<D: Backend>(
    trainer: &mut Trainer<'_, D>,
    options: &RunOptions,
    model: &Model,
    lead: bool,
    say: &dyn Fn(String),
) -> Result<Option<String>> {
    if options.sample_tokens == 0 {
        return Ok(None);
    }
    // The data's tokenizer, else the built-in tokenizer of the vocabulary's size.
    // Trained and saved by now: a tokenizer that will not load costs the sample, not the run.
    let recorded = data::run_tokenizer(options)?;
    let tok = match (recorded, Tokenizer::for_vocab(model.vocab_size())) {
        (Some((t, source)), _) => match t.text_tokenizer(std::path::Path::new(&source)) {
            Ok(tok) => tok,
            Err(e) => {
                say(format!("no sample: {e:#}"));
                return Ok(None);
            }
        },
        (None, Some(t)) => TextTokenizer::Builtin(t),
        (None, None) => {
            say(format!("no sample: no known tokenizer has the model's vocab_size {}", model.vocab_size()));
            return Ok(None);
        }
    };
    // Every rank generates the same tokens: the loader's gathers are collectives, called by each rank
    // in the same order. One group at a time is in RAM beside the cpu device's bounded budget.
    let prompt = tok.encode(&options.prompt)?;
    if let Some(w) = model.sliding_window().filter(|&w| prompt.len() > w) {
        say(format!("no sample: the --prompt's {} tokens are more than the model's sliding window of {w}", prompt.len()));
        return Ok(None);
    }
    let seed = trainer.train.seed;
    let mut load = |g: usize| trainer.master_group(g);
    let ids = crate::generate::sample(model, &mut load, &prompt, options.sample_tokens, 0.8, seed)?;
    if !lead {
        return Ok(None);
    }
    if let Some(note) = crate::generate::window_stop_note(model, options.sample_tokens, ids.len()) {
        say(note);
    }
    let text = tok.decode(&[prompt, ids.clone()].concat());
    // The text itself is the run's summary's: `zerostream train` prints it on stdout, under --quiet too.
    say(format!("sample ({}, temperature 0.8) done", crate::words::counted(ids.len() as u64, "token")));
    Ok(Some(text))
}
