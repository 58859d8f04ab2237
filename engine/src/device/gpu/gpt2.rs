//! The gpu device's GPT-2 row ops: the encoder (token and position embeddings) and layer norm, forward
//! and backward — the dispatches behind the [`Backend`] methods of the same names (whose docs give the
//! shapes). Like the Llama ops in `gpu/llama.rs`, each splits its rows into pieces whose windows fit one
//! binding. A child module of `gpu`, so it uses that file's private helpers.
//!
//! [`Backend`]: crate::device::Backend

use super::{GpuDevice, GpuTensor, GpuTokens};
use zerostream_shaders as shaders;

impl GpuDevice {
    pub(super) fn dispatch_encoder_forward(
        &self,
        out: &GpuTensor,
        tokens: &GpuTokens,
        wte: &GpuTensor,
        wpe: &GpuTensor,
        seq_len: usize,
        channels: usize,
    ) {
        let rows = tokens.ids.len;
        let vocab = wte.len / channels;
        for vocab_range in Self::pieces(vocab, self.rows_per_piece(channels), 1) {
            let ww = self.window(wte, vocab_range.start * channels..vocab_range.end * channels);
            let params =
                [rows as u32, seq_len as u32, channels as u32, vocab_range.start as u32, vocab_range.end as u32, ww.elem_offset, 0, 0];
            self.dispatch(
                shaders::ENCODER_FORWARD,
                "main",
                &params,
                &[
                    (1, tokens.ids.buffer.as_entire_buffer_binding()),
                    (2, ww.binding),
                    (3, wpe.buffer.as_entire_buffer_binding()),
                    (4, out.buffer.as_entire_buffer_binding()),
                ],
                Self::elementwise_grid(rows * channels),
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_encoder_backward(
        &self,
        dwte: &GpuTensor,
        dwpe: &GpuTensor,
        dout: &GpuTensor,
        tokens: &GpuTokens,
        batch: usize,
        seq_len: usize,
        channels: usize,
    ) {
        let vocab = dwte.len / channels;
        let b = &tokens.buckets;
        for vocab_range in Self::pieces(vocab, self.rows_per_piece(channels), 1) {
            // The buckets whose token falls in this vocabulary window.
            let first = b.token.partition_point(|&t| (t as usize) < vocab_range.start);
            let last = b.token.partition_point(|&t| (t as usize) < vocab_range.end);
            if first == last {
                continue;
            }
            let ww = self.window(dwte, vocab_range.start * channels..vocab_range.end * channels);
            let tw = self.window(&tokens.bucket_token, first..last);
            let sw = self.window(&tokens.bucket_start, first..last + 1);
            let params = [
                (last - first) as u32,
                channels as u32,
                batch as u32,
                seq_len as u32,
                vocab_range.start as u32,
                ww.elem_offset,
                tw.elem_offset,
                0,
            ];
            self.dispatch(
                shaders::ENCODER_BACKWARD,
                "token_grad",
                &params,
                &[
                    (1, dout.buffer.as_entire_buffer_binding()),
                    (2, tw.binding),
                    (3, sw.binding),
                    (4, tokens.positions.buffer.as_entire_buffer_binding()),
                    (5, ww.binding),
                ],
                Self::elementwise_grid((last - first) * channels),
            );
        }
        self.encoder_position_grad(dwpe, dout, batch, seq_len, channels);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_layernorm_forward(
        &self,
        out: &GpuTensor,
        mean: &GpuTensor,
        rstd: &GpuTensor,
        x: &GpuTensor,
        weight: &GpuTensor,
        bias: &GpuTensor,
        rows: usize,
        channels: usize,
        eps: f32,
    ) {
        for r in Self::pieces(rows, self.rows_per_piece(channels), 1) {
            let xw = self.window(x, r.start * channels..r.end * channels);
            let ow = self.window(out, r.start * channels..r.end * channels);
            let (mw, rw) = (self.window(mean, r.clone()), self.window(rstd, r.clone()));
            assert_eq!(mw.elem_offset, rw.elem_offset);
            let params = [r.len() as u32, channels as u32, eps.to_bits(), xw.elem_offset, ow.elem_offset, mw.elem_offset, 0, 0];
            self.dispatch(
                shaders::LAYERNORM_FORWARD,
                "main",
                &params,
                &[
                    (1, xw.binding),
                    (2, weight.buffer.as_entire_buffer_binding()),
                    (3, bias.buffer.as_entire_buffer_binding()),
                    (4, ow.binding),
                    (5, mw.binding),
                    (6, rw.binding),
                ],
                Self::grid(r.len()),
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_layernorm_backward(
        &self,
        dx: &GpuTensor,
        dweight: &GpuTensor,
        dbias: &GpuTensor,
        dout: &GpuTensor,
        x: &GpuTensor,
        weight: &GpuTensor,
        mean: &GpuTensor,
        rstd: &GpuTensor,
        rows: usize,
        channels: usize,
    ) {
        for r in Self::pieces(rows, self.rows_per_piece(channels), 1) {
            let span = r.start * channels..r.end * channels;
            let (xw, dw, gw) = (self.window(x, span.clone()), self.window(dout, span.clone()), self.window(dx, span));
            let (mw, rw) = (self.window(mean, r.clone()), self.window(rstd, r.clone()));
            let params =
                [r.len() as u32, channels as u32, xw.elem_offset, dw.elem_offset, gw.elem_offset, mw.elem_offset, 0, 0, 0, 0, 0, 0];
            self.dispatch(
                shaders::LAYERNORM_BACKWARD,
                "input_grad",
                &params,
                &[
                    (1, xw.binding),
                    (2, dw.binding),
                    (3, weight.buffer.as_entire_buffer_binding()),
                    (4, mw.binding),
                    (5, rw.binding),
                    (6, gw.binding),
                ],
                Self::grid(r.len()),
            );
        }
        for piece in self.column_pieces(rows, channels, 2) {
            let (r, span) = (piece.rows.clone(), piece.rows.start * channels..piece.rows.end * channels);
            let (xw, dw) = (self.window(x, span.clone()), self.window(dout, span));
            let (mw, rw) = (self.window(mean, r.clone()), self.window(rstd, r));
            let (tw, tb) = (self.column_target(&piece, channels, dweight, 0), self.column_target(&piece, channels, dbias, 1));
            let params = [
                piece.rows.len() as u32,
                channels as u32,
                xw.elem_offset,
                dw.elem_offset,
                0,
                mw.elem_offset,
                piece.rows_per_block() as u32,
                piece.blocks as u32,
                tw.elem_offset,
                tb.elem_offset,
                0,
                0,
            ];
            self.dispatch(
                shaders::LAYERNORM_BACKWARD,
                "param_grad",
                &params,
                &[(1, xw.binding), (2, dw.binding), (4, mw.binding), (5, rw.binding), (7, tw.binding), (8, tb.binding)],
                piece.grid(channels),
            );
            self.add_column_partials(&piece, channels, &[dweight, dbias]);
        }
    }

    fn encoder_position_grad(&self, dwpe: &GpuTensor, dout: &GpuTensor, batch: usize, seq_len: usize, channels: usize) {
        let params = [0, channels as u32, batch as u32, seq_len as u32, 0, 0, 0, 0];
        self.dispatch(
            shaders::ENCODER_BACKWARD,
            "position_grad",
            &params,
            &[(1, dout.buffer.as_entire_buffer_binding()), (5, dwpe.buffer.as_entire_buffer_binding())],
            Self::elementwise_grid(seq_len * channels),
        );
    }
}
