//! The cooperative-matrix side of the gpu matmul (`--matmul-inputs f16`): which variant a product
//! runs, the f16 operand scratch, precasting or packing a piece's operands into it, cutting a piece
//! whose packed operands would not fit it, and the dispatch. A child of `gpu/matmul.rs`, whose
//! [`GpuDevice::matmul_piece`] cuts a product into pieces and hands each here under f16 inputs.

use std::ops::Range;

use anyhow::{Result, bail};

use super::super::{GpuDevice, GpuTensor, Window};
use super::{Split, fits_adapter, force_variant};
use crate::device::alloc::GPU_COOP_SCRATCH_BYTES;
use crate::device::matmul_tuning::MatmulClass;
use crate::device::{HalfFormat, MatmulInputs, MatmulShape};
use crate::ops::matmul::Operand;
use crate::ops::matmul_f16::PackedShape;
use zerostream_shaders::{CoopTile, Loads};

impl GpuDevice {
    /// The variants of the cooperative-matrix matmul this adapter can run (its cooperative size, its
    /// workgroup memory), the size's default first; none without cooperative matrices.
    pub fn coop_variants(&self) -> Vec<CoopTile> {
        let Some(size) = self.coop_size else { return Vec::new() };
        CoopTile::candidates(size).into_iter().filter(|t| fits_adapter(&self.summary, t.workgroup_bytes(), t.workgroup)).collect()
    }

    /// Runs every cooperative-matrix product with `tile` (None: the table's choice per shape class again).
    pub fn force_coop_variant(&self, tile: Option<CoopTile>) -> Result<()> {
        force_variant(&self.coop_forced, tile, &self.coop_variants(), "cooperative matmul", &self.summary.name)
    }

    /// The cooperative-matrix variant a product of this shape runs now (forced, else the table's choice
    /// for its class, else the table's default at the adapter's size); None without cooperative matrices.
    pub fn coop_variant_for(&self, shape: &MatmulShape, b_16bit: bool) -> Option<CoopTile> {
        if let Some(forced) = self.coop_forced.get() {
            return Some(forced);
        }
        let size = self.coop_size?;
        let chosen = self.matmul_table.borrow().choose_coop(&MatmulClass::of(shape, b_16bit), size);
        // A table is checked against the adapter when tuned; a variant it cannot hold falls back.
        Some(if fits_adapter(&self.summary, chosen.workgroup_bytes(), chosen.workgroup) { chosen } else { CoopTile::default_for(size) })
    }

    /// Dispatches `coop_probe.wgsl` (the cooperative multiply-add's own rate, for `bench kernels`):
    /// `workgroups` of 256 invocations, each subgroup `iters` rounds of 8 multiply-adds, into `out` (at
    /// least `coop_probe_count_at(size) + 1` elements). Needs the cooperative-matrix matmul's adapter.
    pub fn coop_probe(&self, out: &GpuTensor, workgroups: u32, iters: u32) -> Result<()> {
        let Some(size) = self.coop_size else {
            bail!("{} cannot run the cooperative-matrix probe", self.summary.name);
        };
        if out.len <= zerostream_shaders::coop_probe_count_at(size) as usize {
            bail!("the cooperative-matrix probe's output needs {} elements", zerostream_shaders::coop_probe_count_at(size) + 1);
        }
        let w = self.window(out, 0..out.len);
        self.dispatch(zerostream_shaders::coop_probe_kernel(size), "main", &[iters, 0, 0, 0], &[(1, w.binding)], [workgroups, 1, 1]);
        Ok(())
    }

    /// Whether this adapter can run the cooperative-matrix matmul (`--matmul-inputs f16`).
    pub fn has_coop_matmul(&self) -> bool {
        self.coop_size.is_some()
    }

    /// The cooperative size the matmul runs at on this adapter (16, else 8), None where it cannot run.
    pub fn coop_size(&self) -> Option<u32> {
        self.coop_size
    }

    /// The scratch of a product's f16 operands, precast or packed ([`Loads`]), made at the first call;
    /// None where the budget cannot hold it.
    fn coop_scratch(&self) -> Option<&GpuTensor> {
        self.coop_scratch
            .get_or_init(|| {
                let halves = (GPU_COOP_SCRATCH_BYTES / 2) as usize;
                let usage = wgpu::BufferUsages::STORAGE;
                self.create_formatted(halves, Some(HalfFormat::F16), "f16 operand scratch", usage).ok()
            })
            .as_ref()
    }

