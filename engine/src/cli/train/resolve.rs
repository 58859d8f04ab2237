//! `train`'s and `plan`'s flags resolved into the [`RunRequest`] the library checks and runs: which model,
//! the training configuration, the run's options and its ranks.

use anyhow::{Result, bail};
use zerostream::train::launch::{RankRequest, RunRequest};
use zerostream::train::ranks::RankDevice;
use zerostream::train::run::{CheckpointOptions, ModelChoice, RunOptions};
use zerostream::train::{LrPlan, TrainConfig};
use zerostream_checkpoints::DataTokenizer;

use super::{OffloadTarget, RamCache, TrainArgs};

/// The run `train` would make of these flags, for the library to check and run: the flags' values
/// as they are, no file read. `plan` needs no data (`needs_data` false). `resolved` is every flag's
/// value as TOML (the copy beside the metrics).
pub(super) fn resolve_train(a: &TrainArgs, needs_data: bool, given: &crate::Given, resolved: &str) -> Result<RunRequest> {
    let (model, named_model) = model_choice(a, needs_data)?;
    let train = train_config(a);
    let options = run_options(a, model)?;
    let devices = a.devices.as_deref().map(RankDevice::parse_list).transpose()?.unwrap_or_default();
    Ok(RunRequest {
        options,
        train,
        ranks: RankRequest { world_size: a.world_size, devices, device: a.device.device, adapter: a.device.adapter.clone() },
        explicit_flags: given.explicit.clone(),
        changed_flags: given.changed.clone(),
        params_ram_cache_auto: matches!(a.params_ram_cache, RamCache::Auto),
        named_model,
        resolved_config: resolved.to_string(),
        config_file: a.config_file.clone(),
        tensorboard: a.tensorboard.clone(),
    })
}

/// The model the flags name, and, for a resume that also names one (`--model` or `--config`), that flag
/// and its model (the library refuses it if it differs from the checkpoint's).
fn model_choice(a: &TrainArgs, needs_data: bool) -> Result<(ModelChoice, Option<(&'static str, ModelChoice)>)> {
    let model = match (&a.model, &a.config, &a.resume) {
        (_, _, Some(path)) => ModelChoice::Resume(zerostream_checkpoints::checkpoint::resolve_resume(path)?),
        (Some(dir), _, _) => ModelChoice::Hf(dir.clone()),
        (None, Some(spec), _) => ModelChoice::Config(spec.clone()),
        (None, None, None) if a.data.is_none() || !needs_data => ModelChoice::Demo,
        (None, None, None) => bail!("--data needs a model: --model DIR or --config PRESET|FILE"),
    };
    if needs_data && a.data.is_none() && matches!(model, ModelChoice::Hf(_) | ModelChoice::Config(_)) {
        bail!("--model/--config need --data FILE (make one with `zerostream prepare`)");
    }
    let named_model = match (&model, &a.model, &a.config) {
        (ModelChoice::Resume(_), Some(dir), _) => Some(("--model", ModelChoice::Hf(dir.clone()))),
        (ModelChoice::Resume(_), None, Some(spec)) => Some(("--config", ModelChoice::Config(spec.clone()))),
        _ => None,
    };
    Ok((model, named_model))
}

/// The training configuration, every field from its flag.
fn train_config(a: &TrainArgs) -> TrainConfig {
    TrainConfig {
        batch: a.batch_size,
        seq_len: a.seq_len,
        grad_accum: a.grad_accum,
        steps: a.steps,
        lr: LrPlan { peak: a.lr, min: a.min_lr, warmup_steps: a.warmup_steps, total_steps: a.steps, schedule: a.lr_schedule },
        beta1: a.beta1,
        beta2: a.beta2,
        eps: a.eps,
        weight_decay: a.weight_decay,
        grad_clip: a.grad_clip,
        precision: a.precision,
        gpu_mem_budget: a.gpu_mem_budget,
        recompute: a.recompute,
        offload_optimizer: a.offload_optimizer.tier(),
        offload_gradients: a.offload_gradients.map(OffloadTarget::tier),
        offload_params: a.offload_params.tier(),
        params_ram_cache_bytes: match a.params_ram_cache {
            RamCache::Bytes(bytes) => bytes,
            RamCache::Auto => 0,
        },
        nvme_dirs: a.nvme_dir.clone(),
        io: a.io.config(),
        verify: !a.no_verify,
        adam_threads: a.adam_threads,
        zero_stage: a.zero_stage,
        sequential: a.sequential,
        pin_memory: !a.no_pin_memory,
        copy_queue: a.copy_queue,
        dropout: a.dropout,
        seed: a.seed,
        vocab_chunk_rows: a.vocab_chunk_rows,
        matmul_inputs: a.matmul_inputs,
        adam_state: a.adam_state,
        grad_compression: a.grad_compression,
        grad_compression_chunk: a.grad_compression_chunk,
        grad_compression_warmup: a.grad_compression_warmup,
        freeze_variance: a.freeze_variance,
        all_reduce_phases: a.all_reduce_phases,
        param_compression: a.param_compression,
        optimizer: a.optimizer,
        momentum: a.momentum,
        trust_coefficient: a.trust_coefficient,
    }
}

/// The run's options: model, data, validation, outputs, checkpoints, sample.
fn run_options(a: &TrainArgs, model: ModelChoice) -> Result<RunOptions> {
    Ok(RunOptions {
        model,
        data: a.data.clone(),
        data_dtype: a.data_dtype,
        val_data: a.val_data.clone(),
        eval_every: a.eval_every,
        eval_batches: a.eval_batches,
        metrics: a.metrics.clone(),
        trace: a.trace.clone(),
        tensorboard: None,
        save: a.save.clone(),
        save_dtype: a.save_dtype,
        checkpoints: CheckpointOptions { dir: a.checkpoint_dir.clone(), every: a.checkpoint_every, keep: a.keep_checkpoints },
        tokenizer: a.tokenizer.as_deref().map(|t| DataTokenizer::parse(t, "--tokenizer")).transpose()?,
        stop: None,
        sample_tokens: a.sample_tokens,
        prompt: a.prompt.replace("\\n", "\n"),
        progress: true,
    })
}
