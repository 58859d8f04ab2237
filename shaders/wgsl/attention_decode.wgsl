// attention_decode: n new query rows against a key/value cache (generation with a KV cache, one sequence).
//   qkv (n, (H + 2G) D) = [q (H D) | k (G D) | v (G D)] of the new tokens, at positions past .. past + n;
//   cache (capacity, 2 G D): row t = [k_t (G D) | v_t (G D)]; out (n, H D).
// `append` copies the new rows' k and v into cache rows past .. past + n (one thread per float); `main`
// then attends the new rows, as positions past .. past + n of a sequence of p.seq_len = past + n, to
// cache rows 0 ..= their own: one workgroup per block of ROWS new rows (x) and query head h (y), running
// attention_forward.wgsl's own loop (common/attention_rows.wgsl) with the keys and values read from the
// cache. So a cached step gives exactly the bits of the full forward over the whole sequence, in every
// variant. A template (shaders/src/attention_template.rs), like the forward.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// Where the keys and values are read from in `source_at` (queries are SOURCE_QKV).
const SOURCE_CACHE: u32 = 2u;

// Floats of k (and of v) in one row (G D).
fn kv_width() -> u32 { return p.v_start - p.k_start; }

// Channel d of position `row`: a new row's query from qkv, or a cached key or value.
fn source_at(b: u32, row: u32, col0: u32, d: u32, source: u32) -> f32 {
    if (row >= p.seq_len || d >= p.head_dim) { return 0.0; }
    if (source == SOURCE_CACHE) { return cache[p.cache_off + row * 2u * kv_width() + col0 + d]; }
    return qkv[p.qkv_off + (row - p.past) * p.qkv_width + col0 + d];
}
fn store(index: u32, value: f32) { out[index] = value; }

@compute @workgroup_size(256, 1, 1)
fn append(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    let width = 2u * kv_width();
    if (idx >= (p.seq_len - p.past) * width) { return; }
    let row = idx / width;
    let e = idx % width;
    cache[p.cache_off + (p.past + row) * width + e] = qkv[p.qkv_off + row * p.qkv_width + p.k_start + e];
}

@compute @workgroup_size({{LANES}}, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let q0 = p.past + wg.x * ROWS;
    let h = wg.y;
    let g = h / p.group;
    var stats = vec2<f32>(SCORE_NONE, 0.0);
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    let k_col = g * p.head_dim;
    let v_col = kv_width() + g * p.head_dim;
    attend_rows(lane, 0u, h, q0, h * p.head_dim, SOURCE_QKV, k_col, v_col, SOURCE_CACHE, &stats, &acc0, &acc1, &acc2, &acc3, &acc4, &acc5, &acc6, &acc7);

    let t = q0 + lane / LANES_PER_ROW;
    if (t < p.seq_len) {
        let base = p.out_off + (t - p.past) * p.heads * p.head_dim + h * p.head_dim;
        store_row(base, lane % LANES_PER_ROW, stats.y, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
    }
}
