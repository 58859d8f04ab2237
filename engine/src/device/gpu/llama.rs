//! The gpu device's Llama kernels: RMSNorm, RoPE and SwiGLU, the dispatches behind the [`Backend`]
//! methods of the same names (whose docs give the shapes).
//!
//! Like the row ops in `gpu.rs`, each op splits its rows into pieces whose windows fit one binding
//! (`rows_per_piece`), binds windows of the row-shaped tensors and passes their element offsets in the
//! Params; per-column tensors (weights, inverse frequencies) are bound whole. A child module of `gpu`, so
//! it uses that file's private helpers.
//!
//! [`Backend`]: crate::device::Backend

use super::{GpuDevice, GpuTensor};
use zerostream_shaders as shaders;

impl GpuDevice {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_rmsnorm_forward(
        &self,
        out: &GpuTensor,
        rstd: &GpuTensor,
        x: &GpuTensor,
        weight: &GpuTensor,
        rows: usize,
        channels: usize,
        eps: f32,
    ) {
        for r in Self::pieces(rows, self.rows_per_piece(channels), 1) {
            let span = r.start * channels..r.end * channels;
            let (xw, ow, rw) = (self.window(x, span.clone()), self.window(out, span), self.window(rstd, r.clone()));
            let params = [r.len() as u32, channels as u32, eps.to_bits(), xw.elem_offset, ow.elem_offset, rw.elem_offset, 0, 0];
            self.dispatch(
                shaders::RMSNORM_FORWARD,
                "main",
                &params,
                &[(1, xw.binding), (2, weight.buffer.as_entire_buffer_binding()), (3, ow.binding), (4, rw.binding)],
                Self::grid(r.len()),
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_rmsnorm_backward(
        &self,
        dx: &GpuTensor,
        dweight: &GpuTensor,
        dout: &GpuTensor,
        x: &GpuTensor,
        weight: &GpuTensor,
        rstd: &GpuTensor,
        rows: usize,
        channels: usize,
    ) {
        for r in Self::pieces(rows, self.rows_per_piece(channels), 1) {
            let span = r.start * channels..r.end * channels;
            let (xw, dw, gw) = (self.window(x, span.clone()), self.window(dout, span.clone()), self.window(dx, span));
            let rw = self.window(rstd, r.clone());
            let params =
                [r.len() as u32, channels as u32, xw.elem_offset, dw.elem_offset, gw.elem_offset, rw.elem_offset, 0, 0, 0, 0, 0, 0];
            self.dispatch(
                shaders::RMSNORM_BACKWARD,
                "input_grad",
                &params,
                &[(1, xw.binding), (2, dw.binding), (3, weight.buffer.as_entire_buffer_binding()), (4, rw.binding), (5, gw.binding)],
                Self::grid(r.len()),
            );
        }
        // Each piece adds its rows' sums into dweight in turn: a fixed order for a given binding and
        // scratch size.
        for piece in self.column_pieces(rows, channels, 1) {
            let span = piece.rows.start * channels..piece.rows.end * channels;
            let (xw, dw, rw) = (self.window(x, span.clone()), self.window(dout, span), self.window(rstd, piece.rows.clone()));
            let tw = self.column_target(&piece, channels, dweight, 0);
            let (rows_per_block, blocks) = (piece.rows_per_block() as u32, piece.blocks as u32);
            let params = [
                piece.rows.len() as u32,
                channels as u32,
                xw.elem_offset,
                dw.elem_offset,
                0,
                rw.elem_offset,
                rows_per_block,
                blocks,
                tw.elem_offset,
                0,
                0,
                0,
            ];
            self.dispatch(
                shaders::RMSNORM_BACKWARD,
                "param_grad",
                &params,
                &[(1, xw.binding), (2, dw.binding), (4, rw.binding), (6, tw.binding)],
                piece.grid(channels),
            );
            self.add_column_partials(&piece, channels, &[dweight]);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_rope(
        &self,
        x: &GpuTensor,
        inv_freq: &GpuTensor,
        rows_per_seq: usize,
        rows: usize,
        row_stride: usize,
        col_offset: usize,
        heads: usize,
        head_dim: usize,
        inverse: bool,
    ) {
        assert!(rows == 0 || rows_per_seq > 0, "rope: rows_per_seq is 0");
        self.dispatch_rope_from(x, inv_freq, 0, rows_per_seq, rows, row_stride, col_offset, heads, head_dim, inverse)
    }

    /// `rope.wgsl` with the first row at position `first_position` (then `first_position + r`, modulo
    /// `rows_per_seq`): `Backend::rope` with 0, `Backend::rope_at` with a period no row reaches.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_rope_from(
        &self,
        x: &GpuTensor,
        inv_freq: &GpuTensor,
        first_position: usize,
        rows_per_seq: usize,
        rows: usize,
        row_stride: usize,
        col_offset: usize,
        heads: usize,
        head_dim: usize,
        inverse: bool,
    ) {
        let half = head_dim / 2;
        assert!(head_dim.is_multiple_of(2), "rope: head_dim {head_dim} is odd");
        assert!(inv_freq.len >= half, "rope: {} inverse frequencies for head_dim {head_dim}", inv_freq.len);
        assert!(col_offset + heads * head_dim <= row_stride, "rope: heads past the end of a row of {row_stride}");
        assert!(first_position + rows < u32::MAX as usize, "rope: position {} past u32", first_position + rows);
        if rows == 0 || heads == 0 || half == 0 {
            return;
        }
        for r in Self::pieces(rows, self.rows_per_piece(row_stride), 1) {
            // From the first rotated element of the piece's first row to the last of its last row.
            let first = r.start * row_stride + col_offset;
            let end = (r.end.max(r.start + 1) - 1) * row_stride + col_offset + heads * head_dim;
            let xw = self.window(x, first..end);
            let params = [
                r.len() as u32,
                rows_per_seq as u32,
                row_stride as u32,
                heads as u32,
                half as u32,
                xw.elem_offset,
                (first_position + r.start) as u32,
                inverse as u32,
            ];
            self.dispatch(
                shaders::ROPE,
                "main",
                &params,
                &[(1, inv_freq.buffer.as_entire_buffer_binding()), (2, xw.binding)],
                Self::elementwise_grid(r.len() * half),
            );
        }
    }

    pub(super) fn dispatch_swiglu_forward(&self, out: &GpuTensor, gate_up: &GpuTensor, rows: usize, hidden: usize) {
        for r in Self::pieces(rows, self.rows_per_piece(2 * hidden), 1) {
            let gw = self.window(gate_up, 2 * r.start * hidden..2 * r.end * hidden);
            let ow = self.window(out, r.start * hidden..r.end * hidden);
            self.dispatch(
                shaders::SWIGLU_FORWARD,
                "main",
                &[r.len() as u32, hidden as u32, gw.elem_offset, ow.elem_offset],
                &[(1, gw.binding), (2, ow.binding)],
                Self::elementwise_grid(r.len() * hidden),
            );
        }
    }

    pub(super) fn dispatch_swiglu_backward(
        &self,
        d_gate_up: &GpuTensor,
        dout: &GpuTensor,
        gate_up: &GpuTensor,
        rows: usize,
        hidden: usize,
    ) {
        for r in Self::pieces(rows, self.rows_per_piece(2 * hidden), 1) {
            let span = 2 * r.start * hidden..2 * r.end * hidden;
            let (gw, dgw) = (self.window(gate_up, span.clone()), self.window(d_gate_up, span));
            let dw = self.window(dout, r.start * hidden..r.end * hidden);
            let params = [r.len() as u32, hidden as u32, gw.elem_offset, dw.elem_offset, dgw.elem_offset, 0, 0, 0];
            self.dispatch(
                shaders::SWIGLU_BACKWARD,
                "main",
                &params,
                &[(1, gw.binding), (2, dw.binding), (3, dgw.binding)],
                Self::elementwise_grid(r.len() * hidden),
            );
        }
    }
}
