//! `zerostream eval`: the mean loss of a model over the first N micro-batches of a token file, with the
//! model streamed block by block as in training, and its vocabulary matrices never whole on the device
//! or in host memory: the embedding's rows of each micro-batch and the output projection a vocabulary
//! chunk at a time are read from the model's files (the same sums as a resident head, bit for bit).

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::{HfModel, TokenFile, TokenWidth};

use crate::device::{AnyDevice, Backend};
use crate::model::Model;
use crate::model::vocab::{self, DEFAULT_CHUNK_ROWS, Rows};
use crate::train::layout::{GroupLayout, TensorSlot, group_layouts};

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

/// Which tokens an evaluation reads, in which micro-batches, and whether it shows its progress.
#[derive(Clone, Debug)]
pub struct EvalData<'a> {
    /// The token file (llm.c's formats, or raw tokens of `dtype`).
    pub path: &'a Path,
    pub dtype: TokenWidth,
    /// B: sequences per micro-batch.
    pub batch: usize,
    /// T: tokens per sequence.
    pub seq_len: usize,
    /// Micro-batches 0..batches of the training contract's order (at most as many as the file holds).
    pub batches: usize,
    /// A progress line per micro-batch on stderr (rewritten in place on a terminal).
    pub progress: bool,
}

/// The micro-batches of B x T tokens `tokens` (the file of flag `what`) holds, or its refusal, by flag,
/// where it holds none.
pub fn holds_a_micro_batch(tokens: &TokenFile, what: &str, batch: usize, seq_len: usize) -> Result<usize> {
    let held = tokens.micro_batches(batch, seq_len);
    if held == 0 {
        bail!(
            "{what} {}: {} tokens, fewer than one micro-batch of --batch-size {batch} x --seq-len {seq_len} + 1 = {} tokens",
            tokens.path.display(),
            tokens.len,
            batch.saturating_mul(seq_len).saturating_add(1)
        );
    }
    Ok(held)
}

/// How many micro-batches of B x T an evaluation asked for `asked` (by `flag`) reads from `tokens`
/// (`what`, named in the refusal): all the file holds where that is fewer, said through `say` (past them
/// the first ones would be read again and weigh twice). A file without one is refused. `eval` and
/// `train`'s validation both count with it, so they read the same micro-batches.
pub fn micro_batches_to_read(
    tokens: &TokenFile,
    what: &str,
    batch: usize,
    seq_len: usize,
    asked: usize,
    flag: &str,
    say: &dyn Fn(String),
) -> Result<usize> {
    if asked == 0 {
        bail!("{flag} must be at least 1");
    }
    let held = holds_a_micro_batch(tokens, what, batch, seq_len)?;
    if asked > held {
        say(format!(
            "{} holds {held} micro-batches of B x T tokens, fewer than {flag} {asked}: reading those {held}",
            tokens.path.display()
        ));
    }
    Ok(asked.min(held))
}

