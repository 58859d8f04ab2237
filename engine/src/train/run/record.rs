//! What a run keeps on disk besides the model: the record each checkpoint carries (the seed, the data
//! from the root, every setting by flag name), and the checkpoint root rank 0 holds, with what it
//! says about checkpoints a resume from an earlier step finds there.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use zerostream_checkpoints::checkpoint::CheckpointRoot;
use zerostream_checkpoints::{TokenFile, TokenWidth};

use super::data::tokenizer_files;
use super::{ModelChoice, RunOptions, absolute};
use crate::model::Model;
use crate::train::checkpoint::{ModelExtras, RunRecord, SaveDtype};
use crate::train::{Flags, TrainConfig};

/// What a checkpoint records of the run besides the trainer's state: the seed, the data, the settings
/// a resume checks, the save dtype, how many to keep and the tokenizer's files.
pub(super) fn run_record(
    options: &RunOptions,
    train: &TrainConfig,
    model: &Model,
    tokens: &TokenFile,
    world: usize,
    say: &dyn Fn(String),
) -> Result<RunRecord> {
    Ok(RunRecord {
        seed: train.seed,
        // The built-in text's label is no path.
        data: if options.data.is_some() { absolute(&tokens.path) } else { tokens.path.clone() }.display().to_string(),
        data_tokens: tokens.len,
        settings: run_settings(train, options, world),
        outputs: super::kept_outputs::record(options),
        save_dtype: options.save_dtype.unwrap_or(SaveDtype::of(train.precision)),
        keep: options.checkpoints.keep,
        extras: model_extras(say, options, model)?,
    })
}

/// What the models the run saves carry besides their weights: the data's tokenizer files, and the
/// source model's token ids and generation_config.json (a Hugging Face directory's, a checkpoint's,
/// or a `--config` file's ids).
fn model_extras(say: &dyn Fn(String), options: &RunOptions, model: &Model) -> Result<ModelExtras> {
    let mut extras = ModelExtras { files: tokenizer_files(say, options, model)?, ..ModelExtras::default() };
    let config = match &options.model {
        ModelChoice::Hf(dir) | ModelChoice::Resume(dir) => dir.join("config.json"),
        ModelChoice::Config(spec) if Model::preset(spec).is_none() && Path::new(spec).is_file() => PathBuf::from(spec),
        _ => return Ok(extras),
    };
    // The model's reader has read this file whole already; a key it holds is carried as it is.
    let text = std::fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config.display()))?;
    for key in ModelExtras::CONFIG_KEYS {
        if let Some(value) = json.get(*key).filter(|v| !v.is_null()) {
            extras.config_keys.insert(key.to_string(), value.clone());
        }
    }
    let generation = config.with_file_name(ModelExtras::GENERATION_CONFIG);
    if !matches!(options.model, ModelChoice::Config(_)) && generation.is_file() {
        let bytes = std::fs::read(&generation).with_context(|| format!("reading {}", generation.display()))?;
        serde_json::from_slice::<serde_json::Value>(&bytes).with_context(|| format!("{}: not JSON", generation.display()))?;
        extras.files.push((ModelExtras::GENERATION_CONFIG.to_string(), bytes));
    }
    Ok(extras)
}

/// Rank 0 holds the checkpoint root (its lock, its leftovers) for the whole run.
pub(super) fn checkpoint_root(say: &dyn Fn(String), options: &RunOptions, lead: bool) -> Result<Option<CheckpointRoot>> {
    let (Some(dir), true) = (&options.checkpoints.dir, lead) else { return Ok(None) };
    let resumed_from = match &options.model {
        ModelChoice::Resume(checkpoint) => Some(checkpoint.as_path()),
        _ => None,
    };
    let root = CheckpointRoot::open(dir, resumed_from)?;
    for path in &root.removed_leftovers {
        say(format!("removed {} (left by an interrupted save)", path.display()));
    }
    if let Some(warning) = later_checkpoints_warning(dir, &root.left_behind) {
        // A warning, so said under --quiet too: saving one of those steps replaces the earlier run's copy.
        eprintln!("{warning}");
    }
    Ok(Some(root))
}

/// The warning for a resume from an earlier step than `dir`'s checkpoints `later` reach.
fn later_checkpoints_warning(dir: &Path, later: &[u64]) -> Option<String> {
    let (first, last) = (later.first()?, later.last()?);
    let which = match later.len() {
        1 => format!("the checkpoint of step {first}"),
        n => format!("{n} checkpoints, of steps {first} to {last}"),
    };
    Some(format!(
        "warning: {} also holds {which}, later than the step resumed from: this run replaces each step it saves again; \
         --keep-checkpoints counts and removes only this run's line (to go on from step {last} instead, stop this run and \
         resume from {})",
        dir.display(),
        dir.join(zerostream_checkpoints::checkpoint::step_name(*last)).display()
    ))
}

/// Every setting of the run by flag name: the trainer's, the seed, the data and the world size.
fn run_settings(train: &TrainConfig, options: &RunOptions, world: usize) -> Flags {
    let mut settings = train.to_flags();
    settings.insert("seed".into(), train.seed.into());
    settings.insert("data".into(), options.data.as_ref().map(|p| absolute(p).display().to_string()).into());
    settings.insert("world-size".into(), world.into());
    settings.insert("data-dtype".into(), if options.data_dtype == TokenWidth::U32 { "u32" } else { "u16" }.into());
    settings
}

#[cfg(test)]
mod tests {
    #[test]
    fn later_checkpoints_are_counted_in_words() {
        let dir = std::path::Path::new("ck");
        assert_eq!(super::later_checkpoints_warning(dir, &[]), None);
        let one = super::later_checkpoints_warning(dir, &[5]).unwrap();
        assert!(one.starts_with("warning: ck also holds the checkpoint of step 5, later than"), "{one}");
        let two = super::later_checkpoints_warning(dir, &[5, 6]).unwrap();
        assert!(two.starts_with("warning: ck also holds 2 checkpoints, of steps 5 to 6, later than"), "{two}");
    }
}
