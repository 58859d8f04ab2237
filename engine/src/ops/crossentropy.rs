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

/// One vocabulary chunk of a (rows, V) logits matrix: columns `start .. start + cols` (vocabulary ids),
/// chunk number `index` of `n_chunks`, stored from element `offset` with `row_stride` elements between
/// rows (V when the whole matrix is kept, `cols` for a chunk-sized scratch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VocabChunk {
    pub rows: usize,
    pub start: usize,
    pub cols: usize,
    pub index: usize,
    pub n_chunks: usize,
    pub offset: usize,
    pub row_stride: usize,
}

impl VocabChunk {
    /// Element index of (row, column within the chunk).
    pub fn at(&self, row: usize, col: usize) -> usize {
        self.offset + row * self.row_stride + col
    }

    /// Panics with a message naming `op` and the tensor when the chunk is not a window of `logits_len`
    /// elements (rows that overlap, columns or rows past the end), its index is not below `n_chunks`, or
    /// `targets_len` holds fewer targets than it has rows. The devices' fast kernels check this before
    /// touching memory (the GPU's bindings would otherwise be clamped, not refused).
    pub fn assert_fits(&self, op: &str, logits_len: usize, targets_len: usize) {
        assert!(self.cols >= 1, "{op}: a vocabulary chunk needs at least one column");
        assert!(self.row_stride >= self.cols, "{op}: row_stride {} < cols {} (rows would overlap)", self.row_stride, self.cols);
        assert!(self.index < self.n_chunks, "{op}: chunk index {} of {} chunks", self.index, self.n_chunks);
        assert!(targets_len >= self.rows, "{op}: targets hold {targets_len} ids for {} rows", self.rows);
        if self.rows > 0 {
            let end = self.at(self.rows - 1, self.cols);
            assert!(end <= logits_len, "{op}: logits hold {logits_len} elements, the chunk reaches element {end}");
        }
    }
}

/// Per row of one vocabulary chunk of logits: `stats[(row * n_chunks + index) * 3 ..]` = (the chunk's
/// maximum m, sum over the chunk of exp(x - m) in column order, the target's logit if the target is in
/// the chunk else 0). [`crossentropy_combine`] turns every chunk's stats into the loss. Twin of
/// `crossentropy_chunk_stats.wgsl`.
pub fn crossentropy_chunk_stats(stats: &mut [f32], logits: &[f32], targets: &[u32], chunk: &VocabChunk) {
    assert!(stats.len() >= chunk.rows * chunk.n_chunks * 3, "crossentropy_chunk_stats: stats too short");
    let per_row: Vec<[f32; 3]> = (0..chunk.rows)
        .into_par_iter()
        .map(|row| {
            let x = &logits[chunk.at(row, 0)..chunk.at(row, 0) + chunk.cols];
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = x.iter().map(|v| (v - max).exp()).sum();
            let target = targets[row] as usize;
            let target_logit = if (chunk.start..chunk.start + chunk.cols).contains(&target) { x[target - chunk.start] } else { 0.0 };
            [max, sum, target_logit]
        })
        .collect();
    for (row, s) in per_row.iter().enumerate() {
        let at = (row * chunk.n_chunks + chunk.index) * 3;
        stats[at..at + 3].copy_from_slice(s);
    }
}

/// The logits' log-sum-exp and the loss of each of `rows` rows from every chunk's
/// [`crossentropy_chunk_stats`]: M = max of the chunks' maxima, S = sum over chunks in order of
/// s_j * exp(m_j - M), lse = M + ln S, loss = lse - the target's logit (the sum of the chunks' third
/// values: only the target's chunk has a nonzero one, so the sum is exact). Plain host arithmetic, the
/// same on every device.
pub fn crossentropy_combine(stats: &[f32], rows: usize, n_chunks: usize) -> (Vec<f32>, Vec<f32>) {
    assert!(stats.len() >= rows * n_chunks * 3, "crossentropy_combine: stats too short");
    let (mut lse, mut losses) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for s in stats[..rows * n_chunks * 3].chunks_exact(n_chunks * 3) {
        let max = s.chunks_exact(3).map(|c| c[0]).fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = s.chunks_exact(3).map(|c| c[1] * (c[0] - max).exp()).sum();
        let target_logit: f32 = s.chunks_exact(3).map(|c| c[2]).sum();
        let row_lse = max + sum.ln();
        lse.push(row_lse);
        losses.push(row_lse - target_logit);
    }
    (lse, losses)
}

/// d(loss)/d(logits) of one vocabulary chunk, in place: x <- (exp(x - lse[row]) - onehot(target)) *
/// grad_scale. Twin of `crossentropy_chunk_grad.wgsl`.
pub fn crossentropy_chunk_grad(logits: &mut [f32], lse: &[f32], targets: &[u32], chunk: &VocabChunk, grad_scale: f32) {
    logits[chunk.offset..].par_chunks_mut(chunk.row_stride).take(chunk.rows).enumerate().for_each(|(row, r)| {
        let x = &mut r[..chunk.cols];
        let target = targets[row] as usize;
        for (c, v) in x.iter_mut().enumerate() {
            let onehot = if chunk.start + c == target { 1.0 } else { 0.0 };
            *v = ((*v - lse[row]).exp() - onehot) * grad_scale;
        }
    });
}
