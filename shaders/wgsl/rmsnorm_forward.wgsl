// rmsnorm_forward: Llama's RMSNorm fused with its weight, per row of x (rows, C):
//   rstd = 1 / sqrt(mean(x^2) + eps), out = weight * (x * rstd)   (transformers' order of the products).
// Saves rstd (rows) for the backward pass. One workgroup per row: lane l sums the squares of columns
// l, l + 256, ... with fma, then workgroup_sum adds the lanes in its fixed tree; the twin
// (engine/src/ops/rmsnorm.rs) adds in the same order.

struct Params { rows: u32, channels: u32, eps: f32, x_off: u32, out_off: u32, rstd_off: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> rstd: array<f32>;

// workgroup_sum(lane, value) and its scratch come from common/workgroup_sum.wgsl.

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) { return; }
    let base = p.x_off + row * p.channels;
    var sq = 0.0;
    for (var c = lane; c < p.channels; c += 256u) { let v = x[base + c]; sq = fma(v, v, sq); }
    // 1 / sqrt rather than inverseSqrt: sqrt and division are exact on more drivers (lavapipe among them).
    let r = 1.0 / sqrt(workgroup_sum(lane, sq) / f32(p.channels) + p.eps);
    let obase = p.out_off + row * p.channels;
    for (var c = lane; c < p.channels; c += 256u) {
        out[obase + c] = weight[c] * (x[base + c] * r);
    }
    if (lane == 0u) { rstd[p.rstd_off + row] = r; }
}
