// layernorm_forward: out = (x - mean) * rstd * weight + bias, per row of x (rows, C).
// Saves mean and rstd (rows) for the backward pass. One workgroup per row; two-pass variance as PyTorch.

struct Params { rows: u32, channels: u32, eps: f32, x_off: u32, out_off: u32, stat_off: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> mean: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd: array<f32>;

// workgroup_sum(lane, value) and its scratch come from common/workgroup_sum.wgsl.

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) { return; }
    let base = p.x_off + row * p.channels;
    var s = 0.0;
    for (var c = lane; c < p.channels; c += 256u) { s += x[base + c]; }
    let mu = workgroup_sum(lane, s) / f32(p.channels);
    var sq = 0.0;
    for (var c = lane; c < p.channels; c += 256u) { let d = x[base + c] - mu; sq += d * d; }
    let r = inverseSqrt(workgroup_sum(lane, sq) / f32(p.channels) + p.eps);
    let obase = p.out_off + row * p.channels;
    for (var c = lane; c < p.channels; c += 256u) {
        out[obase + c] = (x[base + c] - mu) * r * weight[c] + bias[c];
    }
    if (lane == 0u) { mean[p.stat_off + row] = mu; rstd[p.stat_off + row] = r; }
}
