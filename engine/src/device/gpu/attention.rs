//! The gpu device's causal attention, forward and backward (`attention_forward.wgsl`,
//! `attention_backward.wgsl`, flash-style: see their headers): the dispatches behind the [`Backend`]
//! methods of the same names, split by batch so that one sequence's windows fit a binding. A child
//! module of `gpu`, so it uses that file's private helpers.
//!
//! Both kernels are templates (`shaders/src/attention_template.rs`): each call runs the variant the
//! device's [`AttentionTable`] gives its shape class, unless one is forced for every call
//! ([`GpuDevice::force_attention_variant`]: the tuner and the tests). Every variant gives the same bits.
//!
//! [`Backend`]: crate::device::Backend

use anyhow::{Result, bail};

use super::{GpuDevice, GpuTensor, Window};
use crate::device::AttentionDims;
use crate::device::attention_tuning::{AttentionClass, AttentionTable};
use crate::ops::MAX_GRID_DIM;
use zerostream_shaders::{AttentionPass, AttentionTile};

/// The Params of the attention kernels (common/attention_params.wgsl): dimensions, scale, the offsets
/// of the qkv-, out- and statistics-shaped windows, the qkv row's width and part starts, the first
/// batch of this piece, the dropout mask on the probabilities (threshold 0: none), and decode's rows
/// already cached and cache window (0 in training).
pub(super) struct AttentionParams {
    pub dims: AttentionDims,
    pub qkv_off: u32,
    pub out_off: u32,
    pub stat_off: u32,
    pub batch_base: usize,
    pub past: usize,
    pub cache_off: u32,
}

impl AttentionParams {
    /// Training's: no cache.
    fn training(d: AttentionDims, qkv: &Window<'_>, out: &Window<'_>, stat: &Window<'_>, batch_base: usize) -> Self {
        let (qkv_off, out_off, stat_off) = (qkv.elem_offset, out.elem_offset, stat.elem_offset);
        AttentionParams { dims: d, qkv_off, out_off, stat_off, batch_base, past: 0, cache_off: 0 }
    }

    /// The uniform's words, in the struct's order. `seq_len` is the positions the rows see: the
    /// sequence, or decode's cached and new rows together.
    pub fn words(&self) -> [u32; 20] {
        let d = self.dims;
        let seq_len = self.past + d.seq_len;
        let [t, heads, group, hd, qkv_width, k_start, v_start, batch_base, past] =
            [seq_len, d.heads, d.group(), d.head_dim, d.qkv_width(), d.q_width(), d.q_width() + d.kv_width(), self.batch_base, self.past]
                .map(|n| n as u32);
        let (key, threshold, drop_scale) = d.dropout.map_or(([0, 0], 0, 1.0f32), |m| (m.key, m.threshold, m.scale));
        let (scale, drop_scale) = (d.scale.to_bits(), drop_scale.to_bits());
        let (qkv_off, out_off, stat_off, cache_off) = (self.qkv_off, self.out_off, self.stat_off, self.cache_off);
        [
            t, heads, group, hd, scale, qkv_off, out_off, stat_off, qkv_width, k_start, v_start, batch_base, key[0], key[1], threshold,
            drop_scale, past, cache_off, 0, 0,
        ]
    }
}

impl GpuDevice {
    /// Whether this adapter can run `tile` for both passes (workgroup memory and invocations).
    pub(super) fn can_run_attention(&self, tile: &AttentionTile) -> bool {
        let a = &self.summary;
        tile.check().is_ok()
            && tile.workgroup_size() <= a.max_invocations_per_workgroup
            && AttentionPass::ALL.iter().all(|p| tile.workgroup_bytes(*p) <= a.max_workgroup_storage_bytes)
    }

    /// The candidate attention variants this adapter can run, the default first.
    pub fn attention_variants(&self) -> Vec<AttentionTile> {
        AttentionTile::CANDIDATES.into_iter().filter(|t| self.can_run_attention(t)).collect()
    }

    /// Runs every attention call with `tile` (None: the table's choice per shape class again). Any
    /// variant that passes [`AttentionTile::check`] and fits the adapter may be forced, not only the
    /// candidates (the tests try an odd one).
    pub fn force_attention_variant(&self, tile: Option<AttentionTile>) -> Result<()> {
        if let Some(t) = tile
            && !self.can_run_attention(&t)
        {
            bail!("attention variant {t} is not one this adapter can run ({})", self.summary.name);
        }
        self.attention_forced.set(tile);
        Ok(())
    }

