//! Column sums over rows on the gpu device — `bias_backward` and the layer norms' parameter gradients —
//! in two deterministic stages (the kernels' half is `shaders/wgsl/common/column_lanes.wgsl`): a grid of
//! workgroups, one per 32 columns and block of [`COLUMN_BLOCK_ROWS`] rows, writes each block's sums to a
//! scratch buffer, and `column_partials_sum.wgsl` adds them into the output in block order. A workgroup
//! per 32 columns alone left an H100 nearly idle where the output is short (N = 768: 24 workgroups,
//! 4-15% of the copy bandwidth in benches/results/2026-11-23-h100-gpu.md). A piece of one block skips the
//! scratch and adds into the output itself. The order of the sums depends on the pieces (a binding's
//! size and the scratch's), never on timing. A child module of `gpu`, so it uses that file's helpers.

use std::ops::Range;

use super::{GpuDevice, GpuTensor, Window};
use crate::device::alloc::GPU_COLUMN_PARTIALS_BYTES;
use crate::ops::COLUMN_BLOCK_ROWS;
use zerostream_shaders as shaders;

/// Blocks one dispatch may have (the grid's y dimension).
const MAX_BLOCKS: usize = 65535;

/// One dispatch's rows of a column sum and their blocking.
pub(super) struct ColumnPiece {
    pub rows: Range<usize>,
    pub blocks: usize,
}

impl ColumnPiece {
    /// Rows each workgroup sums: the whole piece when it is one block, else [`COLUMN_BLOCK_ROWS`].
    pub fn rows_per_block(&self) -> usize {
        if self.blocks == 1 { self.rows.len().max(1) } else { COLUMN_BLOCK_ROWS }
    }

    /// The column-sum kernels' grid: 32 columns by one block of rows per workgroup.
    pub fn grid(&self, n: usize) -> [u32; 3] {
        [n.div_ceil(32) as u32, self.blocks as u32, 1]
    }
}

impl GpuDevice {
    /// The scratch the partials go to, made (and charged to the budget) by the first column sum.
    fn column_partials(&self) -> &GpuTensor {
        self.column_partials.get_or_init(|| {
            let usage = wgpu::BufferUsages::STORAGE;
            let len = GPU_COLUMN_PARTIALS_BYTES as usize / 4;
            // The planner counts these bytes (`AllocCosts::fixed_bytes`) in every training budget.
            self.create_tensor(len, "column-sum partials", usage).expect("the column sums' 1 MiB scratch within the device budget")
        })
    }

    /// Splits `rows` rows of `n` columns, summed into `outputs` vectors, into pieces whose row windows fit
    /// one binding and whose partials fit the scratch (one window of it per output, aligned and
    /// disjoint). Where not even two blocks' partials fit, each piece is one block of all its rows.
    pub(super) fn column_pieces(&self, rows: usize, n: usize, outputs: usize) -> Vec<ColumnPiece> {
        let scratch_elems = self.column_partials().len.min(self.max_window_elems);
        let max_blocks = ((scratch_elems / outputs).saturating_sub(self.align_elems) / n.max(1)).min(MAX_BLOCKS);
        let bind_rows = self.rows_per_piece(n);
        let blocked = max_blocks >= 2;
        let piece_rows = if blocked { bind_rows.min(max_blocks * COLUMN_BLOCK_ROWS) } else { bind_rows };
        Self::pieces(rows, piece_rows, 1)
            .into_iter()
            .map(|rows| ColumnPiece { blocks: if blocked { rows.len().div_ceil(COLUMN_BLOCK_ROWS).max(1) } else { 1 }, rows })
            .collect()
    }

    /// Where the kernel writes output `index`'s sums of `piece`: the output itself (one block), or that
    /// output's window of the scratch.
    pub(super) fn column_target<'a>(&'a self, piece: &ColumnPiece, n: usize, output: &'a GpuTensor, index: usize) -> Window<'a> {
        if piece.blocks == 1 {
            return self.window(output, 0..n);
        }
        let stride = (piece.blocks * n).next_multiple_of(self.align_elems);
        self.window(self.column_partials(), index * stride..index * stride + piece.blocks * n)
    }

    /// The second stage: adds each output's partials of `piece` into it, in block order (nothing where
    /// the piece had one block, which added into the output itself).
    pub(super) fn add_column_partials(&self, piece: &ColumnPiece, n: usize, outputs: &[&GpuTensor]) {
        if piece.blocks == 1 {
            return;
        }
        for (index, output) in outputs.iter().enumerate() {
            let (partials, dst) = (self.column_target(piece, n, output, index), self.window(output, 0..n));
            self.dispatch(
                shaders::COLUMN_PARTIALS_SUM,
                "main",
                &[piece.blocks as u32, n as u32, partials.elem_offset, dst.elem_offset],
                &[(1, partials.binding), (2, dst.binding)],
                Self::elementwise_grid(n),
            );
        }
    }
}
