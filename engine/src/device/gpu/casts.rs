//! The gpu device's casts between f32 and halves packed two per u32 word: f16 rounding for the
//! cooperative-matrix matmul's operands, f16 and bf16 widening for 16-bit uploads and slots.

use std::ops::Range;

use super::{GpuDevice, GpuTensor, HalfFormat, Window, shaders};
use crate::ops::matmul::Operand;
use crate::ops::matmul_f16::PackedShape;

impl GpuDevice {
    /// out (u32 words, two f16 per word) = f16(x[..n]), round to nearest even.
    pub fn cast_f32_to_f16(&self, out_words: &GpuTensor, x: &GpuTensor, n: usize) {
        for r in Self::pieces(n, self.max_window_elems, 2 * self.align_elems) {
            let xw = self.window(x, r.clone());
            let ow = self.window(out_words, r.start / 2..r.end.div_ceil(2));
            self.dispatch(
                shaders::CAST_F32_TO_F16,
                "main",
                &[r.len() as u32, xw.elem_offset, ow.elem_offset, 0],
                &[(1, xw.binding), (2, ow.binding)],
                Self::elementwise_grid(r.len().div_ceil(2)),
            );
        }
    }

    /// The f16 tensor `out` from half `out_start` (even) = `x[span]` rounded to f16, as [`Self::cast_f32_to_f16`].
    pub(super) fn cast_span_to_f16(&self, out: &GpuTensor, out_start: usize, x: &GpuTensor, span: Range<usize>) {
        debug_assert!(out_start.is_multiple_of(2) && out.format == Some(HalfFormat::F16));
        if span.is_empty() {
            return;
        }
        for r in Self::pieces(span.len(), self.max_window_elems, 2 * self.align_elems) {
            let xw = self.window(x, span.start + r.start..span.start + r.end);
            let ow = self.packed_window(out, out_start + r.start..out_start + r.end);
            self.dispatch(
                shaders::CAST_F32_TO_F16,
                "main",
                &[r.len() as u32, xw.elem_offset, ow.elem_offset / 2, 0],
                &[(1, xw.binding), (2, ow.binding)],
                Self::elementwise_grid(r.len().div_ceil(2)),
            );
        }
    }

    /// `out_words` (a plain tensor of u32 words, two halves each) from word 0 = the operand `op` addresses
    /// in `x` (f32, f16 or bf16), rounded to f16 and laid out as `shape` says (`pack_f16.wgsl`; the twin is
    /// `ops::matmul_f16::pack_f16`). The operand and the output must each fit one binding.
    pub fn pack_f16(&self, out_words: &GpuTensor, x: &GpuTensor, op: &Operand, shape: &PackedShape) {
        let out = self.window(out_words, 0..(shape.rows_pad * shape.cols_pad).div_ceil(2));
        let word_offset = out.elem_offset;
        self.dispatch_pack_f16(out, word_offset, x, op, shape);
    }

    /// [`Self::pack_f16`] into the f16 tensor `out` from half `out_start` (even).
    pub(super) fn pack_f16_into(&self, out: &GpuTensor, out_start: usize, x: &GpuTensor, op: &Operand, shape: &PackedShape) {
        debug_assert!(out_start.is_multiple_of(2) && out.format == Some(HalfFormat::F16));
        let window = self.packed_window(out, out_start..out_start + shape.rows_pad * shape.cols_pad);
        let word_offset = window.elem_offset / 2;
        self.dispatch_pack_f16(window, word_offset, x, op, shape);
    }

    fn dispatch_pack_f16(&self, out: Window, out_word_offset: u32, x: &GpuTensor, op: &Operand, shape: &PackedShape) {
        assert!(shape.cols_pad.is_multiple_of(2), "pack_f16: an odd padded row ({shape:?})");
        let xw = self.packed_window(x, op.span(0..shape.rows, 0..shape.cols));
        let params = [
            shape.rows as u32,
            shape.cols as u32,
            shape.rows_pad as u32,
            shape.cols_pad as u32,
            xw.elem_offset,
            op.row_stride as u32,
            op.col_stride as u32,
            x.format_code(),
            out_word_offset,
            0,
            0,
            0,
        ];
        let bindings = [(1, xw.binding), (2, out.binding)];
        match pack_tiles(op, shape) {
            Some(tiles) => self.dispatch(shaders::PACK_F16, "transposed", &params, &bindings, tiles),
            None => {
                self.dispatch(shaders::PACK_F16, "main", &params, &bindings, Self::elementwise_grid(shape.rows_pad * shape.cols_pad / 2))
            }
        }
    }

    /// out[..n] = f32 of the halves packed in `x_words`.
    pub fn cast_f16_to_f32(&self, out: &GpuTensor, x_words: &GpuTensor, n: usize) {
        self.widen_halves(HalfFormat::F16, out, x_words, n)
    }

    /// out (f32) = bf16 values packed two per u32 word (exact).
    pub fn cast_bf16_to_f32(&self, out: &GpuTensor, x_words: &GpuTensor, n: usize) {
        self.widen_halves(HalfFormat::Bf16, out, x_words, n)
    }

    fn widen_halves(&self, format: HalfFormat, out: &GpuTensor, x_words: &GpuTensor, n: usize) {
        for r in Self::pieces(n, self.max_window_elems, 2 * self.align_elems) {
            let xw = self.window(x_words, r.start / 2..r.end.div_ceil(2));
            let ow = self.window(out, r.clone());
            self.dispatch(
                shaders::CAST_HALF_TO_F32,
                "main",
                &[r.len() as u32, xw.elem_offset, ow.elem_offset, (format == HalfFormat::Bf16) as u32],
                &[(1, xw.binding), (2, ow.binding)],
                Self::elementwise_grid(r.len().div_ceil(2)),
            );
        }
    }
}

/// `pack_f16.wgsl`'s tile of its `transposed` entry point: out rows by halves.
const PACK_TILE: [usize; 2] = [32, 64];

/// The grid of `pack_f16.wgsl`'s `transposed` entry point (one workgroup per tile of out), where the
/// operand lies down its columns (`row_stride < col_stride`, as a dW product's transposed operand), so
/// that `main`'s invocations, one word of out each, would read elements a column apart; None where the
/// operand lies along its rows, or the tiles would pass the grid's limit (`main` then: the same bits).
fn pack_tiles(op: &Operand, shape: &PackedShape) -> Option<[u32; 3]> {
    let [tile_rows, tile_cols] = PACK_TILE;
    let grid = [shape.cols_pad.div_ceil(tile_cols), shape.rows_pad.div_ceil(tile_rows)];
    (op.row_stride < op.col_stride && grid.iter().all(|&g| g <= crate::ops::MAX_GRID_DIM)).then(|| [grid[0] as u32, grid[1] as u32, 1])
}
