//! The tokens a run reads: the training data and the validation data (with how many of its
//! micro-batches each validation reads, and the final one), and the tokenizer saved models carry.

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::{DataTokenizer, TokenFile};

use super::super::demo::Demo;
use super::{ModelSource, RunOptions, TrainConfig, Trainer};
use crate::device::Backend;
use crate::model::Model;

/// The training tokens and the validation tokens (`--val-data`, or the built-in text's last scenes),
/// checked against the model's vocabulary and tokenizer and, resuming, against the checkpoint's data.
pub(super) fn open_data(
    options: &RunOptions,
    train: &TrainConfig,
    model: &Model,
    source: &ModelSource<'_>,
) -> Result<(TokenFile, Option<TokenFile>)> {
    let tokens = match &options.data {
        Some(path) => TokenFile::open_with(path, options.data_dtype).with_context(|| format!("--data {}", path.display()))?,
        None => Demo::get()?.train_tokens(),
    };
    tokens.check_vocab(model.vocab_size())?;
    // Refused here, by flag, rather than by the first step's read.
    let what = if options.data.is_some() { "--data" } else { "the built-in text" };
    crate::eval::holds_a_micro_batch(&tokens, what, train.batch, train.seq_len)?;
    if let ModelSource::Hf(hf) = source
        && let Some((tokenizer, source)) = run_tokenizer(options)?
    {
        tokenizer.check_fits_model(&hf.dir, &source)?;
    }
    let validation = match &options.val_data {
        Some(path) => {
            let v = TokenFile::open_with(path, options.data_dtype).with_context(|| format!("--val-data {}", path.display()))?;
            v.check_vocab(model.vocab_size())?;
            check_same_tokenizer(&tokens.path, path)?;
            Some(v)
        }
        None if options.data.is_none() => Some(Demo::get()?.val_tokens()),
        None => None,
    };
    if let ModelSource::Checkpoint(c) = source
        && c.state.data_tokens != tokens.len
    {
        bail!(
            "{} holds {} tokens, but the checkpoint {} was trained on {} ({} tokens): resume on the same data",
            tokens.path.display(),
            tokens.len,
            c.dir.display(),
            c.state.data,
            c.state.data_tokens
        );
    }
    Ok((tokens, validation))
}

/// Refuses validation data prepared with another tokenizer than the training data (by the records
/// `zerostream prepare` leaves beside each): a loss over other ids would mean nothing.
fn check_same_tokenizer(data: &std::path::Path, val_data: &std::path::Path) -> Result<()> {
    if let (Some(a), Some(b)) = (DataTokenizer::read_beside(data)?, DataTokenizer::read_beside(val_data)?)
        && !a.same_as(&b)
    {
        let name = |t: &DataTokenizer, p: &std::path::Path| format!("{} ({})", t.describe(), DataTokenizer::sidecar(p).display());
        bail!(
            "--val-data {} was prepared with another tokenizer than --data {}: {} against {}; prepare both with one",
            val_data.display(),
            data.display(),
            name(&b, val_data),
            name(&a, data)
        );
    }
    Ok(())
}

/// The micro-batches each validation reads: `--eval-batches`, or all `v` holds where that is fewer
/// (`eval`'s count, [`crate::eval::micro_batches_to_read`]); a file without one is refused before
/// training, not after it.
pub(super) fn eval_batches(v: &TokenFile, options: &RunOptions, train: &TrainConfig, say: &dyn Fn(String)) -> Result<usize> {
    let say = |line: String| say(format!("validation: {line}"));
    crate::eval::micro_batches_to_read(v, "validation data", train.batch, train.seq_len, options.eval_batches, "--eval-batches", &say)
}

/// The validation loss of the final weights.
pub(super) fn final_validation<D: Backend>(
    trainer: &mut Trainer<'_, D>,
    v: &TokenFile,
    batches: usize,
    say: &dyn Fn(String),
) -> Result<f64> {
    let loss = trainer.validation_loss(v, batches)?;
    say(format!(
        "validation: loss {loss:.4} (perplexity {:.1}) after step {} on {} of {}",
        loss.exp(),
        trainer.step,
        crate::words::counted(batches as u64, "micro-batch"),
        v.path.display()
    ));
    Ok(loss)
}

/// The tokenizer of the run's data and where it was found, for messages: `--tokenizer`, else the
/// record `prepare` left beside `--data`, else the built-in run's words; None where the data has no
/// record.
pub(super) fn run_tokenizer(options: &RunOptions) -> Result<Option<(DataTokenizer, String)>> {
    Ok(match (&options.tokenizer, &options.data) {
        (Some(t), _) => Some((t.clone(), "--tokenizer".to_string())),
        (None, Some(data)) => DataTokenizer::read_beside(data)?
            .map(|t| (t, format!("--data {} ({})", data.display(), DataTokenizer::sidecar(data).display()))),
        (None, None) => Some((DataTokenizer::Json(Demo::get()?.tokenizer.to_json()?), "the built-in text".to_string())),
    })
}

/// The files that make saved model directories carry the data's tokenizer (see
/// [`RunOptions::tokenizer`]); says which, or why there are none.
pub(super) fn tokenizer_files(say: &dyn Fn(String), options: &RunOptions, model: &Model) -> Result<Vec<(String, Vec<u8>)>> {
    let Some((tokenizer, _)) = run_tokenizer(options)? else {
        // A resume carries on the tokenizer files its checkpoint holds (a `--tokenizer` the run was
        // given, with no record beside the data), checked by the checkpoint's manifest when it opened.
        if let super::ModelChoice::Resume(dir) = &options.model {
            let carried = checkpoint_tokenizer_files(dir)?;
            if !carried.is_empty() {
                say(format!(
                    "tokenizer: the checkpoint's ({}), carried on",
                    carried.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
                ));
                return Ok(carried);
            }
        }
        if options.save.is_some() || options.checkpoints.dir.is_some() {
            let data = options.data.as_deref().map(|d| DataTokenizer::sidecar(d).display().to_string()).unwrap_or_default();
            say(format!("tokenizer: unknown (no {data}; pass --tokenizer): saved models get no tokenizer files"));
        }
        return Ok(Vec::new());
    };
    tokenizer.check_vocab(model.vocab_size())?;
    let files = tokenizer.model_files(model.max_seq_len())?;
    if files.is_empty() {
        say(format!("tokenizer: {} (no Hugging Face tokenizer files exist for it: saved models get none)", tokenizer.describe()));
    }
    Ok(files)
}

/// The tokenizer files a checkpoint directory holds (name, contents), as [`DataTokenizer::model_files`]
/// names them.
fn checkpoint_tokenizer_files(dir: &std::path::Path) -> Result<Vec<(String, Vec<u8>)>> {
    DataTokenizer::FILE_NAMES
        .iter()
        .map(|name| dir.join(name))
        .filter(|path| path.is_file())
        .map(|path| {
            let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Ok((path.file_name().unwrap_or_default().to_string_lossy().into_owned(), bytes))
        })
        .collect()
}
