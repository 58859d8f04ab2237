//! crossentropy_fast: the `cpu` device's softmax cross-entropy — the fused whole-row op and the two ops of
//! the vocabulary-chunked one (a chunk's statistics, a chunk's gradient) — the twins' functions in
//! [`super::crossentropy`] with the vectorising exp, max and sums of [`super::fast_math`], one row per
//! rayon task (a row's sums are in a fixed order, so the bits do not depend on the thread count).

use rayon::prelude::*;

use super::crossentropy::VocabChunk;
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

/// Per row of one vocabulary chunk: `stats[(row * n_chunks + index) * 3 ..]` = (the chunk's max, sum of
/// exp(x - max) over the chunk in [`fast_math::LANES`] lanes, the target's logit or 0). As
/// [`super::crossentropy::crossentropy_chunk_stats`].
pub fn crossentropy_chunk_stats(stats: &mut [f32], logits: &[f32], targets: &[u32], chunk: &VocabChunk) {
    const OP: &str = "crossentropy_chunk_stats";
    chunk.assert_fits(OP, logits.len(), targets.len());
    let stats_row = chunk.n_chunks * 3;
    assert!(
        stats.len() >= chunk.rows * stats_row,
        "{OP}: stats hold {} elements, {} rows x {} chunks x 3 needed",
        stats.len(),
        chunk.rows,
        chunk.n_chunks
    );
    let columns = chunk.start..chunk.start + chunk.cols;
    // Row r's triple is in row r's stretch of stats: one task per row writes only its own.
    stats[..chunk.rows * stats_row].par_chunks_mut(stats_row).zip(targets[..chunk.rows].par_iter()).enumerate().for_each(
        |(row, (row_stats, &target))| {
            let x = &logits[chunk.at(row, 0)..chunk.at(row, chunk.cols)];
            let max = fast_math::max(x);
            let sum = fast_math::sum_exp_shifted(x, max);
            let target = target as usize;
            let target_logit = if columns.contains(&target) { x[target - chunk.start] } else { 0.0 };
            row_stats[chunk.index * 3..chunk.index * 3 + 3].copy_from_slice(&[max, sum, target_logit]);
        },
    );
}

