// column_partials_sum: dst (N) += the sum over blocks of partials (blocks, N), added in block order (the
// second stage of the column sums in common/column_lanes.wgsl: deterministic, no atomics).

struct Params { blocks: u32, n: u32, partials_off: u32, dst_off: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> partials: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let col = gid.x + gid.y * nwg.x * 256u;
    if (col >= p.n) { return; }
    var total = 0.0;
    for (var b = 0u; b < p.blocks; b++) { total += partials[p.partials_off + b * p.n + col]; }
    dst[p.dst_off + col] += total;
}
