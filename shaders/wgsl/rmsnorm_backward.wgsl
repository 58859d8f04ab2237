// rmsnorm_backward, two entry points (xhat = x * rstd, g = dout * weight):
//   input_grad: dx (rows, C) += rstd * (g - xhat * mean(g * xhat)); one workgroup per row, the mean summed
//               as in rmsnorm_forward (lane partials with fma, then workgroup_sum's tree).
//   param_grad: dweight (C) += sum over rows of dout * xhat, by blocks of rows (common/column_lanes.wgsl;
//               lane y of a block sums its rows y, y + 8, ... with fma): `dweight` is the output itself
//               where the piece has one block, else its partials.
// Multiply-adds are explicit fma, not a * b + c (which a driver may or may not contract), with mul_add at
// the same places in the twin (engine/src/ops/rmsnorm.rs): where fma is fused the two round alike.

struct Params {
    rows: u32, channels: u32, x_off: u32, dout_off: u32, dx_off: u32, rstd_off: u32,
    // param_grad only:
    rows_per_block: u32, blocks: u32, dweight_off: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

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

@compute @workgroup_size(32, 8, 1)
fn param_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let col = wg.x * 32u + lid.x;
    let rows = block_rows(wg.y, p.rows_per_block, p.rows);
    var sw = 0.0;
    if (col < p.channels) {
        for (var row = rows.first + lid.y; row < rows.end; row += 8u) {
            let xhat = x[p.x_off + row * p.channels + col] * rstd[p.rstd_off + row];
            sw = fma(dout[p.dout_off + row * p.channels + col], xhat, sw);
        }
    }
    let total = column_lanes_sum(lid, sw);
    if (lid.y == 0u && col < p.channels) {
        let i = column_store_index(p.dweight_off, p.blocks, wg.y, p.channels, col);
        if (p.blocks == 1u) { dweight[i] += total; } else { dweight[i] = total; }
    }
}
