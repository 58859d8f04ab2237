//! Sampling text from a trained model: the model resident on the cpu device, one token at a time.

use anyhow::Result;
use rand::{Rng, SeedableRng};

use crate::device::CpuDevice;
use crate::model::Model;

/// Continues `prompt` by `new_tokens` tokens sampled at `temperature` (seeded), from weights given as
/// (name, shape, values). Returns only the new tokens.
pub fn sample(
    model: &Model,
    weights: &[(String, Vec<usize>, Vec<f32>)],
    prompt: &[u32],
    new_tokens: usize,
    temperature: f32,
    seed: u64,
) -> Result<Vec<u32>> {
    let dev = CpuDevice::new(None);
    let mut logits_of = model.resident_logits(&dev, weights)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut context: Vec<u32> = if prompt.is_empty() { vec![0] } else { prompt.to_vec() };
    let (window, vocab) = (model.max_seq_len(), model.vocab_size());
    let mut out = Vec::with_capacity(new_tokens);
    for _ in 0..new_tokens {
        // A fixed T, padded on the right: causal attention makes the padding invisible to earlier positions.
        let start = context.len().saturating_sub(window);
        let live = &context[start..];
        let t = window.min(context.len() + new_tokens).max(live.len());
        let mut ids = live.to_vec();
        ids.resize(t, 0);
        let logits = logits_of(&ids)?;
        let row = &logits[(live.len() - 1) * vocab..live.len() * vocab];
        let next = sample_row(row, temperature, &mut rng);
        out.push(next);
        context.push(next);
    }
    Ok(out)
}

fn sample_row(logits: &[f32], temperature: f32, rng: &mut impl Rng) -> u32 {
    if temperature <= 0.0 {
        return logits.iter().enumerate().fold((0, f32::MIN), |best, (i, &x)| if x > best.1 { (i, x) } else { best }).0 as u32;
    }
    let max = logits.iter().fold(f32::MIN, |a, &b| a.max(b));
    let weights: Vec<f64> = logits.iter().map(|&x| (((x - max) / temperature) as f64).exp()).collect();
    let mut pick = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (i, w) in weights.iter().enumerate() {
        pick -= w;
        if pick <= 0.0 {
            return i as u32;
        }
    }
    (weights.len() - 1) as u32
}
