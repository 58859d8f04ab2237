//! Sampling text from a trained model: the resident [`Gpt2`] on the cpu device, one token at a time.

use anyhow::{Result, anyhow};
use rand::{Rng, SeedableRng};

use crate::device::{Backend, CpuDevice};
use crate::model::gpt2::{Gpt2, Gpt2Config};

/// Continues `prompt` by `new_tokens` tokens sampled at `temperature` (seeded), from weights given as
/// (name, shape, values). Returns only the new tokens.
pub fn sample(
    config: &Gpt2Config,
    weights: &[(String, Vec<usize>, Vec<f32>)],
    prompt: &[u32],
    new_tokens: usize,
    temperature: f32,
    seed: u64,
) -> Result<Vec<u32>> {
    let dev = CpuDevice::new(None);
    let lookup: std::collections::HashMap<&str, &Vec<f32>> = weights.iter().map(|(n, _, v)| (n.as_str(), v)).collect();
    let mut model =
        Gpt2::from_fn(&dev, config, |name, _| lookup.get(name).map(|v| v.to_vec()).ok_or_else(|| anyhow!("sampling: no tensor {name}")))?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut context: Vec<u32> = if prompt.is_empty() { vec![0] } else { prompt.to_vec() };
    let (window, vocab) = (config.n_positions, config.vocab_size);
    let mut out = Vec::with_capacity(new_tokens);
    for _ in 0..new_tokens {
        // A fixed T, padded on the right: causal attention makes the padding invisible to earlier positions.
        let start = context.len().saturating_sub(window);
        let live = &context[start..];
        let t = window.min(context.len() + new_tokens).max(live.len());
        let mut ids = live.to_vec();
        ids.resize(t, 0);
        let tokens = dev.tokens(&ids)?;
        model.forward(&dev, &tokens, &tokens, 1, t, None)?;
        let logits = dev.read(model.logits().expect("logits after forward"));
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
