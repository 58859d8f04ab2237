// Shared by the column sums over rows (bias_backward, layernorm's and rmsnorm's param_grad), each run on
// a grid of (columns / 32, blocks) workgroups of 32 x 8 lanes: workgroup (x, y) owns 32 columns of block
// y of the rows, lane (col, l) sums rows l, l + 8, ... of the block, and the 8 lane sums are added in lane
// order. A piece of rows with one block adds its totals into the output itself; with several, each block
// writes its totals to the partials (block-major) and column_partials_sum.wgsl adds them in block order.
// Many blocks fill the GPU where the output is short (N = 768 gave 24 workgroups in all).

var<workgroup> column_lanes: array<f32, 256>;

// The rows of the piece that block `block` sums: first..end.
struct BlockRows { first: u32, end: u32 }

fn block_rows(block: u32, rows_per_block: u32, rows: u32) -> BlockRows {
    let first = block * rows_per_block;
    return BlockRows(first, min(rows, first + rows_per_block));
}

// The sum of the 8 lanes' values of column lane `lid.x`, in lane order; meaningful in lanes with y == 0.
// Every lane of the workgroup must call it (it holds barriers).
fn column_lanes_sum(lid: vec3<u32>, value: f32) -> f32 {
    column_lanes[lid.y * 32u + lid.x] = value;
    workgroupBarrier();
    var total = 0.0;
    if (lid.y == 0u) {
        for (var l = 0u; l < 8u; l++) { total += column_lanes[l * 32u + lid.x]; }
    }
    workgroupBarrier();
    return total;
}

// Where block `block`'s total of column `col` goes: added into the output (one block) or stored at the
// block's row of the partials.
fn column_store_index(out_off: u32, blocks: u32, block: u32, n: u32, col: u32) -> u32 {
    if (blocks == 1u) { return out_off + col; }
    return out_off + block * n + col;
}