    /// The device's attention tuning table.
    pub fn attention_table(&self) -> std::cell::Ref<'_, AttentionTable> {
        self.attention_table.borrow()
    }

    /// Replaces the attention tuning table (after `zerostream tune`, or a test's own).
    pub fn set_attention_table(&self, table: AttentionTable) {
        *self.attention_table.borrow_mut() = table;
    }

    /// The variant a call of this pass and shape runs now.
    pub fn attention_variant_for(&self, pass: AttentionPass, d: &AttentionDims) -> AttentionTile {
        let chosen = self.attention_forced.get().unwrap_or_else(|| self.attention_table.borrow().choose(&AttentionClass::of(pass, d)));
        // The 32-row grid is what check_attention allowed; a smaller block could exceed WebGPU's grid
        // limit, and a table's variant this adapter cannot run falls back too: to the untuned variant,
        // which needs no more invocations, nor more workgroup memory than check_attention asked for (tested).
        if self.can_run_attention(&chosen) && d.seq_len.div_ceil(chosen.rows as usize) <= MAX_GRID_DIM {
            chosen
        } else {
            AttentionTile::UNTUNED
        }
    }

    pub(super) fn dispatch_attention_forward(&self, out: &GpuTensor, lse: &GpuTensor, qkv: &GpuTensor, d: AttentionDims) {
        let (t, qkv_row, out_row) = (d.seq_len, d.qkv_width(), d.out_width());
        let tile = self.attention_variant_for(AttentionPass::Forward, &d);
        let blocks = t.div_ceil(tile.rows as usize) as u32;
        for bs in Self::pieces(d.batch, self.rows_per_piece(t * qkv_row), 1) {
            let qw = self.window(qkv, bs.start * t * qkv_row..bs.end * t * qkv_row);
            let ow = self.window(out, bs.start * t * out_row..bs.end * t * out_row);
            let lw = self.window(lse, bs.start * d.heads * t..bs.end * d.heads * t);
            let params = AttentionParams::training(d, &qw, &ow, &lw, bs.start).words();
            self.dispatch(
                tile.kernel(AttentionPass::Forward),
                "main",
                &params,
                &[(1, qw.binding), (2, ow.binding), (3, lw.binding)],
                [blocks, d.heads as u32, bs.len() as u32],
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
        let tile = self.attention_variant_for(AttentionPass::Backward, &d);
        let (kernel, blocks) = (tile.kernel(AttentionPass::Backward), t.div_ceil(tile.rows as usize) as u32);
        for bs in Self::pieces(d.batch, self.rows_per_piece(t * qkv_row), 1) {
            let qkv_span = bs.start * t * qkv_row..bs.end * t * qkv_row;
            let out_span = bs.start * t * out_row..bs.end * t * out_row;
            let stat_span = bs.start * d.heads * t..bs.end * d.heads * t;
            let (qw, gw) = (self.window(qkv, qkv_span.clone()), self.window(dqkv, qkv_span));
            let (ow, dw) = (self.window(out, out_span.clone()), self.window(dout, out_span));
            let (lw, ew) = (self.window(lse, stat_span.clone()), self.window(delta, stat_span));
            // One offset per layout: the windows of same-shaped tensors start at the same misalignment.
            assert!(qw.elem_offset == gw.elem_offset && ow.elem_offset == dw.elem_offset && lw.elem_offset == ew.elem_offset);
            let params = AttentionParams::training(d, &qw, &ow, &lw, bs.start).words();
            self.dispatch(
                kernel,
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
                [blocks, d.heads as u32, bs.len() as u32],
            );
            // One workgroup per key/value head (and block of keys): it sums the gradients of the group's
            // query heads.
            self.dispatch(
                kernel,
                "key_value_grad",
                &params,
                &[(1, qw.binding), (3, dw.binding), (4, lw.binding), (5, ew.binding), (6, gw.binding)],
                [blocks, d.kv_heads as u32, bs.len() as u32],
            );
        }
    }
}
