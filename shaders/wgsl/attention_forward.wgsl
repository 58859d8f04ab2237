// attention_forward: causal self-attention with grouped-query heads, softmax(q k^T * scale) v per query head.
//   qkv (B, T, (H + 2G) D) = [q (H D) | k (G D) | v (G D)], head h at columns h D of its part; query head
//   h reads key/value head h / group (group = H / G), shared in place by the group. GPT-2: G = H, qkv (B, T, 3C).
//   out (B, T, H D), lse (B, H, T): log-sum-exp of each score row, kept so backward recomputes the
//   probabilities instead of storing (B, H, T, T) of them. With dropout the probabilities are masked
//   after the softmax (lse is the undropped one's).
// One workgroup per (query t, head h, batch b); keys are visited in chunks of 256 whose probabilities
// sit in workgroup memory while the lanes owning output channels accumulate them (so D <= 256).

// Params and prob_dropout come from common/attention_params.wgsl.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;

const LANES: u32 = 256u;
var<workgroup> q_row: array<f32, 256>;
var<workgroup> probs: array<f32, 256>;
// red_max, red_sum, logsumexp_add and workgroup_logsumexp come from common/workgroup_logsumexp.wgsl.

fn score(key: u32, g: u32, b: u32) -> f32 {
    let k_base = p.qkv_off + (b * p.seq_len + key) * p.qkv_width + p.k_start + g * p.head_dim;
    var dot = 0.0;
    for (var d = 0u; d < p.head_dim; d++) { dot = fma(q_row[d], qkv[k_base + d], dot); }
    return dot * p.scale;
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let t = wg.x;
    let h = wg.y;
    let b = wg.z;
    let g = h / p.group;
    let row = b * p.seq_len + t;
    if (lane < p.head_dim) { q_row[lane] = qkv[p.qkv_off + row * p.qkv_width + h * p.head_dim + lane]; }
    workgroupBarrier();

    // Pass 1: running max and sum of exponentials over this lane's keys, then combined across lanes.
    var state = vec2<f32>(-3.0e38, 0.0);
    for (var j = lane; j <= t; j += LANES) { state = logsumexp_add(state, score(j, g, b)); }
    let row_lse = workgroup_logsumexp(lane, state);

    // Pass 2: out = sum_j p_j v_j, one chunk of keys at a time.
    var acc = 0.0;
    let v_col = p.qkv_off + p.v_start + g * p.head_dim + lane;
    for (var j0 = 0u; j0 <= t; j0 += LANES) {
        let j = j0 + lane;
        var pj = 0.0;
        if (j <= t) { pj = exp(score(j, g, b) - row_lse) * prob_dropout(b, h, t, j); }
        probs[lane] = pj;
        workgroupBarrier();
        if (lane < p.head_dim) {
            let n = min(LANES, t + 1u - j0);
            for (var jj = 0u; jj < n; jj++) {
                acc = fma(probs[jj], qkv[v_col + (b * p.seq_len + j0 + jj) * p.qkv_width], acc);
            }
        }
        workgroupBarrier();
    }
    if (lane < p.head_dim) { out[p.out_off + row * p.heads * p.head_dim + h * p.head_dim + lane] = acc; }
    if (lane == 0u) { lse[p.stat_off + (b * p.heads + h) * p.seq_len + t] = row_lse; }
}
