//! The gpu device's matmul: the dispatch behind [`Backend::matmul`] and the splitting of a product whose
//! operands exceed one binding. The kernel (`shaders/wgsl/matmul.wgsl`, whose header explains its design)
//! takes each of A and B twice, as the scalar window and again as whole vec4 of the same window, for the
//! vector loads of aligned interior tiles. A child module of `gpu`, so it uses that file's private helpers.
//!
//! The fp32 kernel is a template (`shaders/src/matmul_template.rs`): each product runs the variant the
//! device's [`MatmulTable`] gives its shape class (`zerostream tune`'s winners, or the vendor's default),
//! unless one variant is forced for every product ([`GpuDevice::force_matmul_variant`]: the tuner and
//! the tests). Every variant gives the same bits.
//!
//! Under `--matmul-inputs f16` the same pieces go to the cooperative-matrix matmul (f16 inputs on
//! cooperative matrices, f32 sums; same Params and bindings 0-4), templates too
//! (`shaders/src/matmul_coop_template.rs`, [`CoopTile`]) at the adapter's cooperative size, only on an
//! adapter that [`coop_unavailable`] accepts: `matmul_coop.wgsl` staged from A and B as they are (or
//! precast), `matmul_coop_direct.wgsl` and the wide `matmul_coop.wgsl` from A and B packed here first
//! (`pack_f16.wgsl`, `Loads`). Its variants of one size give the same bits as each other. That side
//! (variant choice, scratch, precast and packing, dispatch) is the child `gpu/matmul/coop.rs`. The
//! fp32 kernel is the default and the fallback everywhere.
//!
//! [`Backend::matmul`]: crate::device::Backend::matmul

use std::ops::Range;

use anyhow::{Result, bail};

use super::{AdapterSummary, GpuDevice, GpuTensor, Window};
use crate::device::matmul_tuning::{MatmulClass, MatmulTable};
use crate::device::{MatmulInputs, MatmulShape};
use zerostream_shaders::{CoopTile, MatmulTile};

mod coop;
use coop::CoopPiece;

/// Workgroup memory the default fp32 variant declares, which every adapter must have (the smallest
/// maximum Vulkan, Metal and DX12 allow).
const WORKGROUP_STORAGE_BYTES: u32 = MatmulTile::DEFAULT.workgroup_bytes();

/// The default matmul (every adapter), for `bench kernels`.
pub const MATMUL_PATH: &str = "matmul.wgsl: fp32 FMA, the variant (tile per workgroup x K step / per invocation / \
     buffers / loads) per shape class from the device's tuning table, else the vendor's built-in default (`zerostream \
     devices` names it); no subgroup ops, no cooperative matrix";

/// The opt-in f16-input matmul (`--matmul-inputs f16`), on adapters [`coop_unavailable`] accepts.
pub const MATMUL_COOP_PATH: &str = "matmul_coop.wgsl: A, B rounded to f16 (nearest even), cooperative matrices \
     f16 x f16 -> f32 at the adapter's size (16x16x16, else 8x8x8), the variant (c<size> / tile per workgroup x K step / \
     accumulators per subgroup / invocations / how A and B are loaded) per shape class from the device's tuning table, \
     else the vendor's built-in default (on NVIDIA c16/128x128x32/4x4/128/ws: A and B packed as f16, staged in 16-byte \
     loads), else the size's first (c16/128x128x32/2x4/256: f16 workgroup tiles)";

/// Why `matmul_coop.wgsl` cannot run on this adapter, or None when it can: it needs f16 shaders,
/// subgroups (for the subgroup id), wgpu's cooperative-matrix feature with a 16x16x16 or 8x8x8 f16 -> f32
/// configuration, and its default variant's workgroup memory.
pub fn coop_unavailable(a: &AdapterSummary) -> Option<String> {
    if !a.cooperative_matrix {
        return Some(if a.cooperative_matrix_configs.is_empty() {
            "it has no cooperative matrices".to_string()
        } else {
            "wgpu does not offer its cooperative matrices (EXPERIMENTAL_COOPERATIVE_MATRIX)".to_string()
        });
    }
    let Some(size) = a.coop_f16_size() else {
        let listed: Vec<String> = a.cooperative_matrix_configs.iter().map(|c| c.to_string()).collect();
        return Some(format!("it lists no 16x16x16 or 8x8x8 f16->f32 cooperative matrix, only: {}", listed.join(", ")));
    };
    if !a.shader_f16 || !a.subgroup {
        return Some("it lacks shader-f16 or subgroups".to_string());
    }
    let needed = CoopTile::default_for(size).workgroup_bytes();
    if a.max_workgroup_storage_bytes < needed {
        return Some(format!("it allows {} bytes of workgroup memory, the kernel needs {needed}", a.max_workgroup_storage_bytes));
    }
    None
}

