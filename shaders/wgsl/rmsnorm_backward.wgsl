// rmsnorm_backward, two entry points (xhat = x * rstd, g = dout * weight):
//   input_grad: dx (rows, C) += rstd * (g - xhat * mean(g * xhat)); one workgroup per row, the mean summed
//               as in rmsnorm_forward (lane partials with fma, then workgroup_sum's tree).
//   param_grad: dweight (C) += sum over rows of dout * xhat; a workgroup owns 32 columns with 8 lanes over
//               rows (lane y: rows y, y + 8, ...), the 8 partials added in order (deterministic, no atomics).
// Multiply-adds are explicit fma, not a * b + c (which a driver may or may not contract), with mul_add at
// the same places in the twin (engine/src/ops/rmsnorm.rs): where fma is fused the two round alike.

struct Params { rows: u32, channels: u32, x_off: u32, dout_off: u32, dx_off: u32, rstd_off: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read> rstd: array<f32>;
@group(0) @binding(5) var<storage, read_write> dx: array<f32>;
@group(0) @binding(6) var<storage, read_write> dweight: array<f32>;

// workgroup_sum(lane, value) and its scratch come from common/workgroup_sum.wgsl.

@compute @workgroup_size(256, 1, 1)
fn input_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lane: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) { return; }
    let r = rstd[p.rstd_off + row];
    let xb = p.x_off + row * p.channels;
    let db = p.dout_off + row * p.channels;
    var gx_sum = 0.0;
    for (var c = lane; c < p.channels; c += 256u) {
        gx_sum = fma(dout[db + c] * weight[c], x[xb + c] * r, gx_sum);
    }
    let gx_mean = workgroup_sum(lane, gx_sum) / f32(p.channels);
    let ob = p.dx_off + row * p.channels;
    for (var c = lane; c < p.channels; c += 256u) {
        let g = dout[db + c] * weight[c];
        let xhat = x[xb + c] * r;
        dx[ob + c] = fma(r, fma(-xhat, gx_mean, g), dx[ob + c]);
    }
}

var<workgroup> partial_w: array<f32, 256>;

@compute @workgroup_size(32, 8, 1)
fn param_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let col = wg.x * 32u + lid.x;
    var sw = 0.0;
    if (col < p.channels) {
        for (var row = lid.y; row < p.rows; row += 8u) {
            let xhat = x[p.x_off + row * p.channels + col] * rstd[p.rstd_off + row];
            sw = fma(dout[p.dout_off + row * p.channels + col], xhat, sw);
        }
    }
    partial_w[lid.y * 32u + lid.x] = sw;
    workgroupBarrier();
    if (lid.y == 0u && col < p.channels) {
        var total = 0.0;
        for (var l = 0u; l < 8u; l++) { total += partial_w[l * 32u + lid.x]; }
        dweight[col] += total;
    }
}
