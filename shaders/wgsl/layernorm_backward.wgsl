// layernorm_backward, two entry points:
//   input_grad: dx (rows, C) += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight; one workgroup per row.
//   param_grad: dweight (C) += sum over rows of dout * xhat, dbias (C) += sum of dout, by blocks of rows
//               (common/column_lanes.wgsl): `dweight` and `dbias` are the outputs themselves where the
//               piece has one block, else the two outputs' partials.

struct Params {
    rows: u32, channels: u32, x_off: u32, dout_off: u32, dx_off: u32, stat_off: u32,
    // param_grad only:
    rows_per_block: u32, blocks: u32, dweight_off: u32, dbias_off: u32, _pad0: u32, _pad1: u32,
}

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

@compute @workgroup_size(32, 8, 1)
fn param_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let col = wg.x * 32u + lid.x;
    let rows = block_rows(wg.y, p.rows_per_block, p.rows);
    var sw = 0.0;
    var sb = 0.0;
    if (col < p.channels) {
        for (var row = rows.first + lid.y; row < rows.end; row += 8u) {
            let d = dout[p.dout_off + row * p.channels + col];
            let xhat = (x[p.x_off + row * p.channels + col] - mean[p.stat_off + row]) * rstd[p.stat_off + row];
            sw += d * xhat;
            sb += d;
        }
    }
    let tw = column_lanes_sum(lid, sw);
    let tb = column_lanes_sum(lid, sb);
    if (lid.y == 0u && col < p.channels) {
        let iw = column_store_index(p.dweight_off, p.blocks, wg.y, p.channels, col);
        let ib = column_store_index(p.dbias_off, p.blocks, wg.y, p.channels, col);
        if (p.blocks == 1u) {
            dweight[iw] += tw;
            dbias[ib] += tb;
        } else {
            dweight[iw] = tw;
            dbias[ib] = tb;
        }
    }
}
