// attention_forward: causal self-attention with grouped-query heads, softmax(q k^T * scale) v per query head.
//   qkv (B, T, (H + 2G) D) = [q (H D) | k (G D) | v (G D)], head h at columns h D of its part; query head
//   h reads key/value head h / group (group = H / G), shared in place by the group. GPT-2: G = H, qkv (B, T, 3C).
//   out (B, T, H D), lse (B, H, T): log-sum-exp of each score row, kept so backward recomputes the
//   probabilities instead of storing (B, H, T, T) of them. With dropout the probabilities are masked
//   after the softmax (lse is the undropped one's).
// Flash-style: one workgroup per block of ROWS query rows (x), query head h (y) and batch b (z), walking
// the tiles of COLS keys up to its diagonal (tiles past it are never visited). Each tile's keys, then
// its values, are staged in workgroup memory (common/attention_tiles.wgsl) and read there by all the
// block's rows, so device memory is read once per block instead of once per query. Each row keeps a
// running maximum m and sum l of exp(score - m) (online softmax): its output accumulators are rescaled
// by exp(m_old - m_new) when the maximum grows and divided by l at the end, and lse = m + log(l).
// Nothing of size (T, T) touches device memory; every sum runs in a fixed order (deterministic).
// A template (shaders/src/attention_template.rs): ROWS and LANES vary per variant, COLS does not, so a
// row folds the same key tiles in the same order in every variant and all give the same bits.

// Params and prob_dropout come from common/attention_params.wgsl; ROWS, COLS, the staged tiles,
// tile_dots and accumulate_tile from common/attention_tiles.wgsl.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;

// Each lane's maximum of its scores in the tile, then its sum of their exponentials.
var<workgroup> part_max: array<f32, LANES>;
var<workgroup> part_sum: array<f32, LANES>;

fn source_at(b: u32, row: u32, col0: u32, d: u32, source: u32) -> f32 {
    if (row >= p.seq_len || d >= p.head_dim) { return 0.0; }
    return qkv[p.qkv_off + (b * p.seq_len + row) * p.qkv_width + col0 + d];
}
fn store(index: u32, value: f32) { out[index] = value; }

@compute @workgroup_size({{LANES}}, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let q0 = wg.x * ROWS;
    let h = wg.y;
    let b = wg.z;
    let g = h / p.group;
    let r = lane / LANES_PER_ROW;
    let part = lane % LANES_PER_ROW;
    let t = q0 + r;
    let q_col = h * p.head_dim;
    let k_col = p.k_start + g * p.head_dim;
    let v_col = p.v_start + g * p.head_dim;
    // Key tiles 0 ..= the one holding the block's last row's diagonal. A row before that tile's first key
    // (only when ROWS does not divide COLS) sees it wholly masked: m, l and the accumulators come out
    // exactly as they went in (rescale exp(0) = 1, sums of exact zeros), so every row's bits are those of
    // the variant whose block ends at the row's own diagonal tile.
    let tiles = (min(q0 + ROWS, p.seq_len) - 1u) / COLS + 1u;
    let one_chunk = head_chunks() == 1u;

    var m = SCORE_NONE;
    var l = 0.0;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);

    for (var kt = 0u; kt < tiles; kt++) {
        let k0 = kt * COLS;
        // With a single chunk the queries stay staged from the first tile on.
        var s = tile_dots(lane, b, q0, q_col, SOURCE_QKV, one_chunk && kt > 0u, k0, k_col, SOURCE_QKV);

        // The row's new maximum: its lanes' maxima over this tile, in lane order.
        var valid: vec4<bool>;
        var lane_max = SCORE_NONE;
        for (var i = 0u; i < 4u; i++) {
            valid[i] = k0 + part + i * LANES_PER_ROW <= t && t < p.seq_len;
            s[i] = select(SCORE_NONE, s[i] * p.scale, valid[i]);
            lane_max = max(lane_max, s[i]);
        }
        part_max[lane] = lane_max;
        workgroupBarrier();
        var m_new = m;
        for (var q = 0u; q < LANES_PER_ROW; q++) { m_new = max(m_new, part_max[r * LANES_PER_ROW + q]); }
        let rescale = exp(m - m_new);
        // Probabilities (unnormalised, relative to m_new) into the tile, dropped; their undropped sum.
        var e = vec4<f32>(0.0);
        for (var i = 0u; i < 4u; i++) {
            let key = part + i * LANES_PER_ROW;
            if (valid[i]) { e[i] = exp(s[i] - m_new); }
            tile[r * STRIDE + key] = e[i] * prob_dropout(b, h, t, k0 + key);
        }
        part_sum[lane] = (e.x + e.y) + (e.z + e.w);
        workgroupBarrier();
        var tile_sum = 0.0;
        for (var q = 0u; q < LANES_PER_ROW; q++) { tile_sum += part_sum[r * LANES_PER_ROW + q]; }
        l = l * rescale + tile_sum;
        m = m_new;

        acc0 *= rescale;
        acc1 *= rescale;
        acc2 *= rescale;
        acc3 *= rescale;
        acc4 *= rescale;
        acc5 *= rescale;
        acc6 *= rescale;
        acc7 *= rescale;
        accumulate_tile(lane, b, k0, v_col, SOURCE_QKV, &acc0, &acc1, &acc2, &acc3, &acc4, &acc5, &acc6, &acc7);
    }

    if (t < p.seq_len) {
        let base = p.out_off + (b * p.seq_len + t) * p.heads * p.head_dim + h * p.head_dim;
        let inv_l = 1.0 / l;
        store_chunk(base, part, 0u, acc0, inv_l);
        store_chunk(base, part, 1u, acc1, inv_l);
        store_chunk(base, part, 2u, acc2, inv_l);
        store_chunk(base, part, 3u, acc3, inv_l);
        store_chunk(base, part, 4u, acc4, inv_l);
        store_chunk(base, part, 5u, acc5, inv_l);
        store_chunk(base, part, 6u, acc6, inv_l);
        store_chunk(base, part, 7u, acc7, inv_l);
        if (part == 0u) { lse[p.stat_off + (b * p.heads + h) * p.seq_len + t] = m + log(l); }
    }
}
