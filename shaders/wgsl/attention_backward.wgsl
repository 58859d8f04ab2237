// attention_backward, two entry points that together write every element of dqkv once (layouts as in
// attention_forward.wgsl: qkv and dqkv (B, T, (H + 2G) D), query head h reads key/value head h / group):
//   query_grad (one workgroup per query t, query head h, batch b):
//       delta_t = dout_t . out_t, and dq_t = scale * sum_j p_tj (dout_t . v_j - delta_t) k_j
//   key_value_grad (one workgroup per key j, key/value head g, batch b), summing over the group's query
//       heads h: dv_j = sum_h sum_{i>=j} p_ij dout_i, dk_j = scale * sum_h sum_{i>=j} p_ij (dout_i . v_j - delta_i) q_i
// Probabilities are recomputed from the saved log-sum-exp; key_value_grad needs delta from query_grad.
// With dropout (mask m, forward used m p): dv_j sums m_ij p_ij dout_i and ds_ij = p_ij (m_ij dout_i . v_j -
// delta_i); delta = dout . out is unchanged, since out already holds the masked sum.
// A shared head's gradient is one workgroup's running sum over the group's heads in order: deterministic,
// without atomics or a second reduction pass.

// Params and prob_dropout come from common/attention_params.wgsl.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> out: array<f32>;
@group(0) @binding(3) var<storage, read> dout: array<f32>;
@group(0) @binding(4) var<storage, read> lse: array<f32>;
@group(0) @binding(5) var<storage, read_write> delta: array<f32>;
@group(0) @binding(6) var<storage, read_write> dqkv: array<f32>;

const LANES: u32 = 256u;
var<workgroup> row_a: array<f32, 256>; // query_grad: q_t;   key_value_grad: k_j
var<workgroup> row_b: array<f32, 256>; // query_grad: dout_t; key_value_grad: v_j
var<workgroup> chunk_p: array<f32, 256>;
var<workgroup> chunk_ds: array<f32, 256>;

// Column `part_start` (0, k_start or v_start) + head * D of row (b, t) of qkv or dqkv.
fn qkv_index(b: u32, t: u32, part_start: u32, head: u32) -> u32 {
    return p.qkv_off + (b * p.seq_len + t) * p.qkv_width + part_start + head * p.head_dim;
}
fn out_index(b: u32, t: u32, h: u32) -> u32 {
    return p.out_off + ((b * p.seq_len + t) * p.heads + h) * p.head_dim;
}
fn stat_index(b: u32, h: u32, t: u32) -> u32 { return p.stat_off + (b * p.heads + h) * p.seq_len + t; }

@compute @workgroup_size(256, 1, 1)
fn query_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let t = wg.x;
    let h = wg.y;
    let b = wg.z;
    let g = h / p.group;
    if (lane < p.head_dim) {
        row_a[lane] = qkv[qkv_index(b, t, 0u, h) + lane];
        row_b[lane] = dout[out_index(b, t, h) + lane];
        chunk_p[lane] = row_b[lane] * out[out_index(b, t, h) + lane];
    }
    workgroupBarrier();
    var dl = 0.0;
    for (var d = 0u; d < p.head_dim; d++) { dl += chunk_p[d]; }
    let row_lse = lse[stat_index(b, h, t)];
    workgroupBarrier();

    var acc = 0.0;
    for (var j0 = 0u; j0 <= t; j0 += LANES) {
        let j = j0 + lane;
        var ds = 0.0;
        if (j <= t) {
            let kb = qkv_index(b, j, p.k_start, g);
            let vb = qkv_index(b, j, p.v_start, g);
            var qk = 0.0;
            var dov = 0.0;
            for (var d = 0u; d < p.head_dim; d++) {
                qk = fma(row_a[d], qkv[kb + d], qk);
                dov = fma(row_b[d], qkv[vb + d], dov);
            }
            let pj = exp(qk * p.scale - row_lse);
            ds = pj * (dov * prob_dropout(b, h, t, j) - dl);
        }
        chunk_ds[lane] = ds;
        workgroupBarrier();
        if (lane < p.head_dim) {
            let n = min(LANES, t + 1u - j0);
            for (var jj = 0u; jj < n; jj++) { acc = fma(chunk_ds[jj], qkv[qkv_index(b, j0 + jj, p.k_start, g) + lane], acc); }
        }
        workgroupBarrier();
    }
    if (lane < p.head_dim) { dqkv[qkv_index(b, t, 0u, h) + lane] = acc * p.scale; }
    if (lane == 0u) { delta[stat_index(b, h, t)] = dl; }
}

@compute @workgroup_size(256, 1, 1)
fn key_value_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let j = wg.x;
    let g = wg.y;
    let b = wg.z;
    if (lane < p.head_dim) {
        row_a[lane] = qkv[qkv_index(b, j, p.k_start, g) + lane];
        row_b[lane] = qkv[qkv_index(b, j, p.v_start, g) + lane];
    }
    workgroupBarrier();
    var acc_k = 0.0;
    var acc_v = 0.0;
    for (var h = g * p.group; h < (g + 1u) * p.group; h++) {
        for (var i0 = j; i0 < p.seq_len; i0 += LANES) {
            let i = i0 + lane;
            var pi = 0.0;
            var ds = 0.0;
            if (i < p.seq_len) {
                let qb = qkv_index(b, i, 0u, h);
                let ob = out_index(b, i, h);
                var qk = 0.0;
                var dov = 0.0;
                for (var d = 0u; d < p.head_dim; d++) {
                    qk = fma(qkv[qb + d], row_a[d], qk);
                    dov = fma(dout[ob + d], row_b[d], dov);
                }
                let m = prob_dropout(b, h, i, j);
                let pu = exp(qk * p.scale - lse[stat_index(b, h, i)]);
                ds = pu * (dov * m - delta[stat_index(b, h, i)]);
                pi = pu * m;
            }
            chunk_p[lane] = pi;
            chunk_ds[lane] = ds;
            workgroupBarrier();
            if (lane < p.head_dim) {
                let n = min(LANES, p.seq_len - i0);
                for (var ii = 0u; ii < n; ii++) {
                    acc_v = fma(chunk_p[ii], dout[out_index(b, i0 + ii, h) + lane], acc_v);
                    acc_k = fma(chunk_ds[ii], qkv[qkv_index(b, i0 + ii, 0u, h) + lane], acc_k);
                }
            }
            workgroupBarrier();
        }
    }
    if (lane < p.head_dim) {
        dqkv[qkv_index(b, j, p.k_start, g) + lane] = acc_k * p.scale;
        dqkv[qkv_index(b, j, p.v_start, g) + lane] = acc_v;
    }
}
