//! `zerostream eval`: the mean loss of a model over the first N micro-batches of a token file, with the
//! model streamed block by block as in training.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::{HfModel, TokenFile, TokenWidth};

use crate::device::{AnyDevice, Backend};
use crate::model::Model;
use crate::train::layout::{GroupLayout, group_layouts};

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

/// Mean of the micro-batch losses of micro-batches 0..batches (the training contract's order), with
/// the model streamed: the head resident, one block slot refilled block by block from the model's
/// files, two residual buffers. Host memory holds one tensor at a time, whatever the model's size.
pub fn evaluate<D: Backend>(
    dev: &D,
    model_dir: &Path,
    data: &Path,
    data_dtype: TokenWidth,
    batch: usize,
    seq_len: usize,
    batches: usize,
) -> Result<EvalReport> {
    if batch == 0 || seq_len == 0 || batches == 0 {
        bail!("--batch-size, --seq-len and --batches must be positive");
    }
    let hf = HfModel::open(model_dir)?;
    let model = Model::of_hf(&hf)?;
    let tokens = TokenFile::open_with(data, data_dtype)?;
    tokens.check_vocab(model.vocab_size())?;
    model.check_seq_len(seq_len).with_context(|| model_dir.display().to_string())?;
    dev.check_attention(model.attention_dims(batch, seq_len))?;
    let groups = group_layouts(&model);
    // Fills `into` (or new tensors) with group `g`'s parameters, read one tensor at a time.
    let fill = |g: &GroupLayout, into: Option<&[D::Tensor]>| -> Result<Vec<D::Tensor>> {
        let mut made = Vec::new();
        for (i, t) in g.tensors.iter().enumerate() {
            let values = hf.tensor(&t.name, &t.shape).with_context(|| format!("loading {}", model_dir.display()))?;
            match into {
                Some(slot) => dev.write(&slot[i], &values),
                None => {
                    let x = dev.alloc(t.len, &t.name)?;
                    dev.write(&x, &values);
                    made.push(x);
                }
            }
        }
        Ok(made)
    };
    let head = fill(&groups[0], None)?;
    let slot: Vec<D::Tensor> = groups[1].tensors.iter().map(|t| dev.alloc(t.len, &format!("slot {}", t.name))).collect::<Result<_>>()?;
    let (acts, head_acts) = (model.block_acts(dev, batch, seq_len)?, model.head_acts(dev, batch, seq_len)?);
    let bt = batch * seq_len;
    let residual = [dev.alloc(bt * model.width(), "residual A")?, dev.alloc(bt * model.width(), "residual B")?];
    let start = Instant::now();
    let mut sum = 0.0f64;
    for g in 0..batches {
        let (x, y) = tokens.micro_batch(g, batch, seq_len)?;
        let (x, y) = (dev.tokens(&x)?, dev.tokens(&y)?);
        model.embed_forward(dev, &residual[0], &head, &head_acts, &x, seq_len, None);
        for l in 0..model.n_layer() {
            fill(&groups[1 + l], Some(&slot))?;
            model.block_forward(dev, l, &slot, &acts, &residual[l % 2], &residual[(l + 1) % 2], batch, seq_len, None);
        }
        sum += model.head_forward(dev, &head, &head_acts, &residual[model.n_layer() % 2], &y, None) as f64;
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
pub fn evaluate_on(
    dev: &AnyDevice,
    model_dir: &Path,
    data: &Path,
    data_dtype: TokenWidth,
    batch: usize,
    seq_len: usize,
    batches: usize,
) -> Result<EvalReport> {
    match dev {
        AnyDevice::Cpu(d) => evaluate(d, model_dir, data, data_dtype, batch, seq_len, batches),
        AnyDevice::Gpu(d) => evaluate(d, model_dir, data, data_dtype, batch, seq_len, batches),
    }
}
