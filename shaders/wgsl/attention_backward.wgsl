// attention_backward, two entry points that together write every element of dqkv once (layouts as in
// attention_forward.wgsl: qkv and dqkv (B, T, (H + 2G) D), query head h reads key/value head h / group):
//   query_grad (one workgroup per block of ROWS queries (x), query head h (y), batch b (z)):
//       delta_t = dout_t . out_t, and dq_t = scale * sum_{j<=t} p_tj (dout_t . v_j - delta_t) k_j
//   key_value_grad (one workgroup per block of ROWS keys (x), key/value head g (y), batch b (z)), summing
//       over the group's query heads h: dv_j = sum_h sum_{i>=j} p_ij dout_i,
//       dk_j = scale * sum_h sum_{i>=j} p_ij (dout_i . v_j - delta_i) q_i
// Flash-attention-2 style: the probabilities p_ij = exp(q_i . k_j * scale - lse_i) are recomputed tile by
// tile (ROWS x COLS, common/attention_tiles.wgsl) from the saved log-sum-exp, so nothing of size (T, T)
// touches device memory. query_grad walks the key tiles up to its diagonal, key_value_grad the query
// tiles from its diagonal on; tiles past the diagonal are skipped. key_value_grad needs delta from
// query_grad (the next dispatch). With dropout (mask m, forward used m p): dv_j sums m_ij p_ij dout_i and
// ds_ij = p_ij (m_ij dout_i . v_j - delta_i); delta = dout . out is unchanged, since out already holds the
// masked sum. Each gradient is one workgroup's running sum in a fixed order (a shared head's over the
// group's heads in order, then the query tiles): deterministic, without atomics or a reduction pass.
// A template (shaders/src/attention_template.rs): only ROWS and LANES vary per variant. Every gradient
// is one FMA chain over the other side in increasing order, and the tiles a variant visits beyond
// another's hold only masked pairs, which add exact zeros: all variants give the same bits.

// Params and prob_dropout come from common/attention_params.wgsl; ROWS, COLS, the staged tiles,
// tile_dots and accumulate_tile from common/attention_tiles.wgsl; the bindings and addressing
// (qkv_row, out_index, stat_index, source_at, store) from common/attention_backward_io.wgsl.

// query_grad: each lane's part of its row's delta.
var<workgroup> part_sum: array<f32, LANES>;

@compute @workgroup_size({{LANES}}, 1, 1)
fn query_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
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

    // delta_t: lane `part` sums channels part + 8i, then the row's lanes' sums are added in lane order.
    var lane_delta = 0.0;
    var row_lse = 0.0;
    if (t < p.seq_len) {
        let o = out_index(b, t, h);
        for (var d = part; d < p.head_dim; d += LANES_PER_ROW) { lane_delta = fma(dout[o + d], out[o + d], lane_delta); }
        row_lse = lse[stat_index(b, h, t)];
    }
    part_sum[lane] = lane_delta;
    workgroupBarrier();
    var row_delta = 0.0;
    for (var q = 0u; q < LANES_PER_ROW; q++) { row_delta += part_sum[r * LANES_PER_ROW + q]; }

    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    let tiles = (min(q0 + ROWS, p.seq_len) - 1u) / COLS + 1u;
    for (var kt = 0u; kt < tiles; kt++) {
        let k0 = kt * COLS;
        let s = tile_dots(lane, b, q0, q_col, SOURCE_QKV, false, k0, k_col, SOURCE_QKV);
        let dov = tile_dots(lane, b, q0, q_col, SOURCE_DOUT, false, k0, v_col, SOURCE_QKV);
        for (var i = 0u; i < 4u; i++) {
            let key = part + i * LANES_PER_ROW;
            var ds = 0.0;
            if (k0 + key <= t && t < p.seq_len) {
                ds = exp(s[i] * p.scale - row_lse) * (dov[i] * prob_dropout(b, h, t, k0 + key) - row_delta);
            }
            tile[r * STRIDE + key] = ds;
        }
        accumulate_tile(lane, b, k0, k_col, SOURCE_QKV, &acc0, &acc1, &acc2, &acc3, &acc4, &acc5, &acc6, &acc7);
    }

    if (t < p.seq_len) {
        let base = qkv_row(b, t) + q_col;
        store_chunk(base, part, 0u, acc0, p.scale);
        store_chunk(base, part, 1u, acc1, p.scale);
        store_chunk(base, part, 2u, acc2, p.scale);
        store_chunk(base, part, 3u, acc3, p.scale);
        store_chunk(base, part, 4u, acc4, p.scale);
        store_chunk(base, part, 5u, acc5, p.scale);
        store_chunk(base, part, 6u, acc6, p.scale);
        store_chunk(base, part, 7u, acc7, p.scale);
        if (part == 0u) { delta[stat_index(b, h, t)] = row_delta; }
    }
}

