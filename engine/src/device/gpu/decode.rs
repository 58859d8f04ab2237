//! The gpu device's decode attention (`attention_decode.wgsl`, a template like the forward's, running
//! its online-softmax loop): the dispatches behind `Backend::attention_decode`. A child of `gpu.rs`,
//! sharing its private helpers.

use super::attention::AttentionParams;
use super::{DecodeDims, GpuDevice, GpuTensor};
use crate::device::AttentionDims;
use zerostream_shaders::AttentionTile;

/// The variant for a few new rows (a generated token at a time): 8 rows, so a workgroup of 64 lanes
/// rather than 256 of which one row's 8 would work. Every variant gives the same bits.
const FEW_ROWS: AttentionTile = AttentionTile::rows(8);

impl GpuDevice {
    /// The variant a decode call of `rows` new rows runs: a forced one
    /// ([`GpuDevice::force_attention_variant`]), else by the count of rows.
    fn decode_variant(&self, rows: usize) -> AttentionTile {
        match self.attention_forced.get() {
            // A blocked variant forced has no decode kernel: the unforced choice (the same bits).
            Some(forced) if forced.has_decode() => forced,
            _ if rows <= FEW_ROWS.rows as usize && self.can_run_attention(&FEW_ROWS) => FEW_ROWS,
            _ => AttentionTile::DEFAULT,
        }
    }

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
            let params = AttentionParams {
                // Generation never drops probabilities.
                dims: AttentionDims { seq_len: r.len(), dropout: None, ..a },
                qkv_off: qw.elem_offset,
                out_off: ow.elem_offset,
                stat_off: 0,
                batch_base: 0,
                past: d.past + r.start,
                cache_off: cw.elem_offset,
            }
            .words();
            let tile = self.decode_variant(r.len());
            let kernel = tile.decode_kernel();
            self.dispatch(
                kernel,
                "append",
                &params,
                &[(1, qw.binding.clone()), (2, cw.binding.clone())],
                Self::elementwise_grid(r.len() * width),
            );
            let blocks = r.len().div_ceil(tile.rows as usize) as u32;
            self.dispatch(
                kernel,
                "main",
                &params,
                &[(1, qw.binding), (2, cw.binding.clone()), (3, ow.binding)],
                [blocks, a.heads as u32, 1],
            );
        }
    }
}
