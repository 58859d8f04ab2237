//! Generation with a KV cache against the full recompute (`Model::resident_logits`, every step the
//! whole context): the same logits step by step, the same greedy tokens past the model's context (where
//! the cache is refilled), and the same tokens with blocks streamed under a small budget; on the cpu
//! device and the GPU, for GPT-2 and Llama.

mod common;

use anyhow::Result;
use common::{assert_close, gpu_or_skip};
use zerostream::device::{Backend, CpuDevice, GpuDevice};
use zerostream::generate::{DecodePlan, Sampling, Session, cache_positions, generate, hf_group_loader};
use zerostream::model::Model;
use zerostream_checkpoints::HfModel;

const GPT2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny-trained");
const LLAMA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/llama-tiny/model");

fn open(dir: &str) -> (HfModel, Model) {
    let hf = HfModel::open(std::path::Path::new(dir)).unwrap();
    let model = Model::of_hf(&hf).unwrap();
    (hf, model)
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &x)| if x > best.1 { (i, x) } else { best }).0 as u32
}

/// A prompt fed at once, then six greedy steps one token at a time: each step's logits within 1e-5
/// (relative) of the full recompute's last row, and with `bits` its very bits. The gpu gives them:
/// decode attention runs the forward kernel's own online-softmax loop and every other kernel works row
/// by row, each output one chain of fused multiply-adds whatever the rows around it. The cpu device's
/// matmul (the `gemm` crate) picks its kernel by shape, so one row and six sum in different orders.
fn cached_logits_match<D: Backend>(dev: &D, dir: &str, label: &str, bits: bool) {
    let (hf, model) = open(dir);
    let weight = |name: &str, shape: &[usize]| hf.tensor(name, shape);
    let mut full = model.resident_logits(dev, &weight).unwrap();
    let mut load = hf_group_loader(&hf, &model);
    let mut context = vec![84u32, 104, 101, 7, 0, 99];
    let mut session = Session::new(dev, &model, &mut load, 16, context.len()).unwrap();
    let mut cached = session.feed(&context).unwrap();
    let v = model.vocab_size();
    for step in 0..6 {
        let all = full(&context).unwrap();
        let want = &all[(context.len() - 1) * v..];
        let differing = cached.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert_close(&format!("{label}: logits after {} tokens", context.len()), &cached, want, 1e-5 * scale, 1e-5);
        if bits && differing > 0 {
            panic!("{label}: logits after {} tokens: {differing} of {} differ from the full recompute's (within 1e-5)", context.len(), v);
        }
        let next = argmax(&cached);
        context.push(next);
        cached = session.feed(&[next]).unwrap();
        assert_eq!(session.past(), context.len(), "{label}: step {step}");
    }
}

#[test]
fn cached_logits_equal_the_full_recompute() {
    for (dir, name) in [(GPT2, "gpt2"), (LLAMA, "llama")] {
        cached_logits_match(&CpuDevice::new(None), dir, &format!("{name} on cpu"), false);
        if let Some(gpu) = gpu_or_skip("cached logits on the gpu") {
            cached_logits_match(&gpu, dir, &format!("{name} on gpu"), true);
        }
    }
}

/// Greedy tokens of the full recompute, each step over the last max_seq_len tokens (what generation
/// did before the cache).
fn recomputed_tokens<D: Backend>(dev: &D, hf: &HfModel, model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let weight = |name: &str, shape: &[usize]| hf.tensor(name, shape);
    let mut full = model.resident_logits(dev, &weight).unwrap();
    let (mut context, mut out) = (prompt.to_vec(), Vec::new());
    for _ in 0..n {
        let live = &context[context.len().saturating_sub(model.max_seq_len())..];
        let logits = full(live).unwrap();
        let next = argmax(&logits[(live.len() - 1) * model.vocab_size()..]);
        out.push(next);
        context.push(next);
    }
    out
}

fn greedy<D: Backend>(dev: &D, hf: &HfModel, model: &Model, prompt: &[u32], n: usize) -> Result<(Vec<u32>, DecodePlan)> {
    let s = Sampling { max_new_tokens: n, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1 };
    let mut plan = None;
    let ids = generate(dev, model, &mut hf_group_loader(hf, model), prompt, &s, |p| plan = Some(p.clone()), |_| {})?;
    Ok((ids, plan.unwrap()))
}

/// Past the context (GPT-2's is 32 positions, Llama's 64), with everything resident and with blocks
/// streamed and the prompt fed in small chunks under a budget a little above one token's needs: the
/// full recompute's greedy tokens every time. A budget below one token's needs is refused with them.
fn streamed_tokens_match<D: Backend>(dev: &D, budgeted: impl Fn(u64) -> D, dir: &str, label: &str) {
    let (hf, model) = open(dir);
    let (prompt, n) = (vec![84u32, 104, 101, 32, 116, 104, 101], model.max_seq_len() + 5);
    let want = recomputed_tokens(dev, &hf, &model, &prompt, n);
    let (ids, plan) = greedy(dev, &hf, &model, &prompt, n).unwrap();
    assert!(!plan.streams(), "{label}: {plan:?}");
    assert_eq!(ids, want, "{label}: with the cache, everything resident");
    let min = DecodePlan::min_bytes(&model, cache_positions(&model, &prompt, n));
    let (ids, plan) = greedy(&budgeted(min + 4096), &hf, &model, &prompt, n).unwrap();
    assert!(plan.streams() && plan.resident_blocks == 0 && plan.prefill_rows < prompt.len(), "{label}: {plan:?}");
    assert_eq!(ids, want, "{label}: streamed");
    let err = greedy(&budgeted(min - 1), &hf, &model, &prompt, n).unwrap_err().to_string();
    assert!(err.contains("one token needs") && err.contains("key/value cache"), "{label}: {err}");
}

#[test]
fn streamed_generation_gives_the_tokens_of_the_full_recompute() {
    for (dir, name) in [(GPT2, "gpt2"), (LLAMA, "llama")] {
        streamed_tokens_match(&CpuDevice::new(None), |b| CpuDevice::new(Some(b)), dir, &format!("{name} on cpu"));
        if let Some(gpu) = gpu_or_skip("streamed generation on the gpu") {
            let budgeted = |b| GpuDevice::open(None, Some(b)).unwrap();
            streamed_tokens_match(&gpu, budgeted, dir, &format!("{name} on gpu"));
        }
    }
}
