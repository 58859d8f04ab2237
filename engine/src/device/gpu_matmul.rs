//! The gpu device's matmul: the dispatch behind [`Backend::matmul`] and the splitting of a product whose
//! operands exceed one binding. The kernel (`shaders/wgsl/matmul.wgsl`, whose header explains its design)
//! takes each of A and B twice, as the scalar window and again as whole vec4 of the same window, for the
//! vector loads of aligned interior tiles. A child module of `gpu`, so it uses that file's private helpers.
//!
//! [`Backend::matmul`]: crate::device::Backend::matmul

use std::ops::Range;

use anyhow::{Result, bail};

use super::{GpuDevice, GpuTensor, Window};
use crate::device::{HalfFormat, MatmulShape};
use zerostream_shaders as shaders;

/// Rows and columns of C per workgroup (matmul.wgsl's TILE_M and TILE_N).
const TILE_M: usize = 128;
const TILE_N: usize = 128;
/// Workgroup memory matmul.wgsl declares: two buffers of an 8 x 128 f32 tile of each operand.
const WORKGROUP_STORAGE_BYTES: u32 = 2 * 2 * 8 * 128 * 4;

/// What every matmul runs on this device (the same on every adapter today), for `bench kernels`.
pub const MATMUL_PATH: &str = "matmul.wgsl: fp32 FMA, 128x128 tile per 256-invocation workgroup, 8x8 per invocation, \
     K step 8 double-buffered (16 KiB workgroup memory), vec4 loads of aligned interior tiles; \
     no subgroup ops, no cooperative matrix";

/// Refuses an adapter whose workgroup memory cannot hold the matmul's tiles (Vulkan, Metal and DX12 all
/// guarantee at least 16 KiB; only downlevel adapters have less).
pub(super) fn check_limits(limits: &wgpu::Limits, adapter: &str) -> Result<()> {
    if limits.max_compute_workgroup_storage_size < WORKGROUP_STORAGE_BYTES {
        bail!(
            "adapter {adapter:?} allows {} bytes of workgroup memory; zerostream's matmul needs {WORKGROUP_STORAGE_BYTES} \
             (use --device cpu)",
            limits.max_compute_workgroup_storage_size
        );
    }
    Ok(())
}

/// The 16-byte buffer bound as a vec4 operand whose window holds no whole vec4 (the kernel is told not
/// to read it).
pub(super) fn placeholder_vec4_buffer(device: &wgpu::Device) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("matmul vec4 placeholder"),
        size: 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    })
}

impl GpuDevice {
    /// Which matmul kernel this device runs, in words.
    pub fn matmul_path(&self) -> &'static str {
        MATMUL_PATH
    }

    /// `window` again as whole vec4 (its size rounded down to 16 bytes), and whether the kernel may read
    /// it: not when the window holds no whole vec4 or does not start on one (then the placeholder is bound).
    fn vec4_window<'a>(&'a self, window: &Window<'a>) -> (wgpu::BufferBinding<'a>, bool) {
        let bytes = window.binding.size.map_or(0, |s| s.get()) / 16 * 16;
        match wgpu::BufferSize::new(bytes) {
            Some(size) if window.binding.offset.is_multiple_of(16) => {
                (wgpu::BufferBinding { buffer: window.binding.buffer, offset: window.binding.offset, size: Some(size) }, true)
            }
            _ => (self.matmul_placeholder.as_entire_buffer_binding(), false),
        }
    }

    /// Splits a product until every operand's window fits one binding, then dispatches each piece.
    /// Halving K is exact: the second half starts from what the first stored, and the kernel's sum for an
    /// element is one FMA chain in increasing k from its initial value, so the bits do not change.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_piece(
        &self,
        c: &GpuTensor,
        a: &GpuTensor,
        b: &GpuTensor,
        bias: Option<&GpuTensor>,
        s: &MatmulShape,
        rows: Range<usize>,
        cols: Range<usize>,
        ks: Range<usize>,
        accumulate: bool,
        add_bias: bool,
    ) {
        let (wa, wb, wc) = (s.a.span(rows.clone(), ks.clone()), s.b.span(ks.clone(), cols.clone()), s.c.span(rows.clone(), cols.clone()));
        if !(self.fits(&wa) && self.fits(&wb) && self.fits(&wc)) {
            // Halve the longest range; halving K turns the second half into an accumulation.
            let (lr, lc, lk) = (rows.len(), cols.len(), ks.len());
            if lk >= lr && lk >= lc && lk > 1 {
                let mid = ks.start + lk / 2;
                self.matmul_piece(c, a, b, bias, s, rows.clone(), cols.clone(), ks.start..mid, accumulate, add_bias);
                self.matmul_piece(c, a, b, bias, s, rows, cols, mid..ks.end, true, false);
            } else if lr >= lc && lr > 1 {
                let mid = rows.start + lr / 2;
                self.matmul_piece(c, a, b, bias, s, rows.start..mid, cols.clone(), ks.clone(), accumulate, add_bias);
                self.matmul_piece(c, a, b, bias, s, mid..rows.end, cols, ks, accumulate, add_bias);
            } else {
                assert!(lc > 1, "matmul: a single element's operands exceed one binding");
                let mid = cols.start + lc / 2;
                self.matmul_piece(c, a, b, bias, s, rows.clone(), cols.start..mid, ks.clone(), accumulate, add_bias);
                self.matmul_piece(c, a, b, bias, s, rows, mid..cols.end, ks, accumulate, add_bias);
            }
            return;
        }
        let (wa, wb, wc) = (self.window(a, wa), self.packed_window(b, wb), self.window(c, wc));
        let (a4, a4_usable) = self.vec4_window(&wa);
        let (b4, b4_usable) = self.vec4_window(&wb);
        let bias_window = bias.map(|t| self.window(t, cols.clone()));
        let (m, n, k) = (rows.len() as u32, cols.len() as u32, ks.len() as u32);
        let flags =
            accumulate as u32 | (((add_bias && bias.is_some()) as u32) << 1) | ((a4_usable as u32) << 2) | ((b4_usable as u32) << 3);
        let params = [
            m,
            n,
            k,
            flags,
            wa.elem_offset,
            s.a.row_stride as u32,
            s.a.col_stride as u32,
            0,
            wb.elem_offset,
            s.b.row_stride as u32,
            s.b.col_stride as u32,
            match b.format {
                None => 0,
                Some(HalfFormat::F16) => 1,
                Some(HalfFormat::Bf16) => 2,
            },
            wc.elem_offset,
            s.c.row_stride as u32,
            bias_window.as_ref().map_or(0, |w| w.elem_offset),
            0,
        ];
        // Without a bias the kernel never reads binding 3, but it must be bound: bind A there (binding C
        // would put one buffer in a read-only and a read-write slot of one dispatch, which wgpu forbids).
        let bias_binding = match &bias_window {
            Some(w) => w.binding.clone(),
            None => wa.binding.clone(),
        };
        self.dispatch(
            shaders::MATMUL,
            "main",
            &params,
            &[(1, wa.binding), (2, wb.binding), (3, bias_binding), (4, wc.binding), (5, a4), (6, b4)],
            [n.div_ceil(TILE_N as u32), m.div_ceil(TILE_M as u32), 1],
        );
    }
}