/// Whether an adapter can hold a variant's workgroup memory and invocations.
fn fits_adapter(a: &AdapterSummary, bytes: u32, invocations: u32) -> bool {
    bytes <= a.max_workgroup_storage_bytes && invocations <= a.max_invocations_per_workgroup
}

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
    /// Which matmul kernel this device runs now (per `--matmul-inputs`), in words.
    pub fn matmul_path(&self) -> &'static str {
        match self.matmul_inputs.get() {
            MatmulInputs::F32 => MATMUL_PATH,
            MatmulInputs::F16 => MATMUL_COOP_PATH,
        }
    }

    /// The variants of the fp32 matmul this adapter can run (workgroup memory and invocations), the
    /// default first.
    pub fn matmul_variants(&self) -> Vec<MatmulTile> {
        let a = &self.summary;
        MatmulTile::CANDIDATES.into_iter().filter(|t| fits_adapter(a, t.workgroup_bytes(), t.workgroup_size())).collect()
    }

    /// Runs every fp32 product with `tile` (None: the table's choice per shape class again).
    pub fn force_matmul_variant(&self, tile: Option<MatmulTile>) -> Result<()> {
        force_variant(&self.matmul_forced, tile, &self.matmul_variants(), "matmul", &self.summary.name)
    }

    /// The device's tuning table (which variant each shape class runs), and where it came from.
    pub fn matmul_table(&self) -> std::cell::Ref<'_, MatmulTable> {
        self.matmul_table.borrow()
    }

    /// Replaces the tuning table (after `zerostream tune`, or a test's own).
    /// Installs `table`, and the upload staging and read-back it was tuned with (where this adapter
    /// still makes them; else the mapped buffers stay, with a warning): the tuning file holds all three.
    pub fn set_matmul_table(&self, table: MatmulTable) {
        let (staging, read_back) = (table.upload_staging, table.read_back);
        *self.matmul_table.borrow_mut() = table;
        if staging != self.upload_staging()
            && let Err(e) = self.set_upload_staging(staging)
        {
            eprintln!("warning: {e:#}; uploads stage in mapped buffers");
        }
        if read_back != self.read_back()
            && let Err(e) = self.set_read_back(read_back)
        {
            eprintln!("warning: {e:#}; read-backs land in mapped buffers");
        }
    }

    /// The variant a product of this shape runs now.
    pub fn matmul_variant_for(&self, shape: &MatmulShape, b_16bit: bool) -> MatmulTile {
        let chosen = self.matmul_forced.get().unwrap_or_else(|| self.matmul_table.borrow().choose(&MatmulClass::of(shape, b_16bit)));
        // A table is checked against the adapter when tuned; a variant it cannot run falls back.
        if fits_adapter(&self.summary, chosen.workgroup_bytes(), chosen.workgroup_size()) { chosen } else { MatmulTile::DEFAULT }
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

    /// Splits a product until every operand's window fits one binding (and, under `--matmul-inputs f16`
    /// with a packing variant, until its packed operands fit the scratch), then dispatches each piece.
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
        let split = if !(self.fits(&wa) && self.fits(&wb) && self.fits(&wc)) {
            Some(binding_split(&rows, &cols, &ks))
        } else {
            self.packing_split(s, b.format.is_some(), &rows, &cols, ks.len())
        };
        match split {
            Some(Split::K(mid)) => {
                self.matmul_piece(c, a, b, bias, s, rows.clone(), cols.clone(), ks.start..mid, accumulate, add_bias);
                self.matmul_piece(c, a, b, bias, s, rows, cols, mid..ks.end, true, false);
                return;
            }
            Some(Split::Rows(mid)) => {
                self.matmul_piece(c, a, b, bias, s, rows.start..mid, cols.clone(), ks.clone(), accumulate, add_bias);
                self.matmul_piece(c, a, b, bias, s, mid..rows.end, cols, ks, accumulate, add_bias);
                return;
            }
            Some(Split::Cols(mid)) => {
                self.matmul_piece(c, a, b, bias, s, rows.clone(), cols.start..mid, ks.clone(), accumulate, add_bias);
                self.matmul_piece(c, a, b, bias, s, rows, mid..cols.end, ks, accumulate, add_bias);
                return;
            }
            None => {}
        }
        let (wa, wb, wc) = (self.window(a, wa), self.packed_window(b, wb), self.window(c, wc));
        let (a4, a4_usable) = self.vec4_window(&wa);
        let (b4, b4_usable) = self.vec4_window(&wb);
        let bias_window = bias.map(|t| self.window(t, cols.clone()));
        let (m, n, k) = (rows.len() as u32, cols.len() as u32, ks.len() as u32);
        let flags =
            accumulate as u32 | (((add_bias && bias.is_some()) as u32) << 1) | ((a4_usable as u32) << 2) | ((b4_usable as u32) << 3);
        let offsets = [wa.elem_offset, wb.elem_offset, wc.elem_offset, bias_window.as_ref().map_or(0, |w| w.elem_offset)];
        let params = piece_params(s, [m, n, k, flags], offsets, b.format_code());
        // Without a bias the kernel never reads binding 3, but it must be bound: bind A there (binding C
        // would put one buffer in a read-only and a read-write slot of one dispatch, which wgpu forbids).
        let bias_binding = match &bias_window {
            Some(w) => w.binding.clone(),
            None => wa.binding.clone(),
        };
        // The piece's own shape class (a split product's pieces may fall in smaller classes).
        let piece = MatmulShape { m: rows.len(), n: cols.len(), k: ks.len(), ..*s };
        if self.matmul_inputs.get() == MatmulInputs::F16 {
            // F16 inputs are set only where the adapter has cooperative matrices.
            let tile = self.coop_variant_for(&piece, b.format.is_some()).expect("--matmul-inputs f16 without cooperative matrices");
            let pieces = CoopPiece { s, rows, cols, ks, params, windows: (wa, wb, wc), bias: bias_binding };
            self.dispatch_coop_piece(a, b, tile, pieces);
            return;
        }
        let tile = self.matmul_variant_for(&piece, b.format.is_some());
        self.dispatch(
            tile.kernel(),
            "main",
            &params,
            &[(1, wa.binding), (2, wb.binding), (3, bias_binding), (4, wc.binding), (5, a4), (6, b4)],
            [n.div_ceil(tile.tile_n), m.div_ceil(tile.tile_m), 1],
        );
    }
}

