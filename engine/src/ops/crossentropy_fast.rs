//! crossentropy_fast: the `cpu` device's fused softmax cross-entropy, the twin [`super::crossentropy`]'s
//! function with the vectorising exp, max and sums of [`super::fast_math`], one row per rayon task (a
//! row's sums are in a fixed order, so the bits do not depend on the thread count).

use rayon::prelude::*;

use super::fast_math;

/// `losses[row] = logsumexp(logits[row]) - logits[row][target]`; with `grad_scale`, logits are overwritten
/// by (softmax - onehot(target)) * grad_scale. As [`super::crossentropy::crossentropy`].
pub fn crossentropy(losses: &mut [f32], logits: &mut [f32], targets: &[u32], vocab: usize, grad_scale: Option<f32>) {
    assert!(logits.len() >= targets.len() * vocab, "crossentropy: logits hold fewer than {} rows of {vocab}", targets.len());
    assert!(losses.len() >= targets.len(), "crossentropy: losses hold fewer than {} rows", targets.len());
    logits[..targets.len() * vocab].par_chunks_mut(vocab).zip(losses.par_iter_mut().zip(targets.par_iter())).for_each(
        |(row, (loss, &target))| {
            let target = target as usize;
            assert!(target < vocab, "crossentropy: target {target} is outside the vocabulary of {vocab}");
            let max = fast_math::max(row);
            let lse = max + fast_math::sum_exp_shifted(row, max).ln();
            let target_logit = row[target];
            *loss = lse - target_logit;
            if let Some(scale) = grad_scale {
                fast_math::exp_affine(row, 1.0, lse, scale);
                row[target] = (fast_math::exp(target_logit - lse) - 1.0) * scale;
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn fast_crossentropy_matches_twin() {
        for (rows, vocab) in [(1, 1), (3, 17), (5, 1001), (4, 50257)] {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(vocab as u64);
            let logits: Vec<f32> = (0..rows * vocab).map(|_| rng.random_range(-8.0f32..8.0)).collect();
            let targets: Vec<u32> = (0..rows).map(|_| rng.random_range(0..vocab as u32)).collect();
            for grad_scale in [None, Some(1.0 / 3.0)] {
                let (mut want, mut got) = (logits.clone(), logits.clone());
                let (mut want_loss, mut got_loss) = (vec![0.0; rows], vec![0.0; rows]);
                crate::ops::crossentropy::crossentropy(&mut want_loss, &mut want, &targets, vocab, grad_scale);
                crossentropy(&mut got_loss, &mut got, &targets, vocab, grad_scale);
                for (g, w) in got_loss.iter().zip(&want_loss) {
                    assert!((g - w).abs() <= 2e-5 * (1.0 + w.abs()), "rows={rows} vocab={vocab}: loss {g} vs {w}");
                }
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() <= 1e-6 + 2e-5 * w.abs(), "rows={rows} vocab={vocab} [{i}]: {g} vs {w}");
                }
            }
        }
    }
}
