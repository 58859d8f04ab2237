//! `zerostream tune`'s attention part: every variant of the training attention kernels the adapter can
//! run ([`AttentionTile`]), timed forward and backward on each model's attention at the configured
//! batch and T, the fastest kept per shape class ([`AttentionClass`]: pass, head dim, T's bucket).
//!
//! As for the matmul, a variant is accepted only if every output (out and lse forward; dqkv and delta
//! backward) equals the default variant's bit for bit on the call it was timed on.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::LlamaConfig;
use zerostream_shaders::{AttentionPass, AttentionTile};

use super::{Candidates, Clock, TuneConfig, VariantTimes, time_variants, values};
use crate::device::attention_tuning::AttentionClass;
use crate::device::gpu::GpuTensor;
use crate::device::{AttentionDims, Backend, GpuDevice};

/// One attention call of a training step.
#[derive(Clone, Debug)]
pub struct AttentionCall {
    /// `gpt2 attention forward`, `llama-3.2-1b attention backward`.
    pub name: String,
    pub pass: AttentionPass,
    pub dims: AttentionDims,
}

/// The attention calls of one training step of `model` at (batch, seq_len): forward and backward of its
/// layers' attention (all layers have the same shape), as the model's code makes them.
pub fn attention_calls(model: &str, batch: usize, seq_len: usize) -> Result<Vec<AttentionCall>> {
    let dims = if model == "tiny" || model.starts_with("gpt2") {
        let cfg = crate::bench::kernels::model_config(model)?;
        AttentionDims::mha(batch, seq_len, cfg.n_embd, cfg.n_head)
    } else {
        let cfg = LlamaConfig::preset(model).with_context(|| format!("--models {model:?}: not a model shape"))?;
        AttentionDims::gqa(batch, seq_len, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    };
    Ok(AttentionPass::ALL
        .into_iter()
        .map(|pass| AttentionCall { name: format!("{model} attention {}", pass.name()), pass, dims })
        .collect())
}

/// One attention class's outcome.
#[derive(Clone, Debug)]
pub struct AttentionResult {
    pub class: AttentionClass,
    /// The call it was timed on, and every call of the class.
    pub dims: AttentionDims,
    pub calls: Vec<String>,
    pub timed: VariantTimes<AttentionTile>,
}

impl AttentionResult {
    /// `B=4 T=1024 H=12 G=12 D=64`.
    pub fn shape(&self) -> String {
        let d = &self.dims;
        format!("B={} T={} H={} G={} D={}", d.batch, d.seq_len, d.heads, d.kv_heads, d.head_dim)
    }
}

/// The tensors of one call: inputs filled, outputs the pass writes.
struct Tensors {
    qkv: GpuTensor,
    out: GpuTensor,
    lse: GpuTensor,
    dout: GpuTensor,
    dqkv: GpuTensor,
    delta: GpuTensor,
}

fn tensors(dev: &GpuDevice, d: AttentionDims, seed: u64) -> Result<Tensors> {
    let rows = d.batch * d.seq_len;
    let filled = |len: usize, seed: u64, label: &str| -> Result<GpuTensor> {
        let t = dev.alloc(len, label)?;
        dev.write(&t, &values(len, seed));
        Ok(t)
    };
    let t = Tensors {
        qkv: filled(rows * d.qkv_width(), seed, "tune qkv")?,
        out: dev.alloc(rows * d.out_width(), "tune out")?,
        lse: dev.alloc(d.stat_len(), "tune lse")?,
        dout: filled(rows * d.out_width(), seed + 1, "tune dout")?,
        dqkv: dev.alloc(rows * d.qkv_width(), "tune dqkv")?,
        delta: dev.alloc(d.stat_len(), "tune delta")?,
    };
    // The backward's inputs: the default's forward (every variant's, bit for bit).
    dev.force_attention_variant(Some(AttentionTile::DEFAULT))?;
    dev.attention_forward(&t.out, &t.lse, &t.qkv, d);
    Ok(t)
}

/// Times `variants` on one call, the first as the baseline; the reference bits are the default's.
fn tune_call(
    dev: &GpuDevice,
    call: &AttentionCall,
    variants: &[AttentionTile],
    clock: Clock,
    seed: u64,
) -> Result<Option<VariantTimes<AttentionTile>>> {
    let setup_start = Instant::now();
    let (t, d) = (tensors(dev, call.dims, seed)?, call.dims);
    dev.synchronize();
    let setup_s = setup_start.elapsed().as_secs_f64();
    let run = || match call.pass {
        AttentionPass::Forward => dev.attention_forward(&t.out, &t.lse, &t.qkv, d),
        AttentionPass::Backward => dev.attention_backward(&t.dqkv, &t.delta, &t.dout, &t.qkv, &t.out, &t.lse, d),
    };
    let candidates = Candidates { reference: AttentionTile::DEFAULT, list: variants, prune: false };
    let outputs = match call.pass {
        AttentionPass::Forward => [&t.out, &t.lse],
        AttentionPass::Backward => [&t.dqkv, &t.delta],
    };
    time_variants(dev, &candidates, clock, setup_s, |v| dev.force_attention_variant(v), run, &outputs)
}

/// The attention variants to try ([`with_baselines`]): `cfg.attention_variants`, else every one the
/// adapter runs.
pub fn attention_variants(dev: &GpuDevice, cfg: &TuneConfig) -> Result<Vec<AttentionTile>> {
    let runnable = dev.attention_variants();
    let variants = if cfg.attention_variants.is_empty() { runnable.clone() } else { cfg.attention_variants.clone() };
    if let Some(v) = variants.iter().find(|v| !runnable.contains(v)) {
        bail!(
            "--attention-variants {v}: not a candidate this adapter can run ({})",
            runnable.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(with_baselines(variants))
}

/// `listed` behind the untuned variant (the baseline) and the default (the reference bits), both timed
/// whether listed or not. With the default always timed, a class keeps a timed variant even where the
/// untuned one's bits differ (a driver contracting its arithmetic otherwise): its baseline is then the
/// default.
fn with_baselines(mut listed: Vec<AttentionTile>) -> Vec<AttentionTile> {
    let first = [AttentionTile::UNTUNED, AttentionTile::DEFAULT];
    listed.retain(|v| !first.contains(v));
    first.into_iter().chain(listed).collect()
}

/// Tunes every attention class of the configured models, until `cfg.max_seconds` after `start` (the
/// whole tune's clock); calls `on_class` as each finishes. Nothing when `cfg.attention` is off.
pub fn tune_attention(
    dev: &GpuDevice,
    cfg: &TuneConfig,
    start: Instant,
    mut on_class: impl FnMut(&AttentionResult),
) -> Result<Vec<AttentionResult>> {
    if !cfg.attention {
        return Ok(Vec::new());
    }
    let variants = attention_variants(dev, cfg)?;
    let mut classes: BTreeMap<AttentionClass, (AttentionCall, Vec<String>)> = BTreeMap::new();
    let mut order = Vec::new();
    for model in &cfg.models {
        for call in attention_calls(model, cfg.batch, cfg.seq_len)? {
            let class = AttentionClass::of(call.pass, &call.dims);
            let entry = classes.entry(class).or_insert_with(|| {
                order.push(class);
                (call.clone(), Vec::new())
            });
            entry.1.push(call.name);
        }
    }
    let clock = Clock { timer: dev.best_timer(), deadline: super::deadline_after(start, cfg.max_seconds) };
    let mut results = Vec::new();
    for (i, class) in order.iter().enumerate() {
        let (call, names) = &classes[class];
        let timed = match Instant::now() < clock.deadline {
            true => tune_call(dev, call, &variants, clock, 1000 + i as u64 * 7)?,
            false => None,
        };
        let Some(timed) = timed else {
            eprintln!(
                "tune: --max-seconds {} reached; {} of {} attention classes left untuned",
                cfg.max_seconds,
                order.len() - i,
                order.len()
            );
            break;
        };
        let result = AttentionResult { class: *class, dims: call.dims, calls: names.clone(), timed };
        on_class(&result);
        results.push(result);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untuned_and_default_come_first_whatever_is_listed() {
        let (untuned, default, small) = (AttentionTile::UNTUNED, AttentionTile::DEFAULT, AttentionTile::rows(8));
        assert_eq!(with_baselines(vec![small, untuned]), [untuned, default, small]);
        assert_eq!(with_baselines(vec![default]), [untuned, default]);
        assert_eq!(with_baselines(vec![]), [untuned, default]);
    }

    #[test]
    fn calls_follow_each_family() {
        let gpt2 = attention_calls("gpt2", 4, 1024).unwrap();
        assert_eq!(gpt2.len(), 2);
        assert_eq!(AttentionClass::of(gpt2[0].pass, &gpt2[0].dims).key(), "forward/d64/t20");
        let llama = attention_calls("llama-3-8b", 1, 256).unwrap();
        assert_eq!((llama[1].dims.heads, llama[1].dims.kv_heads, llama[1].dims.head_dim), (32, 8, 128));
        assert_eq!(AttentionClass::of(llama[1].pass, &llama[1].dims).key(), "backward/d128/t16");
        assert!(attention_calls("gpt3", 1, 1).is_err());
    }
}
