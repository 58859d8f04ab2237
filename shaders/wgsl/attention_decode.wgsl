// attention_decode: n new query rows against a key/value cache (generation with a KV cache, one sequence).
//   qkv (n, (H + 2G) D) = [q (H D) | k (G D) | v (G D)] of the new tokens, at positions past .. past + n;
//   cache (capacity, 2 G D): row t = [k_t (G D) | v_t (G D)]; out (n, H D).
// `append` copies the new rows' k and v into cache rows past .. past + n (one thread per float); `main`
// then runs one workgroup per (new row i, query head h): softmax(q k^T * scale) over cache rows
// 0 ..= past + i, times v, with key/value head h / group. Same operations in the same order as the
// attention_forward twin (ops/attention.rs); the tiled attention_forward.wgsl sums in another order, so
// on the gpu a cached step equals the full recompute up to rounding.

struct Params {
    rows: u32, past: u32, heads: u32, group: u32,
    head_dim: u32, scale: f32, qkv_width: u32, k_start: u32,
    // Floats of k (and of v) in one row (G D); where the bound windows start.
    kv_width: u32, qkv_off: u32, out_off: u32, cache_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const LANES: u32 = 256u;
var<workgroup> q_row: array<f32, 256>;
var<workgroup> probs: array<f32, 256>;
// red_max, red_sum, logsumexp_add and workgroup_logsumexp come from common/workgroup_logsumexp.wgsl.

@compute @workgroup_size(256, 1, 1)
fn append(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    let width = 2u * p.kv_width;
    if (idx >= p.rows * width) { return; }
    let row = idx / width;
    let e = idx % width;
    cache[p.cache_off + (p.past + row) * width + e] = qkv[p.qkv_off + row * p.qkv_width + p.k_start + e];
}

fn score(key: u32, g: u32) -> f32 {
    let k_base = p.cache_off + key * 2u * p.kv_width + g * p.head_dim;
    var dot = 0.0;
    for (var d = 0u; d < p.head_dim; d++) { dot = fma(q_row[d], cache[k_base + d], dot); }
    return dot * p.scale;
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = wg.x;
    let h = wg.y;
    let g = h / p.group;
    let last = p.past + i;
    if (lane < p.head_dim) { q_row[lane] = qkv[p.qkv_off + i * p.qkv_width + h * p.head_dim + lane]; }
    workgroupBarrier();

    // Pass 1: running max and sum of exponentials over this lane's keys, then combined across lanes.
    var state = vec2<f32>(-3.0e38, 0.0);
    for (var j = lane; j <= last; j += LANES) { state = logsumexp_add(state, score(j, g)); }
    let row_lse = workgroup_logsumexp(lane, state);

    // Pass 2: out = sum_j p_j v_j, one chunk of keys at a time.
    var acc = 0.0;
    let v_col = p.cache_off + p.kv_width + g * p.head_dim + lane;
    for (var j0 = 0u; j0 <= last; j0 += LANES) {
        let j = j0 + lane;
        var pj = 0.0;
        if (j <= last) { pj = exp(score(j, g) - row_lse); }
        probs[lane] = pj;
        workgroupBarrier();
        if (lane < p.head_dim) {
            let n = min(LANES, last + 1u - j0);
            for (var jj = 0u; jj < n; jj++) {
                acc = fma(probs[jj], cache[v_col + (j0 + jj) * 2u * p.kv_width], acc);
            }
        }
        workgroupBarrier();
    }
    if (lane < p.head_dim) { out[p.out_off + i * p.heads * p.head_dim + h * p.head_dim + lane] = acc; }
}
