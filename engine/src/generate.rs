//! Text generation with a KV cache: the prompt is fed once, then one token per step attends to the
//! cached keys and values ([`session`]); blocks are streamed under the device's byte budget as in
//! training. Greedy (temperature 0) or sampled with temperature, top-k and top-p from a seeded
//! generator. `zerostream generate` and the end-of-run sample of `zerostream train` both come here.

pub mod session;

use anyhow::{Result, bail};
use rand::{Rng, SeedableRng};

use crate::device::{Backend, CpuDevice};
use crate::model::Model;
pub use session::{DecodePlan, GroupLoader, Session};

/// The loader [`generate`] takes for a model read from Hugging Face files: group `g`'s tensors, read
/// from `hf` one group at a time (in `train::layout`'s groups, as `model`, made from `hf`, lays them out).
pub fn hf_group_loader<'a>(hf: &'a zerostream_checkpoints::HfModel, model: &Model) -> impl FnMut(usize) -> Result<Vec<Vec<f32>>> + 'a {
    let groups = crate::train::layout::group_layouts(model);
    move |g| match groups.get(g) {
        Some(group) => group.tensors.iter().map(|t| hf.tensor(&t.name, &t.shape)).collect(),
        None => bail!("{}: no parameter group {g} (the model has {})", hf.dir.display(), groups.len()),
    }
}

/// How the next token is chosen.
#[derive(Clone, Debug)]
pub struct Sampling {
    pub max_new_tokens: usize,
    /// 0: greedy (the first most likely token, as torch.argmax picks it).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the fewest most likely tokens whose probabilities add up to at least p (1: all).
    pub top_p: f32,
    pub seed: u64,
}

impl Sampling {
    pub fn check(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!("--temperature {}: must be a finite number >= 0 (0 = greedy)", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("--top-p {}: must be in (0, 1]", self.top_p);
        }
        Ok(())
    }
}

/// Positions the caches need for `prompt` (or one start token) and `max_new_tokens`, at most the
/// model's context.
pub fn cache_positions(model: &Model, prompt: &[u32], max_new_tokens: usize) -> usize {
    prompt.len().max(1).saturating_add(max_new_tokens).min(model.max_seq_len())
}

/// Continues `prompt` with up to `s.max_new_tokens` tokens, calling `on_token` with each as it comes;
/// returns the new tokens. `load(g)` gives group g's values ([`GroupLoader`]); `on_plan` is told how
/// the device bytes are spent before the first token.
///
/// Each step sees the last `max_seq_len` tokens, as a full recompute would: once the cache is full,
/// it is refilled from the last `max_seq_len` tokens (positions start again at 0). A model whose
/// sliding window bounds its context is another model past the window (its deeper layers' keys carry
/// the history before it), so a prompt longer than the window is refused and generation stops there,
/// saying so.
pub fn generate<D: Backend>(
    dev: &D,
    model: &Model,
    load: &mut GroupLoader<'_>,
    prompt: &[u32],
    s: &Sampling,
    on_plan: impl FnOnce(&DecodePlan),
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    s.check()?;
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= model.vocab_size()) {
        bail!("prompt token {bad} is not below the model's vocab_size {}", model.vocab_size());
    }
    if s.max_new_tokens == 0 {
        return Ok(Vec::new());
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s.seed);
    let mut context: Vec<u32> = if prompt.is_empty() { vec![0] } else { prompt.to_vec() };
    let window = model.max_seq_len();
    if let Some(w) = model.sliding_window()
        && context.len() > w
    {
        bail!(
            "the prompt's {} are more than the model's sliding window of {w}: each layer attends over its last {w} positions, \
             computed from the whole text, which generation here does not keep past the window; give at most {w} tokens",
            crate::words::counted(context.len() as u64, "token")
        );
    }
    let capacity = cache_positions(model, &context, s.max_new_tokens);
    let first = &context[context.len().saturating_sub(window)..];
    let mut session = Session::new(dev, model, load, capacity, first.len())?;
    on_plan(session.plan());
    let mut logits = session.feed(first)?;
    // Grown as tokens come: a count given as "no limit" (--max-new-tokens 99999999999) reserves nothing.
    let mut out = Vec::new();
    loop {
        let next = pick(&logits, s, &mut rng);
        on_token(next);
        out.push(next);
        context.push(next);
        if out.len() == s.max_new_tokens {
            return Ok(out);
        }
        logits = if session.past() < capacity {
            session.feed(&[next])?
        } else if model.sliding_window().is_some() {
            return Ok(out); // the caller says why ([`window_stop_note`])
        } else {
            session.reset();
            session.feed(&context[context.len() - window..])?
        };
    }
}