    /// Rounds A's span (and B's, when B is f32) to f16 into the scratch, with the kernels' own rounding
    /// (`cast_f32_to_f16.wgsl`), and returns their windows there (B's None for a 16-bit B, which the
    /// kernel reads as stored); None when the scratch is missing or too small for this piece.
    fn precast_operands<'s>(
        &'s self,
        a: &GpuTensor,
        b: &GpuTensor,
        a_span: Range<usize>,
        b_span: Range<usize>,
    ) -> Option<(Window<'s>, Option<Window<'s>>)> {
        let scratch = self.coop_scratch()?;
        // B's halves start on a binding-aligned word after A's.
        let b_start = 2 * (a_span.len().div_ceil(2).div_ceil(self.align_elems) * self.align_elems);
        let b_len = if b.format.is_none() { b_span.len() } else { 0 };
        if b_start + b_len > scratch.len {
            return None;
        }
        self.cast_span_to_f16(scratch, 0, a, a_span.clone());
        let sa = self.packed_window(scratch, 0..a_span.len());
        let sb = (b.format.is_none()).then(|| {
            self.cast_span_to_f16(scratch, b_start, b, b_span);
            self.packed_window(scratch, b_start..b_start + b_len)
        });
        Some((sa, sb))
    }

    /// Packs a packing variant's operands (`Loads::packs_operands`) for one piece into the scratch
    /// (`pack_f16.wgsl`): A as [M_pad][K_pad] and B as [K_pad][N_pad] halves, zero-padded to whole
    /// workgroup tiles along M and N and whole K steps along K. Returns their windows (each starting a
    /// binding, so at half 0) and the padded row lengths K_pad and N_pad; None where the scratch or one
    /// binding cannot hold them.
    fn pack_operands<'s>(
        &'s self,
        a: &GpuTensor,
        b: &GpuTensor,
        s: &MatmulShape,
        (rows, cols, ks): (&Range<usize>, &Range<usize>, &Range<usize>),
        tile: &CoopTile,
    ) -> Option<(Window<'s>, Window<'s>, usize, usize)> {
        let scratch = self.coop_scratch()?;
        let (m, n, k) = (rows.len(), cols.len(), ks.len());
        let PackedLayout { mp, np, kp, b_start } = packed_layout(tile, self.align_elems, m, n, k);
        if b_start + kp * np > scratch.len || !self.fits(&(0..mp * kp)) || !self.fits(&(0..kp * np)) {
            return None;
        }
        let a_op = Operand { offset: s.a.at(rows.start, ks.start), ..s.a };
        self.pack_f16_into(scratch, 0, a, &a_op, &PackedShape { rows: m, cols: k, rows_pad: mp, cols_pad: kp });
        let b_op = Operand { offset: s.b.at(ks.start, cols.start), ..s.b };
        self.pack_f16_into(scratch, b_start, b, &b_op, &PackedShape { rows: k, cols: n, rows_pad: kp, cols_pad: np });
        Some((self.packed_window(scratch, 0..mp * kp), self.packed_window(scratch, b_start..b_start + kp * np), kp, np))
    }

    /// Under `--matmul-inputs f16`, where the piece's variant packs its operands ([`Loads`]) and they would
    /// not fit the scratch (64 MiB; the vocabulary's products and GPT-2 1.5B's MLP do not), where to cut
    /// it ([`split_to_fit_scratch`]); else None.
    pub(super) fn packing_split(&self, s: &MatmulShape, b_half: bool, rows: &Range<usize>, cols: &Range<usize>, k: usize) -> Option<Split> {
        if self.matmul_inputs.get() != MatmulInputs::F16 {
            return None;
        }
        let tile = self.coop_variant_for(&MatmulShape { m: rows.len(), n: cols.len(), k, ..*s }, b_half)?;
        let scratch_halves = (GPU_COOP_SCRATCH_BYTES / 2) as usize;
        tile.loads.packs_operands().then(|| split_to_fit_scratch(&tile, self.align_elems, rows, cols, k, scratch_halves)).flatten()
    }

    /// The cooperative-matrix matmul of one piece with variant `tile` (the same Params as the fp32
    /// kernel's, no vec4 views): packed operands for the packing variants, precast ones for the precast
    /// variants, else (or where the scratch cannot hold the piece) staged from A and B as they are, in the
    /// variant's own shape where the adapter holds its tiles, else the default's. The same bits every way.
    pub(super) fn dispatch_coop_piece(&self, a: &GpuTensor, b: &GpuTensor, tile: CoopTile, piece: CoopPiece) {
        let CoopPiece { s, rows, cols, ks, params, windows: (wa, wb, wc), bias } = piece;
        let grid_of = |t: &CoopTile| [(cols.len() as u32).div_ceil(t.tile_n), (rows.len() as u32).div_ceil(t.tile_m), 1];
        if tile.loads.packs_operands()
            && let Some((pa, pb, kp, np)) = self.pack_operands(a, b, s, (&rows, &cols, &ks), &tile)
        {
            let mut params = params;
            (params[4], params[5], params[6]) = (pa.elem_offset, kp as u32, 1); // A: [M_pad][K_pad]
            (params[8], params[9], params[10], params[11]) = (pb.elem_offset, np as u32, 1, 1); // B: [K_pad][N_pad]
            let bindings = [(1, pa.binding), (2, pb.binding), (3, bias), (4, wc.binding)];
            self.dispatch(tile.kernel(), "main", &params, &bindings, grid_of(&tile));
            return;
        }
        let (a_span, b_span) = (s.a.span(rows.clone(), ks.clone()), s.b.span(ks.clone(), cols.clone()));
        let scratch = if tile.loads == Loads::Precast { self.precast_operands(a, b, a_span, b_span) } else { None };
        let Some((sa, sb)) = scratch else {
            let staged = CoopTile { loads: Loads::Elements, ..tile };
            let fits = fits_adapter(&self.summary, staged.workgroup_bytes(), staged.workgroup);
            let tile = if fits { staged } else { CoopTile::default_for(tile.coop) };
            let bindings = [(1, wa.binding), (2, wb.binding), (3, bias), (4, wc.binding)];
            self.dispatch(tile.kernel(), "main", &params, &bindings, grid_of(&tile));
            return;
        };
        let mut params = params;
        params[4] = sa.elem_offset; // A's halves
        let b_binding = match sb {
            Some(sb) => {
                (params[8], params[11]) = (sb.elem_offset, 1); // B's halves, as an f16 B
                sb.binding
            }
            None => wb.binding, // a 16-bit B, read as stored
        };
        self.dispatch(tile.kernel(), "main", &params, &[(1, sa.binding), (2, b_binding), (3, bias), (4, wc.binding)], grid_of(&tile));
    }
}

