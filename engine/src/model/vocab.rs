//! The vocabulary side every family shares, in fixed chunks of vocabulary rows: the output projection
//! logits (BT, V) = h (BT, C) @ W^T with W (V, C) (the lm_head, or the embedding when tied), the
//! softmax cross-entropy over the chunks, and their backward.
//!
//! The chunk size is part of what is computed (the loss is combined from per-chunk statistics, and
//! d(h) sums the chunks' products in order), never of where bytes are: a run computes the same bits
//! whether W is resident on the device whole ([`Rows::Whole`]) or uploaded a chunk at a time into a
//! chunk-sized slot ([`Rows::Chunk`]), and whether the logits of every chunk are kept or each chunk's
//! are recomputed for the backward.

use std::ops::Range;

use anyhow::Result;

use crate::device::{Backend, MatmulShape, Operand, VocabChunk};
use crate::ops::crossentropy::crossentropy_combine;

/// Vocabulary rows per chunk unless a run says otherwise (`TrainConfig::vocab_chunk_rows`).
pub const DEFAULT_CHUNK_ROWS: usize = 8192;

/// How a vocabulary of `vocab` ids is cut: chunks of `rows_per_chunk` ids, the last one shorter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VocabChunks {
    pub vocab: usize,
    pub rows_per_chunk: usize,
}

impl VocabChunks {
    pub fn new(vocab: usize, rows_per_chunk: usize) -> Self {
        VocabChunks { vocab, rows_per_chunk: rows_per_chunk.clamp(1, vocab.max(1)) }
    }
    pub fn count(&self) -> usize {
        self.vocab.div_ceil(self.rows_per_chunk)
    }
    /// The vocabulary ids of chunk `j`.
    pub fn range(&self, j: usize) -> Range<usize> {
        j * self.rows_per_chunk..((j + 1) * self.rows_per_chunk).min(self.vocab)
    }
}