@compute @workgroup_size({{LANES}}, 1, 1)
fn key_value_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let k0 = wg.x * ROWS;
    let g = wg.y;
    let b = wg.z;
    let r = lane / LANES_PER_ROW;
    let part = lane % LANES_PER_ROW;
    let j = k0 + r;
    let k_col = p.k_start + g * p.head_dim;
    let v_col = p.v_start + g * p.head_dim;
    let query_tiles = (p.seq_len + COLS - 1u) / COLS;

    var dk0 = vec4<f32>(0.0);
    var dk1 = vec4<f32>(0.0);
    var dk2 = vec4<f32>(0.0);
    var dk3 = vec4<f32>(0.0);
    var dk4 = vec4<f32>(0.0);
    var dk5 = vec4<f32>(0.0);
    var dk6 = vec4<f32>(0.0);
    var dk7 = vec4<f32>(0.0);
    var dv0 = vec4<f32>(0.0);
    var dv1 = vec4<f32>(0.0);
    var dv2 = vec4<f32>(0.0);
    var dv3 = vec4<f32>(0.0);
    var dv4 = vec4<f32>(0.0);
    var dv5 = vec4<f32>(0.0);
    var dv6 = vec4<f32>(0.0);
    var dv7 = vec4<f32>(0.0);
    for (var h = g * p.group; h < (g + 1u) * p.group; h++) {
        let q_col = h * p.head_dim;
        // Query tiles from the one holding the block's first key on (its earlier queries are masked).
        for (var qt = k0 / COLS; qt < query_tiles; qt++) {
            let i0 = qt * COLS;
            // Transposed tiles: row r is key j, column part + 8i query i0 + part + 8i.
            let s = tile_dots(lane, b, k0, k_col, SOURCE_QKV, false, i0, q_col, SOURCE_QKV);
            let dov = tile_dots(lane, b, k0, v_col, SOURCE_QKV, false, i0, q_col, SOURCE_DOUT);
            var ds = vec4<f32>(0.0);
            for (var i = 0u; i < 4u; i++) {
                let query = i0 + part + i * LANES_PER_ROW;
                var dropped = 0.0;
                if (query >= j && query < p.seq_len) {
                    let m = prob_dropout(b, h, query, j);
                    let pu = exp(s[i] * p.scale - lse[stat_index(b, h, query)]);
                    ds[i] = pu * (dov[i] * m - delta[stat_index(b, h, query)]);
                    dropped = pu * m;
                }
                tile[r * STRIDE + part + i * LANES_PER_ROW] = dropped;
            }
            accumulate_tile(lane, b, i0, q_col, SOURCE_DOUT, &dv0, &dv1, &dv2, &dv3, &dv4, &dv5, &dv6, &dv7);
            // accumulate_tile ends with a barrier: every lane is done reading the probabilities.
            for (var i = 0u; i < 4u; i++) { tile[r * STRIDE + part + i * LANES_PER_ROW] = ds[i]; }
            accumulate_tile(lane, b, i0, q_col, SOURCE_QKV, &dk0, &dk1, &dk2, &dk3, &dk4, &dk5, &dk6, &dk7);
        }
    }

    if (j < p.seq_len) {
        let base = qkv_row(b, j);
        store_chunk(base + k_col, part, 0u, dk0, p.scale);
        store_chunk(base + k_col, part, 1u, dk1, p.scale);
        store_chunk(base + k_col, part, 2u, dk2, p.scale);
        store_chunk(base + k_col, part, 3u, dk3, p.scale);
        store_chunk(base + k_col, part, 4u, dk4, p.scale);
        store_chunk(base + k_col, part, 5u, dk5, p.scale);
        store_chunk(base + k_col, part, 6u, dk6, p.scale);
        store_chunk(base + k_col, part, 7u, dk7, p.scale);
        store_chunk(base + v_col, part, 0u, dv0, 1.0);
        store_chunk(base + v_col, part, 1u, dv1, 1.0);
        store_chunk(base + v_col, part, 2u, dv2, 1.0);
        store_chunk(base + v_col, part, 3u, dv3, 1.0);
        store_chunk(base + v_col, part, 4u, dv4, 1.0);
        store_chunk(base + v_col, part, 5u, dv5, 1.0);
        store_chunk(base + v_col, part, 6u, dv6, 1.0);
        store_chunk(base + v_col, part, 7u, dv7, 1.0);
    }
}