/// Where a packing variant's operands of an m x n x k piece lie in the scratch, in halves (`align_elems`:
/// the adapter's binding alignment in words).
fn packed_layout(tile: &CoopTile, align_elems: usize, m: usize, n: usize, k: usize) -> PackedLayout {
    // K to whole K steps (a multiple of the cooperative size): the wide kernel loads whole steps.
    let (mp, np, kp) =
        (m.next_multiple_of(tile.tile_m as usize), n.next_multiple_of(tile.tile_n as usize), k.next_multiple_of(tile.tile_k as usize));
    // B starts a binding of its own, 16-byte aligned as every cooperative load's address must be.
    let b_start = (mp * kp).next_multiple_of(2 * align_elems.max(8));
    PackedLayout { mp, np, kp, b_start }
}

/// Where a piece's packed operands would not fit `scratch_halves`, the cut of its longer side at a whole
/// workgroup tile near its half; None where they fit, or where no cut can make them fit (not even one
/// tile's at this K): the piece is then staged from A and B as they are. Cutting rows or columns is exact: every element of C keeps
/// its one chain over K, and every variant gives the same bits.
fn split_to_fit_scratch(
    tile: &CoopTile,
    align_elems: usize,
    rows: &Range<usize>,
    cols: &Range<usize>,
    k: usize,
    scratch_halves: usize,
) -> Option<Split> {
    let (m, n) = (rows.len(), cols.len());
    let fits = |m: usize, n: usize| {
        let layout = packed_layout(tile, align_elems, m, n, k);
        layout.b_start + layout.kp * layout.np <= scratch_halves
    };
    // Where even one workgroup tile's operands cannot fit (K past ~130k at 128 x 128 tiles), cutting
    // would only make thousands of staged dispatches: the piece is staged whole.
    if fits(m, n) || !fits(m.min(tile.tile_m as usize), n.min(tile.tile_n as usize)) {
        return None;
    }
    // Each of A's rows and B's columns costs K_pad halves: halving the longer side saves the most.
    let half_at = |len: usize, tile_len: u32| Some((len / 2).next_multiple_of(tile_len as usize)).filter(|&h| h > 0 && h < len);
    let by_rows = half_at(m, tile.tile_m).map(|h| Split::Rows(rows.start + h));
    let by_cols = half_at(n, tile.tile_n).map(|h| Split::Cols(cols.start + h));
    if m >= n { by_rows.or(by_cols) } else { by_cols.or(by_rows) }
}

/// A packing variant's operands in the scratch, in halves: A's rows and B's columns padded to whole
/// tiles (`mp`, `np`), K to whole K steps (`kp`), and where B starts.
struct PackedLayout {
    mp: usize,
    np: usize,
    kp: usize,
    b_start: usize,
}

