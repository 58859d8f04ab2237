//! The gpu device's decode attention (`attention_decode.wgsl`): the dispatches behind
//! `Backend::attention_decode`. A child of `gpu.rs`, sharing its private helpers.

use super::{DecodeDims, GpuDevice, GpuTensor};
use zerostream_shaders as shaders;

impl GpuDevice {
    /// `append` then `main` for each piece of new rows whose qkv and out windows fit one binding; the
    /// cache is bound whole (`DecodeDims::check_kernel_limits` refuses one that does not fit).
    pub(super) fn dispatch_attention_decode(&self, out: &GpuTensor, cache: &GpuTensor, qkv: &GpuTensor, d: DecodeDims) {
        d.check().expect("decode attention dims");
        let a = d.attn;
        let (qkv_row, out_row, width) = (a.qkv_width(), a.out_width(), d.cache_width());
        assert!(d.cache_len() <= cache.len, "decode attention: a cache of {} floats for {} rows of {width}", cache.len, d.capacity);
        let cw = self.window(cache, 0..d.cache_len());
        for r in Self::pieces(d.rows(), self.rows_per_piece(qkv_row.max(out_row)), 1) {
            if r.is_empty() {
                continue;
            }
            let qw = self.window(qkv, r.start * qkv_row..r.end * qkv_row);
            let ow = self.window(out, r.start * out_row..r.end * out_row);
            let past = d.past + r.start;
            let params = [
                r.len() as u32,
                past as u32,
                a.heads as u32,
                a.group() as u32,
                a.head_dim as u32,
                a.scale.to_bits(),
                qkv_row as u32,
                a.q_width() as u32,
                a.kv_width() as u32,
                qw.elem_offset,
                ow.elem_offset,
                cw.elem_offset,
            ];
            self.dispatch(
                shaders::ATTENTION_DECODE,
                "append",
                &params,
                &[(1, qw.binding.clone()), (2, cw.binding.clone())],
                Self::elementwise_grid(r.len() * width),
            );
            self.dispatch(
                shaders::ATTENTION_DECODE,
                "main",
                &params,
                &[(1, qw.binding), (2, cw.binding.clone()), (3, ow.binding)],
                [r.len() as u32, a.heads as u32, 1],
            );
        }
    }
}
