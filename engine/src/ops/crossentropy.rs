//! crossentropy: softmax cross-entropy per row, fused with its backward.

use rayon::prelude::*;

/// `losses[row] = logsumexp(logits[row]) - logits[row][target]`; with `grad_scale`, logits are overwritten
/// by (softmax - onehot(target)) * grad_scale. Twin of `crossentropy.wgsl`.
pub fn crossentropy(losses: &mut [f32], logits: &mut [f32], targets: &[u32], vocab: usize, grad_scale: Option<f32>) {
    logits[..targets.len() * vocab].par_chunks_mut(vocab).zip(losses.par_iter_mut().zip(targets.par_iter())).for_each(
        |(row, (loss, &target))| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = row.iter().map(|x| (x - max).exp()).sum();
            let lse = max + sum.ln();
            *loss = lse - row[target as usize];
            if let Some(scale) = grad_scale {
                for (v, x) in row.iter_mut().enumerate() {
                    let onehot = if v == target as usize { 1.0 } else { 0.0 };
                    *x = ((*x - lse).exp() - onehot) * scale;
                }
            }
        },
    );
}