/// One piece of a product for [`GpuDevice::dispatch_coop_piece`]: its shape and ranges, the fp32
/// kernel's Params, the windows of A, B and C, and the binding in the bias's place.
pub(super) struct CoopPiece<'s, 'w> {
    pub(super) s: &'s MatmulShape,
    pub(super) rows: Range<usize>,
    pub(super) cols: Range<usize>,
    pub(super) ks: Range<usize>,
    pub(super) params: [u32; 16],
    pub(super) windows: (Window<'w>, Window<'w>, Window<'w>),
    pub(super) bias: wgpu::BufferBinding<'w>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cuts `rows x cols` as `matmul_piece` does until every piece fits, returning the pieces.
    fn pieces(tile: &CoopTile, rows: Range<usize>, cols: Range<usize>, k: usize, scratch: usize) -> Vec<(Range<usize>, Range<usize>)> {
        match split_to_fit_scratch(tile, 64, &rows, &cols, k, scratch) {
            None => vec![(rows, cols)],
            Some(Split::Rows(mid)) => {
                let mut out = pieces(tile, rows.start..mid, cols.clone(), k, scratch);
                out.extend(pieces(tile, mid..rows.end, cols, k, scratch));
                out
            }
            Some(Split::Cols(mid)) => {
                let mut out = pieces(tile, rows.clone(), cols.start..mid, k, scratch);
                out.extend(pieces(tile, rows, mid..cols.end, k, scratch));
                out
            }
            Some(Split::K(_)) => panic!("the scratch never splits K"),
        }
    }

    /// The products that outgrew the scratch on an H200 (GPT-2's vocabulary chunks, GPT-2 1.5B's MLP,
    /// a whole vocabulary) and awkward ones: the pieces tile C exactly, each cut on a workgroup tile, and
    /// each piece's packed operands fit.
    #[test]
    fn packed_pieces_cover_c_and_fit_the_scratch() {
        let scratch = (GPU_COOP_SCRATCH_BYTES / 2) as usize;
        let wide = CoopTile { loads: Loads::Wide, ..CoopTile::default_for(16) };
        let small = CoopTile { loads: Loads::Wide, tile_m: 64, tile_n: 64, frag_m: 2, frag_n: 2, workgroup: 128, ..wide };
        let cases = [(4096, 768, 8192), (8192, 768, 4096), (4096, 1600, 6400), (4096, 50257, 768), (4099, 131, 9001), (130, 5000, 7000)];
        for tile in [wide, small] {
            for (m, n, k) in cases {
                let got = pieces(&tile, 0..m, 0..n, k, scratch);
                let mut covered = vec![0u8; m.div_ceil(tile.tile_m as usize) * n.div_ceil(tile.tile_n as usize)];
                for (rows, cols) in &got {
                    let l = packed_layout(&tile, 64, rows.len(), cols.len(), k);
                    assert!(l.b_start + l.kp * l.np <= scratch, "{tile} {m}x{n}x{k}: piece {rows:?} x {cols:?} does not fit");
                    assert!(rows.start % tile.tile_m as usize == 0 && cols.start % tile.tile_n as usize == 0, "{tile}: cut off a tile");
                    for r in (rows.start..rows.end).step_by(tile.tile_m as usize) {
                        for c in (cols.start..cols.end).step_by(tile.tile_n as usize) {
                            covered[r / tile.tile_m as usize * n.div_ceil(tile.tile_n as usize) + c / tile.tile_n as usize] += 1;
                        }
                    }
                }
                assert!(covered.iter().all(|&c| c == 1), "{tile} {m}x{n}x{k}: the pieces do not tile C once");
                let fits_whole = packed_layout(&tile, 64, m, n, k);
                assert_eq!(got.len() == 1, fits_whole.b_start + fits_whole.kp * fits_whole.np <= scratch, "{tile} {m}x{n}x{k}");
            }
            // K so long that one tile's operands cannot fit (a weight gradient over 200k tokens), a side
            // of 1 or a ragged side: never cut into tiles (nor forever), staged whole.
            for (m, n, k) in [(1, 4096, 300_000), (129, 100, 300_000), (4096, 4096, 300_000), (1, 1, 300_000)] {
                assert!(split_to_fit_scratch(&tile, 64, &(0..m), &(0..n), k, scratch).is_none(), "{tile} {m}x{n}x{k}");
            }
        }
        // A side of 1 beside one that can be cut: cut that one, never at 0.
        let wide = CoopTile { loads: Loads::Wide, ..CoopTile::default_for(16) };
        let got = pieces(&wide, 0..1, 0..60000, 8192, scratch);
        assert!(got.len() > 1 && got.iter().all(|(r, c)| r.len() == 1 && !c.is_empty()), "{got:?}");
    }
}
