//! `zerostream eval`: the mean loss of a model over the first N micro-batches of a token file.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::{HfModel, TokenFile};

use crate::device::{AnyDevice, Backend};
use crate::model::gpt2::Gpt2;

/// What an evaluation measured.
#[derive(Clone, Debug)]
pub struct EvalReport {
    pub loss: f64,
    pub tokens: usize,
    pub batches: usize,
    pub seconds: f64,
    pub peak_device_bytes: u64,
}

impl EvalReport {
    pub fn to_json(&self, device: &str) -> serde_json::Value {
        serde_json::json!({
            "loss": self.loss,
            "tokens": self.tokens,
            "batches": self.batches,
            "tokens_per_s": self.tokens as f64 / self.seconds.max(1e-9),
            "seconds": self.seconds,
            "peak_device_bytes": self.peak_device_bytes,
            "device": device,
        })
    }
}

/// Mean of the micro-batch losses of micro-batches 0..batches (the training contract's order).
pub fn evaluate<D: Backend>(dev: &D, model_dir: &Path, data: &Path, batch: usize, seq_len: usize, batches: usize) -> Result<EvalReport> {
    if batch == 0 || seq_len == 0 || batches == 0 {
        bail!("--batch-size, --seq-len and --batches must be positive");
    }
    let hf = HfModel::open(model_dir)?;
    let tokens = TokenFile::open(data)?;
    tokens.check_vocab(hf.config.vocab_size)?;
    if seq_len > hf.config.n_positions {
        bail!("--seq-len {seq_len} is longer than the model's n_positions {} ({})", hf.config.n_positions, model_dir.display());
    }
    let mut model = Gpt2::from_hf(dev, &hf).with_context(|| format!("loading {}", model_dir.display()))?;
    let start = Instant::now();
    let mut sum = 0.0f64;
    for g in 0..batches {
        let (x, y) = tokens.micro_batch(g, batch, seq_len)?;
        let (x, y) = (dev.tokens(&x)?, dev.tokens(&y)?);
        sum += model.forward(dev, &x, &y, batch, seq_len, None)? as f64;
        if batches > 1 {
            eprint!("\reval: micro-batch {}/{batches}", g + 1);
        }
    }
    if batches > 1 {
        eprintln!();
    }
    if !sum.is_finite() {
        anyhow::bail!("the model's loss on {} is {sum} (not finite): its weights hold NaN or infinite values", data.display());
    }
    Ok(EvalReport {
        loss: sum / batches as f64,
        tokens: batches * batch * seq_len,
        batches,
        seconds: start.elapsed().as_secs_f64(),
        peak_device_bytes: dev.alloc_stats().peak_bytes,
    })
}

/// [`evaluate`] on whichever device was opened.
pub fn evaluate_on(dev: &AnyDevice, model_dir: &Path, data: &Path, batch: usize, seq_len: usize, batches: usize) -> Result<EvalReport> {
    match dev {
        AnyDevice::Cpu(d) => evaluate(d, model_dir, data, batch, seq_len, batches),
        AnyDevice::Gpu(d) => evaluate(d, model_dir, data, batch, seq_len, batches),
    }
}
