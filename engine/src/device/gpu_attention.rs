//! The gpu device's causal attention, forward and backward (`attention_forward.wgsl`,
//! `attention_backward.wgsl`, flash-style: see their headers): the dispatches behind the [`Backend`]
//! methods of the same names, split by batch so that one sequence's windows fit a binding. A child
//! module of `gpu`, so it uses that file's private helpers.
//!
//! [`Backend`]: crate::device::Backend

use super::{GpuDevice, GpuTensor, Window};
use crate::device::AttentionDims;
use zerostream_shaders as shaders;

/// The Params of both attention kernels: dimensions, scale, the offsets of the qkv-, out- and
/// statistics-shaped windows, the qkv row's width and part starts, the first batch of this piece, and
/// the dropout mask on the probabilities (threshold 0: none).
fn attention_params(d: AttentionDims, qkv: &Window<'_>, out: &Window<'_>, stat: &Window<'_>, batch_base: usize) -> [u32; 16] {
    let [t, heads, group, hd, qkv_width, k_start, v_start, batch_base] =
        [d.seq_len, d.heads, d.group(), d.head_dim, d.qkv_width(), d.q_width(), d.q_width() + d.kv_width(), batch_base].map(|n| n as u32);
    let (key, threshold, drop_scale) = d.dropout.map_or(([0, 0], 0, 1.0f32), |m| (m.key, m.threshold, m.scale));
    let (scale, drop_scale) = (d.scale.to_bits(), drop_scale.to_bits());
    let (qkv_off, out_off, stat_off) = (qkv.elem_offset, out.elem_offset, stat.elem_offset);
    [t, heads, group, hd, scale, qkv_off, out_off, stat_off, qkv_width, k_start, v_start, batch_base, key[0], key[1], threshold, drop_scale]
}

impl GpuDevice {
    pub(super) fn dispatch_attention_forward(&self, out: &GpuTensor, lse: &GpuTensor, qkv: &GpuTensor, d: AttentionDims) {
        let (t, qkv_row, out_row) = (d.seq_len, d.qkv_width(), d.out_width());
        for bs in Self::pieces(d.batch, self.rows_per_piece(t * qkv_row), 1) {
            let qw = self.window(qkv, bs.start * t * qkv_row..bs.end * t * qkv_row);
            let ow = self.window(out, bs.start * t * out_row..bs.end * t * out_row);
            let lw = self.window(lse, bs.start * d.heads * t..bs.end * d.heads * t);
            let params = attention_params(d, &qw, &ow, &lw, bs.start);
            self.dispatch(
                shaders::ATTENTION_FORWARD,
                "main",
                &params,
                &[(1, qw.binding), (2, ow.binding), (3, lw.binding)],
                [t.div_ceil(crate::ops::attention::BLOCK) as u32, d.heads as u32, bs.len() as u32],
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_attention_backward(
        &self,
        dqkv: &GpuTensor,
        delta: &GpuTensor,
        dout: &GpuTensor,
        qkv: &GpuTensor,
        out: &GpuTensor,
        lse: &GpuTensor,
        d: AttentionDims,
    ) {
        let (t, qkv_row, out_row) = (d.seq_len, d.qkv_width(), d.out_width());
        for bs in Self::pieces(d.batch, self.rows_per_piece(t * qkv_row), 1) {
            let qkv_span = bs.start * t * qkv_row..bs.end * t * qkv_row;
            let out_span = bs.start * t * out_row..bs.end * t * out_row;
            let stat_span = bs.start * d.heads * t..bs.end * d.heads * t;
            let (qw, gw) = (self.window(qkv, qkv_span.clone()), self.window(dqkv, qkv_span));
            let (ow, dw) = (self.window(out, out_span.clone()), self.window(dout, out_span));
            let (lw, ew) = (self.window(lse, stat_span.clone()), self.window(delta, stat_span));
            // One offset per layout: the windows of same-shaped tensors start at the same misalignment.
            assert!(qw.elem_offset == gw.elem_offset && ow.elem_offset == dw.elem_offset && lw.elem_offset == ew.elem_offset);
            let params = attention_params(d, &qw, &ow, &lw, bs.start);
            self.dispatch(
                shaders::ATTENTION_BACKWARD,
                "query_grad",
                &params,
                &[
                    (1, qw.binding.clone()),
                    (2, ow.binding),
                    (3, dw.binding.clone()),
                    (4, lw.binding.clone()),
                    (5, ew.binding.clone()),
                    (6, gw.binding.clone()),
                ],
                [t.div_ceil(crate::ops::attention::BLOCK) as u32, d.heads as u32, bs.len() as u32],
            );
            // One workgroup per key/value head (and block of keys): it sums the gradients of the group's
            // query heads.
            self.dispatch(
                shaders::ATTENTION_BACKWARD,
                "key_value_grad",
                &params,
                &[(1, qw.binding), (3, dw.binding), (4, lw.binding), (5, ew.binding), (6, gw.binding)],
                [t.div_ceil(crate::ops::attention::BLOCK) as u32, d.kv_heads as u32, bs.len() as u32],
            );
        }
    }
}