/// A piece's Params as `matmul.wgsl` and `matmul_coop.wgsl` read them: its sizes and flags, then A's,
/// B's and C's window offsets and strides (B's with its storage format), and the bias's offset.
fn piece_params(s: &MatmulShape, [m, n, k, flags]: [u32; 4], [a_at, b_at, c_at, bias_at]: [u32; 4], b_format: u32) -> [u32; 16] {
    #[rustfmt::skip]
    let params = [
        m, n, k, flags,
        a_at, s.a.row_stride as u32, s.a.col_stride as u32, 0,
        b_at, s.b.row_stride as u32, s.b.col_stride as u32, b_format,
        c_at, s.c.row_stride as u32, bias_at, 0,
    ];
    params
}

/// Runs every product of one kind with `tile` (None: the table's again), where the adapter can run it.
pub(super) fn force_variant<T: Copy + PartialEq + std::fmt::Display>(
    forced: &std::cell::Cell<Option<T>>,
    tile: Option<T>,
    runnable: &[T],
    kind: &str,
    adapter: &str,
) -> Result<()> {
    if let Some(t) = tile
        && !runnable.contains(&t)
    {
        bail!("{kind} variant {t} is not one this adapter can run ({adapter})");
    }
    forced.set(tile);
    Ok(())
}

/// Where to cut a piece whose operands do not fit one binding: its longest range halved (halving K turns
/// the second half into an accumulation).
fn binding_split(rows: &Range<usize>, cols: &Range<usize>, ks: &Range<usize>) -> Split {
    let (lr, lc, lk) = (rows.len(), cols.len(), ks.len());
    if lk >= lr && lk >= lc && lk > 1 {
        Split::K(ks.start + lk / 2)
    } else if lr >= lc && lr > 1 {
        Split::Rows(rows.start + lr / 2)
    } else {
        assert!(lc > 1, "matmul: a single element's operands exceed one binding");
        Split::Cols(cols.start + lc / 2)
    }
}

/// Where [`GpuDevice::matmul_piece`] cuts a piece in two: at this k (the second half accumulates), this
/// row of C, or this column.
enum Split {
    K(usize),
    Rows(usize),
    Cols(usize),
}