/// Mean of the micro-batch losses of micro-batches 0..batches (the training contract's order; each of
/// the file's micro-batches once where it holds fewer, as `train`'s validation reads them), with
/// the model streamed: one block slot refilled block by block from the model's files, two residual
/// buffers, the head's small tensors resident, and its (V, C) matrices read from the files as needed
/// (the embedding's rows of the micro-batch's tokens; the projection one vocabulary chunk at a time
/// into one chunk-sized slot). Host memory holds one block tensor or one chunk at a time, whatever the
/// model's size.
pub fn evaluate<D: Backend>(dev: &D, model_dir: &Path, eval: &EvalData<'_>) -> Result<EvalReport> {
    let EvalData { path: data, dtype: data_dtype, batch, seq_len, batches, progress } = *eval;
    crate::words::require_positive(&[("--batch-size", batch), ("--seq-len", seq_len), ("--batches", batches)])?;
    let hf = HfModel::open(model_dir)?;
    let model = Model::of_hf(&hf)?;
    if let Some(warning) = model.unused_tensors_warning(&hf) {
        eprintln!("{warning}");
    }
    let tokens = TokenFile::open_with(data, data_dtype)?;
    tokens.check_vocab(model.vocab_size())?;
    if let Some(prepared) = zerostream_checkpoints::DataTokenizer::read_beside(data)? {
        let what = format!("--data {} ({})", data.display(), zerostream_checkpoints::DataTokenizer::sidecar(data).display());
        prepared.check_fits_model(model_dir, &what)?;
    }
    model.check_seq_len(seq_len).with_context(|| model_dir.display().to_string())?;
    dev.check_attention(model.attention_dims(batch, seq_len))?;
    let say = |line: String| eprintln!("eval: {line}");
    let batches = micro_batches_to_read(&tokens, "--data", batch, seq_len, batches, "--batches", &say)?;
    let groups = group_layouts(&model);
    // Fills `slot` with block group `g`'s parameters, read one tensor at a time.
    let fill = |g: &GroupLayout, slot: &[D::Tensor]| -> Result<()> {
        for (t, x) in g.tensors.iter().zip(slot) {
            dev.write(x, &hf.tensor(&t.name, &t.shape)?);
        }
        Ok(())
    };
    let (embedding, projection) = model.vocab_tensors();
    let (embedding, projection) = (&groups[0].tensors[embedding], &groups[0].tensors[projection]);
    let head = head_but_vocabulary(dev, &hf, &groups[0], &[&embedding.name, &projection.name])?;
    let slot: Vec<D::Tensor> = groups[1].tensors.iter().map(|t| dev.alloc(t.len, &format!("slot {}", t.name))).collect::<Result<_>>()?;
    let (bt, width) = (batch * seq_len, model.width());
    let chunks = model.vocab_chunks(DEFAULT_CHUNK_ROWS);
    let (acts, head_acts) = (model.block_acts(dev, batch, seq_len)?, model.head_acts_with(dev, batch, seq_len, chunks, false)?);
    let vocab_slot = dev.alloc(chunks.rows_per_chunk * width, "vocabulary chunk")?;
    let embed_rows = dev.alloc(bt * width, "embedding rows")?;
    let positions = dev.tokens(&(0..bt as u32).collect::<Vec<u32>>())?;
    let residual = [dev.alloc(bt * width, "residual A")?, dev.alloc(bt * width, "residual B")?];
    let (loss_acts, h) = (model.loss_acts(&head_acts), model.final_hidden(&head_acts));
    let start = Instant::now();
    let mut sum = 0.0f64;
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    for g in 0..batches {
        let (x_ids, y_ids) = tokens.micro_batch(g, batch, seq_len)?;
        let y = dev.tokens(&y_ids)?;
        dev.write(&embed_rows, &embedding_rows(&hf, embedding, &x_ids)?);
        model.embed_rows_forward(dev, &residual[0], &embed_rows, &head, &head_acts, &positions, seq_len, None);
        for l in 0..model.n_layer() {
            fill(&groups[1 + l], &slot)?;
            model.block_forward(dev, l, &slot, &acts, &residual[l % 2], &residual[(l + 1) % 2], batch, seq_len, None);
        }
        model.final_norm_forward(dev, &head, &head_acts, &residual[model.n_layer() % 2]);
        for j in 0..chunks.count() {
            let ids = chunks.range(j);
            dev.write(&vocab_slot, &hf.tensor_rows(&projection.name, &projection.shape, ids)?);
            vocab::forward_chunk(dev, loss_acts, h, Rows::Chunk(&vocab_slot), &y, j, width);
        }
        sum += vocab::finish_loss(dev, loss_acts) as f64;
        if batches > 1 && progress {
            // On a terminal one line rewritten in place; elsewhere (a log file) one line per update.
            if terminal {
                eprint!("\reval: micro-batch {}/{batches}", g + 1);
            } else {
                eprintln!("eval: micro-batch {}/{batches}", g + 1);
            }
        }
    }
    if batches > 1 && progress && terminal {
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

/// The head group on the device but for its vocabulary matrices `vocab` (empty tensors in their
/// places), read from the model's files.
fn head_but_vocabulary<D: Backend>(dev: &D, hf: &HfModel, head: &GroupLayout, vocab: &[&str]) -> Result<Vec<D::Tensor>> {
    head.tensors
        .iter()
        .map(|t| {
            if vocab.contains(&t.name.as_str()) {
                return dev.alloc(0, &t.name);
            }
            let x = dev.alloc(t.len, &t.name)?;
            dev.write(&x, &hf.tensor(&t.name, &t.shape)?);
            Ok(x)
        })
        .collect()
}

/// The embedding's rows of `ids`, one after another, each read alone from the model's files.
fn embedding_rows(hf: &HfModel, embedding: &TensorSlot, ids: &[u32]) -> Result<Vec<f32>> {
    let mut rows = Vec::with_capacity(ids.len() * embedding.shape.get(1).copied().unwrap_or(1));
    for &id in ids {
        let id = id as usize;
        rows.extend(hf.tensor_rows(&embedding.name, &embedding.shape, id..id + 1)?);
    }
    Ok(rows)
}

/// [`evaluate`] on whichever device was opened.
pub fn evaluate_on(dev: &AnyDevice, model_dir: &Path, eval: &EvalData<'_>) -> Result<EvalReport> {
    match dev {
        AnyDevice::Cpu(d) => evaluate(d, model_dir, eval),
        AnyDevice::Gpu(d) => evaluate(d, model_dir, eval),
    }
}
