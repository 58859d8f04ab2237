// bias_backward: dbias (N) += column sums of dout (M, N).
// A workgroup owns 32 columns; 8 lanes per column each sum every 8th row, then the lanes are added in a
// fixed order, so the result is deterministic.

struct Params { m: u32, n: u32, dout_off: u32, dbias_off: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> dout: array<f32>;
@group(0) @binding(2) var<storage, read_write> dbias: array<f32>;

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(32, 8, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let col = wg.x * 32u + lid.x;
    var sum = 0.0;
    if (col < p.n) {
        for (var r = lid.y; r < p.m; r += 8u) { sum += dout[p.dout_off + r * p.n + col]; }
    }
    partial[lid.y * 32u + lid.x] = sum;
    workgroupBarrier();
    if (lid.y == 0u && col < p.n) {
        var total = 0.0;
        for (var l = 0u; l < 8u; l++) { total += partial[l * 32u + lid.x]; }
        dbias[p.dbias_off + col] += total;
    }
}