/// Why [`generate`] gave fewer than the `asked` tokens it was asked for (`got`): it stops at a sliding
/// window. None where it gave them all.
pub fn window_stop_note(model: &Model, asked: usize, got: usize) -> Option<String> {
    let w = model.sliding_window().filter(|_| got < asked)?;
    Some(format!(
        "note: generation stopped after {} at the model's sliding window of {w} positions: past it each layer attends over \
         keys computed from the text before the window, which generation here does not keep",
        crate::words::counted(got as u64, "new token")
    ))
}

/// The cpu device's budget for the end-of-run sample: blocks beyond it are streamed from the trainer's
/// state one group at a time rather than all held in RAM.
pub const SAMPLE_BYTES: u64 = 2 << 30;

/// The end-of-run sample: `new_tokens` tokens at `temperature` on the cpu device, whose bytes are held
/// to [`SAMPLE_BYTES`] (or the least a token needs, if more), with the weights from `load`.
pub fn sample(
    model: &Model,
    load: &mut GroupLoader<'_>,
    prompt: &[u32],
    new_tokens: usize,
    temperature: f32,
    seed: u64,
) -> Result<Vec<u32>> {
    let budget = SAMPLE_BYTES.max(DecodePlan::min_bytes(model, cache_positions(model, prompt, new_tokens)));
    let s = Sampling { max_new_tokens: new_tokens, temperature, top_k: 0, top_p: 1.0, seed };
    generate(&CpuDevice::new(Some(budget)), model, load, prompt, &s, |_| {}, |_| {})
}

/// The next token from one row of logits.
fn pick(logits: &[f32], s: &Sampling, rng: &mut impl Rng) -> u32 {
    if s.temperature == 0.0 {
        return logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &x)| if x > best.1 { (i, x) } else { best }).0 as u32;
    }
    // Candidates from most to least likely (ties by id, so the order is the same everywhere).
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if s.top_k > 0 {
        order.truncate(s.top_k);
    }
    let max = logits[order[0]];
    let weights: Vec<f64> = order.iter().map(|&i| (((logits[i] - max) / s.temperature) as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut keep = weights.len();
    if s.top_p < 1.0 {
        let mut cumulative = 0.0;
        for (n, w) in weights.iter().enumerate() {
            cumulative += w / total;
            if cumulative >= s.top_p as f64 {
                keep = n + 1;
                break;
            }
        }
    }
    let mass: f64 = weights[..keep].iter().sum();
    let mut draw = rng.random::<f64>() * mass;
    for (n, w) in weights[..keep].iter().enumerate() {
        draw -= w;
        if draw <= 0.0 {
            return order[n] as u32;
        }
    }
    order[keep - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(temperature: f32, top_k: usize, top_p: f32) -> Sampling {
        Sampling { max_new_tokens: 1, temperature, top_k, top_p, seed: 1 }
    }

    /// Any count of new tokens (usize::MAX included, which wrapped to a cache of 2) caps at the context.
    #[test]
    fn the_cache_holds_the_prompt_and_new_tokens_up_to_the_context() {
        let model = Model::preset("gpt2").unwrap();
        assert_eq!(cache_positions(&model, &[1, 2, 3], 5), 8);
        assert_eq!(cache_positions(&model, &[], 5), 6, "one start token");
        assert_eq!(cache_positions(&model, &[1, 2, 3], usize::MAX), 1024);
        assert_eq!(cache_positions(&model, &[1, 2, 3], usize::MAX - 1), 1024);
    }

    #[test]
    fn greedy_top_k_and_top_p_pick_from_the_right_candidates() {
        let logits = [0.0f32, 3.0, 1.0, 3.0, -1.0];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        assert_eq!(pick(&logits, &settings(0.0, 0, 1.0), &mut rng), 1, "the first of the tied maxima");
        for _ in 0..200 {
            let k2 = pick(&logits, &settings(1.0, 2, 1.0), &mut rng);
            assert!(k2 == 1 || k2 == 3, "top-k 2 keeps ids 1 and 3, got {k2}");
            // Each of the two tied maxima holds 0.45 of the mass: top-p 0.4 keeps the first of them only.
            assert_eq!(pick(&logits, &settings(1.0, 0, 0.4), &mut rng), 1);
        }
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[pick(&logits, &settings(1.0, 0, 1.0), &mut rng) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "every token is possible without top-k/top-p: {seen:?}");
        assert!(settings(-1.0, 0, 1.0).check().is_err() && settings(1.0, 0, 0.0).check().is_err());
    }
}