/// d(loss)/d(logits) of one vocabulary chunk, in place: x <- (exp(x - lse[row]) - onehot(target)) *
/// grad_scale. As [`super::crossentropy::crossentropy_chunk_grad`].
pub fn crossentropy_chunk_grad(logits: &mut [f32], lse: &[f32], targets: &[u32], chunk: &VocabChunk, grad_scale: f32) {
    const OP: &str = "crossentropy_chunk_grad";
    chunk.assert_fits(OP, logits.len(), targets.len());
    assert!(lse.len() >= chunk.rows, "{OP}: lse holds {} values for {} rows", lse.len(), chunk.rows);
    if chunk.rows == 0 {
        return;
    }
    let columns = chunk.start..chunk.start + chunk.cols;
    // Rows of row_stride elements from the chunk's first; the last may end right after its columns.
    let span = chunk.at(0, 0)..chunk.at(chunk.rows - 1, chunk.cols);
    logits[span].par_chunks_mut(chunk.row_stride).zip(lse.par_iter().zip(targets.par_iter())).for_each(|(row, (&row_lse, &target))| {
        let x = &mut row[..chunk.cols];
        let target = target as usize;
        let target_logit = columns.contains(&target).then(|| x[target - chunk.start]);
        fast_math::exp_affine(x, 1.0, row_lse, grad_scale);
        if let Some(logit) = target_logit {
            x[target - chunk.start] = (fast_math::exp(logit - row_lse) - 1.0) * grad_scale;
        }
    });
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

    use crate::ops::crossentropy as twin;

    /// (rows, V, chunk columns): chunk widths that do not divide V (the last chunk is shorter).
    const CHUNKED_SHAPES: [(usize, usize, usize); 6] =
        [(1, 1, 1), (3, 17, 5), (37, 17, 16), (3, 1001, 300), (37, 1001, 1000), (3, 50257, 8192)];

    /// Both layouts of chunk `index`: a window of the whole (rows, V) matrix, and a chunk-sized scratch.
    fn layouts(rows: usize, vocab: usize, chunk_cols: usize, index: usize) -> [VocabChunk; 2] {
        let n_chunks = vocab.div_ceil(chunk_cols);
        let start = index * chunk_cols;
        let cols = chunk_cols.min(vocab - start);
        let whole = VocabChunk { rows, start, cols, index, n_chunks, offset: start, row_stride: vocab };
        [whole, VocabChunk { offset: 0, row_stride: cols, ..whole }]
    }

    /// Every chunk's stats and gradient of one case, by `stats_op` and `grad_op`, in both layouts:
    /// (the whole matrix's stats and gradient, the scratch layout's).
    type StatsOp = fn(&mut [f32], &[f32], &[u32], &VocabChunk);
    type GradOp = fn(&mut [f32], &[f32], &[u32], &VocabChunk, f32);
    fn chunked(rows: usize, vocab: usize, chunk_cols: usize, stats_op: StatsOp, grad_op: GradOp) -> [(Vec<f32>, Vec<f32>); 2] {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64((rows * 100_003 + vocab) as u64);
        let logits: Vec<f32> = (0..rows * vocab).map(|_| rng.random_range(-8.0f32..8.0)).collect();
        let targets: Vec<u32> = (0..rows).map(|_| rng.random_range(0..vocab as u32)).collect();
        let n_chunks = vocab.div_ceil(chunk_cols);
        let (mut whole_stats, mut scratch_stats) = (vec![0.0; rows * n_chunks * 3], vec![0.0; rows * n_chunks * 3]);
        let (mut whole_grad, mut scratch_grad) = (logits.clone(), logits.clone());
        for index in 0..n_chunks {
            let [whole, scratch] = layouts(rows, vocab, chunk_cols, index);
            stats_op(&mut whole_stats, &logits, &targets, &whole);
            let scratch_of = |m: &[f32]| (0..rows).flat_map(|r| m[whole.at(r, 0)..whole.at(r, whole.cols)].to_vec()).collect::<Vec<f32>>();
            stats_op(&mut scratch_stats, &scratch_of(&logits), &targets, &scratch);
            assert_eq!(whole_stats, scratch_stats, "rows={rows} V={vocab} chunk {index}: the layout changed the stats");
        }
        let (lse, _) = twin::crossentropy_combine(&whole_stats, targets.len(), n_chunks);
        for index in 0..n_chunks {
            let [whole, scratch] = layouts(rows, vocab, chunk_cols, index);
            grad_op(&mut whole_grad, &lse, &targets, &whole, 0.25);
            let mut buf: Vec<f32> = (0..rows).flat_map(|r| logits[whole.at(r, 0)..whole.at(r, whole.cols)].to_vec()).collect();
            grad_op(&mut buf, &lse, &targets, &scratch, 0.25);
            for r in 0..rows {
                scratch_grad[whole.at(r, 0)..whole.at(r, whole.cols)].copy_from_slice(&buf[r * whole.cols..(r + 1) * whole.cols]);
            }
        }
        [(whole_stats, whole_grad), (scratch_stats, scratch_grad)]
    }

    #[test]
    fn fast_chunked_crossentropy_matches_twins() {
        for (rows, vocab, chunk_cols) in CHUNKED_SHAPES {
            let want = chunked(rows, vocab, chunk_cols, twin::crossentropy_chunk_stats, twin::crossentropy_chunk_grad);
            let got = chunked(rows, vocab, chunk_cols, crossentropy_chunk_stats, crossentropy_chunk_grad);
            for ((got_stats, got_grad), (want_stats, want_grad)) in got.iter().zip(&want) {
                for (i, (g, w)) in got_stats.iter().zip(want_stats).enumerate() {
                    // Maxima and target logits are exact; sums of exp within the fast exp's ulps.
                    let tol = if i % 3 == 1 { 2e-5 * w.abs() } else { 0.0 };
                    assert!((g - w).abs() <= tol, "rows={rows} V={vocab} cols={chunk_cols} stats[{i}]: {g} vs {w}");
                }
                for (i, (g, w)) in got_grad.iter().zip(want_grad).enumerate() {
                    assert!((g - w).abs() <= 1e-6 + 2e-5 * w.abs(), "rows={rows} V={vocab} cols={chunk_cols} grad[{i}]: {g} vs {w}");
                }
            }
        }
    }

    /// The chunks' combined loss and gradient are the whole-row op's (within rounding).
    #[test]
    fn fast_chunks_combine_to_the_whole_row_crossentropy() {
        for (rows, vocab, chunk_cols) in CHUNKED_SHAPES {
            let [(stats, grad), _] = chunked(rows, vocab, chunk_cols, crossentropy_chunk_stats, crossentropy_chunk_grad);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64((rows * 100_003 + vocab) as u64);
            let mut logits: Vec<f32> = (0..rows * vocab).map(|_| rng.random_range(-8.0f32..8.0)).collect();
            let targets: Vec<u32> = (0..rows).map(|_| rng.random_range(0..vocab as u32)).collect();
            let (_, chunk_losses) = twin::crossentropy_combine(&stats, targets.len(), vocab.div_ceil(chunk_cols));
            let mut losses = vec![0.0; rows];
            crossentropy(&mut losses, &mut logits, &targets, vocab, Some(0.25));
            for (g, w) in chunk_losses.iter().zip(&losses) {
                assert!((g - w).abs() <= 2e-5 * (1.0 + w.abs()), "rows={rows} V={vocab}: loss {g} vs {w}");
            }
            for (i, (g, w)) in grad.iter().zip(&logits).enumerate() {
                assert!((g - w).abs() <= 1e-6 + 2e-5 * w.abs(), "rows={rows} V={vocab} [{i}]: {g} vs {w}");
            }
        }
    }

    #[test]
    fn fast_chunked_crossentropy_bits_do_not_depend_on_the_thread_count() {
        let (rows, vocab, chunk_cols) = (37, 1001, 300);
        let run = || chunked(rows, vocab, chunk_cols, crossentropy_chunk_stats, crossentropy_chunk_grad);
        let bits = |r: [(Vec<f32>, Vec<f32>); 2]| r.iter().flat_map(|(s, g)| s.iter().chain(g).map(|v| v.to_bits())).collect::<Vec<u32>>();
        let one = bits(rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a pool").install(run));
        for threads in [2, 3] {
            let many = bits(rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool").install(run));
            assert!(one == many, "{threads} threads changed the bits");
        }
    }

    #[test]
    #[should_panic(expected = "crossentropy_chunk_stats: logits hold 20 elements, the chunk reaches element 21")]
    fn a_chunk_past_the_logits_is_refused_by_name() {
        let chunk = VocabChunk { rows: 2, start: 5, cols: 6, index: 1, n_chunks: 2, offset: 5, row_stride: 10 };
        crossentropy_chunk_stats(&mut [0.0; 12], &[0.0; 20], &[0, 1], &chunk);
    }

    #[test]
    #[should_panic(expected = "crossentropy_chunk_grad: row_stride 4 < cols 5")]
    fn overlapping_rows_are_refused() {
        let chunk = VocabChunk { rows: 2, start: 0, cols: 5, index: 0, n_chunks: 1, offset: 0, row_stride: 4 };
        crossentropy_chunk_grad(&mut [0.0; 20], &[0.0; 2], &[0, 1], &chunk, 1.0);
    }
}
