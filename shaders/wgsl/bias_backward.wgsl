// bias_backward: dbias (N) += column sums of dout (M, N), by blocks of rows (common/column_lanes.wgsl):
// `out` is dbias itself where the piece has one block, else the partials that column_partials_sum adds.

struct Params { m: u32, n: u32, dout_off: u32, out_off: u32, rows_per_block: u32, blocks: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> dout: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(32, 8, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let col = wg.x * 32u + lid.x;
    let rows = block_rows(wg.y, p.rows_per_block, p.m);
    var sum = 0.0;
    if (col < p.n) {
        for (var r = rows.first + lid.y; r < rows.end; r += 8u) { sum += dout[p.dout_off + r * p.n + col]; }
    }
    let total = column_lanes_sum(lid, sum);
    if (lid.y == 0u && col < p.n) {
        let i = column_store_index(p.out_off, p.blocks, wg.y, p.n, col);
        if (p.blocks == 1u) { out[i] += total; } else { out[i] = total; }
    }
}
