//! The gpu device's cross-entropy dispatches: the fused whole-row op (`crossentropy.wgsl`) and the two
//! ops of the vocabulary-chunked one (`crossentropy_chunk_stats.wgsl`, `crossentropy_chunk_grad.wgsl`),
//! behind the [`Backend`] methods of the same names (whose docs give the shapes).
//!
//! Every tensor is bound as a window that fits one binding. A chunk is cut into pieces of rows and,
//! when one row of it is wider than a binding, of columns: a piece's logits window runs from its first
//! row's first column to its last row's last column, so rows per piece follow from `row_stride` (the
//! vocabulary when the chunk is a window of the whole matrix). Column pieces of the statistics run in
//! column order, each folding its (max, sum) into the stored one. A child module of `gpu`, so it uses
//! that file's private helpers.
//!
//! [`Backend`]: crate::device::Backend

use std::ops::Range;

use super::{GpuDevice, GpuTensor, GpuTokens, VocabChunk};
use zerostream_shaders as shaders;

/// One dispatch's share of a chunk: rows and columns (both relative to the chunk).
struct ChunkPiece {
    rows: Range<usize>,
    cols: Range<usize>,
}

impl GpuDevice {
    pub(super) fn dispatch_crossentropy(
        &self,
        losses: &GpuTensor,
        logits: &GpuTensor,
        targets: &GpuTokens,
        vocab: usize,
        grad_scale: Option<f32>,
    ) {
        let rows = targets.ids.len;
        for r in Self::pieces(rows, self.rows_per_piece(vocab), 1) {
            let lw = self.window(logits, r.start * vocab..r.end * vocab);
            let params = [
                r.len() as u32,
                vocab as u32,
                lw.elem_offset,
                r.start as u32,
                grad_scale.unwrap_or(0.0).to_bits(),
                grad_scale.is_some() as u32,
                0,
                0,
            ];
            self.dispatch(
                shaders::CROSSENTROPY,
                "main",
                &params,
                &[(1, lw.binding), (2, targets.ids.buffer.as_entire_buffer_binding()), (3, losses.buffer.as_entire_buffer_binding())],
                Self::grid(r.len()),
            );
        }
    }

    pub(super) fn dispatch_crossentropy_chunk_stats(&self, stats: &GpuTensor, logits: &GpuTensor, targets: &GpuTokens, chunk: &VocabChunk) {
        const OP: &str = "crossentropy_chunk_stats";
        chunk.assert_fits(OP, logits.len, targets.ids.len);
        let stats_row = chunk.n_chunks * 3;
        assert!(
            stats.len >= chunk.rows * stats_row,
            "{OP}: stats hold {} elements, {} rows x {} chunks x 3 needed",
            stats.len,
            chunk.rows,
            chunk.n_chunks
        );
        // A row's triple and the next row's are stats_row apart: that bounds the rows of a piece too.
        for piece in self.chunk_pieces(chunk, stats_row) {
            let (rows, cols) = (&piece.rows, &piece.cols);
            let lw = self.window(logits, chunk.at(rows.start, cols.start)..chunk.at(rows.end - 1, cols.end));
            let first_triple = rows.start * stats_row + chunk.index * 3;
            let sw = self.window(stats, first_triple..first_triple + (rows.len() - 1) * stats_row + 3);
            let tw = self.window(&targets.ids, rows.clone());
            let params = [
                rows.len() as u32,
                cols.len() as u32,
                lw.elem_offset,
                chunk.row_stride as u32,
                sw.elem_offset,
                stats_row as u32,
                tw.elem_offset,
                (chunk.start + cols.start) as u32,
                (cols.start > 0) as u32, // later column pieces fold into the first's triple
                0,
                0,
                0,
            ];
            let bindings = [(1, lw.binding), (2, tw.binding), (3, sw.binding)];
            self.dispatch(shaders::CROSSENTROPY_CHUNK_STATS, "main", &params, &bindings, Self::grid(rows.len()));
        }
    }

    pub(super) fn dispatch_crossentropy_chunk_grad(
        &self,
        logits: &GpuTensor,
        lse: &GpuTensor,
        targets: &GpuTokens,
        chunk: &VocabChunk,
        grad_scale: f32,
    ) {
        const OP: &str = "crossentropy_chunk_grad";
        chunk.assert_fits(OP, logits.len, targets.ids.len);
        assert!(lse.len >= chunk.rows, "{OP}: lse holds {} values for {} rows", lse.len, chunk.rows);
        for piece in self.chunk_pieces(chunk, 1) {
            let (rows, cols) = (&piece.rows, &piece.cols);
            let lw = self.window(logits, chunk.at(rows.start, cols.start)..chunk.at(rows.end - 1, cols.end));
            let (ew, tw) = (self.window(lse, rows.clone()), self.window(&targets.ids, rows.clone()));
            let params = [
                rows.len() as u32,
                cols.len() as u32,
                lw.elem_offset,
                chunk.row_stride as u32,
                ew.elem_offset,
                tw.elem_offset,
                (chunk.start + cols.start) as u32,
                grad_scale.to_bits(),
            ];
            let bindings = [(1, lw.binding), (2, tw.binding), (3, ew.binding)];
            self.dispatch(shaders::CROSSENTROPY_CHUNK_GRAD, "main", &params, &bindings, Self::grid(rows.len()));
        }
    }

    /// The pieces of a chunk, column pieces outermost (in column order, as the statistics' folding
    /// needs), each split into rows whose windows fit one binding: the logits from the first row's
    /// first column to the last row's last column, and a per-row tensor whose rows are
    /// `per_row_stride` elements apart (lse and targets: 1; the stats: 3 x chunks).
    fn chunk_pieces(&self, chunk: &VocabChunk, per_row_stride: usize) -> Vec<ChunkPiece> {
        let max = self.max_window_elems;
        let mut pieces = Vec::new();
        if chunk.rows == 0 {
            return pieces;
        }
        for cols in Self::pieces(chunk.cols, max, 1) {
            // (rows - 1) * stride + width <= max, for the logits (width: the columns) and the per-row
            // tensor (width: one triple at most), and at most `max` rows for lse and targets.
            let logits_rows = 1 + (max - cols.len()) / chunk.row_stride;
            let per_row_rows = 1 + max.saturating_sub(3) / per_row_stride;
            let rows_per_piece = logits_rows.min(per_row_rows).min(max);
            pieces.extend(Self::pieces(chunk.rows, rows_per_piece, 1).into_iter().map(|rows| ChunkPiece { rows, cols: cols.clone() }));
        }
        pieces
    }
}
