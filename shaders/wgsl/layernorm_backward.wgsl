// layernorm_backward, two entry points:
//   input_grad: dx (rows, C) += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight; one workgroup per row.
//   param_grad: dweight (C) += sum over rows of dout * xhat, dbias (C) += sum of dout; a workgroup owns 32
//               columns with 8 lanes over rows, added in a fixed order (deterministic).

struct Params { rows: u32, channels: u32, x_off: u32, dout_off: u32, dx_off: u32, stat_off: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read> mean: array<f32>;
@group(0) @binding(5) var<storage, read> rstd: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
@group(0) @binding(7) var<storage, read_write> dweight: array<f32>;
@group(0) @binding(8) var<storage, read_write> dbias: array<f32>;

// workgroup_sum(lane, value) and its scratch come from common/workgroup_sum.wgsl.

@compute @workgroup_size(256, 1, 1)
fn input_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lane: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) { return; }
    let mu = mean[p.stat_off + row];
    let r = rstd[p.stat_off + row];
    let xb = p.x_off + row * p.channels;
    let db = p.dout_off + row * p.channels;
    var g_sum = 0.0;
    var gx_sum = 0.0;
    for (var c = lane; c < p.channels; c += 256u) {
        let g = dout[db + c] * weight[c];
        g_sum += g;
        gx_sum += g * (x[xb + c] - mu) * r;
    }
    let g_mean = workgroup_sum(lane, g_sum) / f32(p.channels);
    let gx_mean = workgroup_sum(lane, gx_sum) / f32(p.channels);
    let ob = p.dx_off + row * p.channels;
    for (var c = lane; c < p.channels; c += 256u) {
        let xhat = (x[xb + c] - mu) * r;
        let g = dout[db + c] * weight[c];
        dx[ob + c] += r * (g - g_mean - xhat * gx_mean);
    }
}

var<workgroup> partial_w: array<f32, 256>;
var<workgroup> partial_b: array<f32, 256>;

@compute @workgroup_size(32, 8, 1)
fn param_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let col = wg.x * 32u + lid.x;
    var sw = 0.0;
    var sb = 0.0;
    if (col < p.channels) {
        for (var row = lid.y; row < p.rows; row += 8u) {
            let d = dout[p.dout_off + row * p.channels + col];
            let xhat = (x[p.x_off + row * p.channels + col] - mean[p.stat_off + row]) * rstd[p.stat_off + row];
            sw += d * xhat;
            sb += d;
        }
    }
    partial_w[lid.y * 32u + lid.x] = sw;
    partial_b[lid.y * 32u + lid.x] = sb;
    workgroupBarrier();
    if (lid.y == 0u && col < p.channels) {
        var tw = 0.0;
        var tb = 0.0;
        for (var l = 0u; l < 8u; l++) { tw += partial_w[l * 32u + lid.x]; tb += partial_b[l * 32u + lid.x]; }
        dweight[col] += tw;
        dbias[col] += tb;
    }
}