/// Where chunk j's rows of W (V, C) are on the device.
pub enum Rows<'a, T> {
    /// The whole matrix: chunk j's rows start at row j * rows_per_chunk.
    Whole(&'a T),
    /// A chunk-sized tensor holding only chunk j's rows.
    Chunk(&'a T),
}

impl<T> Clone for Rows<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Rows<'_, T> {}

impl<'a, T> Rows<'a, T> {
    /// The tensor and the element offset of chunk j's first row, for rows `width` wide.
    fn at(&self, chunks: &VocabChunks, j: usize, width: usize) -> (&'a T, usize) {
        match *self {
            Rows::Whole(t) => (t, chunks.range(j).start * width),
            Rows::Chunk(t) => (t, 0),
        }
    }
}

/// The device buffers of the loss for BT rows: the logits (every chunk's, (BT, V), when kept; one
/// chunk's, (BT, rows_per_chunk), when each chunk's are recomputed for the backward), the per-chunk
/// statistics (BT, chunks, 3) and the log-sum-exp (BT).
pub struct LossActs<T> {
    pub chunks: VocabChunks,
    pub rows: usize,
    pub keep_logits: bool,
    logits: T,
    stats: T,
    lse: T,
}

impl<T> LossActs<T> {
    pub fn new<D: Backend<Tensor = T>>(dev: &D, chunks: VocabChunks, rows: usize, keep_logits: bool) -> Result<Self> {
        let cols = if keep_logits { chunks.vocab } else { chunks.rows_per_chunk };
        Ok(LossActs {
            chunks,
            rows,
            keep_logits,
            logits: dev.alloc(rows * cols, "logits")?,
            stats: dev.alloc(rows * chunks.count() * 3, "cross-entropy chunk statistics")?,
            lse: dev.alloc(rows, "cross-entropy log-sum-exp")?,
        })
    }

    /// The f32 element counts of [`LossActs::new`]'s tensors, for the plan.
    pub fn tensor_lens(chunks: VocabChunks, rows: usize, keep_logits: bool) -> [usize; 3] {
        let cols = if keep_logits { chunks.vocab } else { chunks.rows_per_chunk };
        [rows * cols, rows * chunks.count() * 3, rows]
    }

    /// Every chunk's logits (BT, V), or their gradient after [`grad_chunk`] ran on each; None when only
    /// one chunk's are kept.
    pub fn logits(&self) -> Option<&T> {
        self.keep_logits.then_some(&self.logits)
    }

    /// Chunk j of the logits buffer.
    pub fn chunk(&self, j: usize) -> VocabChunk {
        let ids = self.chunks.range(j);
        let (offset, row_stride) = if self.keep_logits { (ids.start, self.chunks.vocab) } else { (0, self.chunks.rows_per_chunk) };
        VocabChunk { rows: self.rows, start: ids.start, cols: ids.len(), index: j, n_chunks: self.chunks.count(), offset, row_stride }
    }
}

/// Logits of chunk j (BT, cols) = h (BT, C) @ W_j^T, and the chunk's cross-entropy statistics.
pub fn forward_chunk<D: Backend>(
    dev: &D,
    acts: &LossActs<D::Tensor>,
    h: &D::Tensor,
    w: Rows<'_, D::Tensor>,
    targets: &D::Tokens,
    j: usize,
    width: usize,
) {
    logits_chunk(dev, acts, h, w, j, width);
    dev.crossentropy_chunk_stats(&acts.stats, &acts.logits, targets, &acts.chunk(j));
}

/// Logits of chunk j (BT, cols) = h (BT, C) @ W_j^T (again, for the backward, when only one chunk's
/// are kept: the same product, the same bits).
pub fn logits_chunk<D: Backend>(dev: &D, acts: &LossActs<D::Tensor>, h: &D::Tensor, w: Rows<'_, D::Tensor>, j: usize, width: usize) {
    let chunk = acts.chunk(j);
    let (w, w_offset) = w.at(&acts.chunks, j, width);
    let shape = MatmulShape {
        m: acts.rows,
        n: chunk.cols,
        k: width,
        a: Operand::row_major(width),
        b: Operand { offset: w_offset, row_stride: 1, col_stride: width },
        c: Operand { offset: chunk.offset, row_stride: chunk.row_stride, col_stride: 1 },
    };
    dev.matmul(&acts.logits, h, w, None, &shape, false);
}

/// The mean loss over the rows from every chunk's statistics ([`forward_chunk`] on each first); the
/// log-sum-exp is left on the device for [`grad_chunk`].
pub fn finish_loss<D: Backend>(dev: &D, acts: &LossActs<D::Tensor>) -> f32 {
    let stats = dev.read(&acts.stats);
    let (lse, losses) = crossentropy_combine(&stats, acts.rows, acts.chunks.count());
    dev.write(&acts.lse, &lse);
    (losses.iter().map(|&x| x as f64).sum::<f64>() / acts.rows as f64) as f32
}

/// Chunk j's logits overwritten by d(loss)/d(logits) for a total of `loss_grad_scale` x the mean loss.
pub fn grad_chunk<D: Backend>(dev: &D, acts: &LossActs<D::Tensor>, targets: &D::Tokens, j: usize, loss_grad_scale: f32) {
    dev.crossentropy_chunk_grad(&acts.logits, &acts.lse, targets, &acts.chunk(j), loss_grad_scale / acts.rows as f32);
}

/// Backward of chunk j's projection (its logits holding their gradient): d_h (BT, C) = (the `first`
/// chunk of the backward) or += (later ones) dlogits_j @ W_j, and dW_j = (or += with `accumulate_dw`)
/// dlogits_j^T @ h.
#[allow(clippy::too_many_arguments)]
pub fn backward_chunk<D: Backend>(
    dev: &D,
    acts: &LossActs<D::Tensor>,
    h: &D::Tensor,
    d_h: &D::Tensor,
    w: Rows<'_, D::Tensor>,
    dw: Rows<'_, D::Tensor>,
    accumulate_dw: bool,
    j: usize,
    first: bool,
    width: usize,
) {
    let chunk = acts.chunk(j);
    let dlogits = Operand { offset: chunk.offset, row_stride: chunk.row_stride, col_stride: 1 };
    let (w, w_offset) = w.at(&acts.chunks, j, width);
    let dh = MatmulShape {
        m: acts.rows,
        n: width,
        k: chunk.cols,
        a: dlogits,
        b: Operand { offset: w_offset, row_stride: width, col_stride: 1 },
        c: Operand::row_major(width),
    };
    dev.matmul(d_h, &acts.logits, w, None, &dh, !first);
    let (dw, dw_offset) = dw.at(&acts.chunks, j, width);
    let dw_shape = MatmulShape {
        m: chunk.cols,
        n: width,
        k: acts.rows,
        a: Operand { offset: chunk.offset, row_stride: 1, col_stride: chunk.row_stride },
        b: Operand::row_major(width),
        c: Operand { offset: dw_offset, row_stride: width, col_stride: 1 },
    };
    dev.matmul(dw, &acts.logits, h, None, &dw_shape, accumulate_dw);
}

/// The loss of a resident head: every chunk's logits from W resident whole (kept in `acts`), the mean
/// loss, and with `loss_grad_scale` every chunk's logits replaced by their gradient.
pub fn resident_forward<D: Backend>(
    dev: &D,
    acts: &LossActs<D::Tensor>,
    h: &D::Tensor,
    w: &D::Tensor,
    targets: &D::Tokens,
    width: usize,
    loss_grad_scale: Option<f32>,
) -> f32 {
    assert!(acts.keep_logits, "a resident head keeps every chunk's logits");
    for j in 0..acts.chunks.count() {
        forward_chunk(dev, acts, h, Rows::Whole(w), targets, j, width);
    }
    let loss = finish_loss(dev, acts);
    if let Some(scale) = loss_grad_scale {
        for j in 0..acts.chunks.count() {
            grad_chunk(dev, acts, targets, j, scale);
        }
    }
    loss
}

/// Backward of [`resident_forward`]: d_h from every chunk (in reverse chunk order, as the trainer
/// streams them), and dW += into the resident gradient.
pub fn resident_backward<D: Backend>(
    dev: &D,
    acts: &LossActs<D::Tensor>,
    h: &D::Tensor,
    d_h: &D::Tensor,
    w: &D::Tensor,
    dw: &D::Tensor,
    width: usize,
) {
    for (i, j) in (0..acts.chunks.count()).rev().enumerate() {
        backward_chunk(dev, acts, h, d_h, Rows::Whole(w), Rows::Whole(dw), true, j, i == 0, width);
    }
}
