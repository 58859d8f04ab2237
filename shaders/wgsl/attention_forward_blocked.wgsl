// attention_forward_blocked: attention_forward.wgsl register-blocked (common/attention_blocks.wgsl):
// each invocation computes 4 query rows by 4 key columns of a tile instead of one row. Every row runs
// the same online softmax as common/attention_rows.wgsl, operation for operation: the same scores, its
// 8 parts' maxima and sums of exponentials (part = lane % 8 owns columns part + 8i) combined in part
// order, the same rescales and accumulations, so the same bits as attention_forward.wgsl (and so as
// the decode kernel, which keeps attention_rows.wgsl's loop).
//
// The outputs' channels are taken in groups of 64: a head of more channels walks the key tiles once per
// group, recomputing the same maxima and sums; the log-sum-exp is written by the first walk.
//
// A template (shaders/src/attention_template.rs): ROWS (a multiple of 4) and LANES = 2 ROWS vary.

// Params and prob_dropout come from common/attention_params.wgsl; ROWS, COLS and the staged tiles from
// common/attention_tiles.wgsl; Block and the blocked tile products from common/attention_blocks.wgsl;
// the bindings, source_at and store from common/attention_forward_io.wgsl.

// Each (row, part)'s maximum of its scores in the tile, then its sum of their exponentials.
var<workgroup> part_max: array<f32, ROWS * LANES_PER_ROW>;
var<workgroup> part_sum: array<f32, ROWS * LANES_PER_ROW>;

// Row `row` (query t)'s scores s of the key tile at k0, scaled, SCORE_NONE where masked; its part's
// maximum into part_max.
fn masked_scores(t: u32, row: u32, part: u32, k0: u32, s: vec4<f32>) -> vec4<f32> {
    var scaled = s;
    var lane_max = SCORE_NONE;
    for (var i = 0u; i < 4u; i++) {
        let valid = k0 + part + i * LANES_PER_ROW <= t && t < p.seq_len;
        scaled[i] = select(SCORE_NONE, s[i] * p.scale, valid);
        lane_max = max(lane_max, scaled[i]);
    }
    part_max[row * LANES_PER_ROW + part] = lane_max;
    return scaled;
}

// Row `row`'s maximum after the tile: m and its parts' maxima, in part order.
fn row_max(row: u32, m: f32) -> f32 {
    var m_new = m;
    for (var q = 0u; q < LANES_PER_ROW; q++) { m_new = max(m_new, part_max[row * LANES_PER_ROW + q]); }
    return m_new;
}

// Row `row` (query t, head h)'s probabilities relative to m_new into the tile, dropped; its part's
// undropped sum into part_sum. s as masked_scores left it.
fn probabilities(b: u32, h: u32, t: u32, row: u32, part: u32, k0: u32, s: vec4<f32>, m_new: f32) {
    var e = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        let key = part + i * LANES_PER_ROW;
        if (k0 + key <= t && t < p.seq_len) { e[i] = exp(s[i] - m_new); }
        tile[row * STRIDE + key] = e[i] * prob_dropout(b, h, t, k0 + key);
    }
    part_sum[row * LANES_PER_ROW + part] = (e.x + e.y) + (e.z + e.w);
}

// Row `row`'s sum of the tile's exponentials: its parts' sums, in part order.
fn row_sum(row: u32) -> f32 {
    var tile_sum = 0.0;
    for (var q = 0u; q < LANES_PER_ROW; q++) { tile_sum += part_sum[row * LANES_PER_ROW + q]; }
    return tile_sum;
}

@compute @workgroup_size({{LANES}}, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let q0 = wg.x * ROWS;
    let h = wg.y;
    let b = wg.z;
    let g = h / p.group;
    let r = first_row(lane);
    let part = lane % LANES_PER_ROW;
    let t = q0 + r;
    let q_col = h * p.head_dim;
    let k_col = p.k_start + g * p.head_dim;
    let v_col = p.v_start + g * p.head_dim;
    // Key tiles 0 ..= the one holding the block's last row's diagonal.
    let tiles = (min(q0 + ROWS, p.seq_len) - 1u) / COLS + 1u;
    let one_chunk = head_chunks() == 1u;

    for (var cg = 0u; cg * GROUP_CHUNKS < head_chunks(); cg++) {
        // Each row's running maximum and sum, as attend_rows' m and l.
        var m = vec4<f32>(SCORE_NONE);
        var l = vec4<f32>(0.0);
        var acc0 = zero_block();
        var acc1 = zero_block();
        for (var kt = 0u; kt < tiles; kt++) {
            let k0 = kt * COLS;
            // With a single chunk the queries stay staged from the first tile on.
            let raw = block_dots(lane, b, q0, q_col, SOURCE_QKV, one_chunk && kt > 0u, k0, k_col, SOURCE_QKV);
            let s = Block(
                masked_scores(t, r, part, k0, raw.r0),
                masked_scores(t + 1u, r + 1u, part, k0, raw.r1),
                masked_scores(t + 2u, r + 2u, part, k0, raw.r2),
                masked_scores(t + 3u, r + 3u, part, k0, raw.r3),
            );
            workgroupBarrier();
            let m_new = vec4<f32>(row_max(r, m.x), row_max(r + 1u, m.y), row_max(r + 2u, m.z), row_max(r + 3u, m.w));
            let rescale = vec4<f32>(exp(m.x - m_new.x), exp(m.y - m_new.y), exp(m.z - m_new.z), exp(m.w - m_new.w));
            probabilities(b, h, t, r, part, k0, s.r0, m_new.x);
            probabilities(b, h, t + 1u, r + 1u, part, k0, s.r1, m_new.y);
            probabilities(b, h, t + 2u, r + 2u, part, k0, s.r2, m_new.z);
            probabilities(b, h, t + 3u, r + 3u, part, k0, s.r3, m_new.w);
            workgroupBarrier();
            let tile_sum = vec4<f32>(row_sum(r), row_sum(r + 1u), row_sum(r + 2u), row_sum(r + 3u));
            l = vec4<f32>(l.x * rescale.x + tile_sum.x, l.y * rescale.y + tile_sum.y, l.z * rescale.z + tile_sum.z, l.w * rescale.w + tile_sum.w);
            m = m_new;
            acc0 = Block(acc0.r0 * rescale.x, acc0.r1 * rescale.y, acc0.r2 * rescale.z, acc0.r3 * rescale.w);
            acc1 = Block(acc1.r0 * rescale.x, acc1.r1 * rescale.y, acc1.r2 * rescale.z, acc1.r3 * rescale.w);
            // block_accumulate stages the values, then waits: the sums were read before anyone writes
            // the next tile's parts.
            block_accumulate_group(lane, b, k0, v_col, SOURCE_QKV, cg, &acc0, &acc1);
        }
        store_out(b, h, t, part, cg, acc0.r0, acc1.r0, m.x, l.x);
        store_out(b, h, t + 1u, part, cg, acc0.r1, acc1.r1, m.y, l.y);
        store_out(b, h, t + 2u, part, cg, acc0.r2, acc1.r2, m.z, l.z);
        store_out(b, h, t + 3u, part, cg, acc0.r3, acc1.r3, m.w, l.w);
    }
}

// Row t's output channels of group cg, acc / l as attention_rows.wgsl's store_row writes them, and (from
// the first group's part 0) its log-sum-exp.
fn store_out(b: u32, h: u32, t: u32, part: u32, cg: u32, acc0: vec4<f32>, acc1: vec4<f32>, m: f32, l: f32) {
    if (t >= p.seq_len) { return; }
    let base = p.out_off + (b * p.seq_len + t) * p.heads * p.head_dim + h * p.head_dim;
    store_group(base, part, cg, acc0, acc1, 1.0 / l);
    if (cg == 0u && part == 0u) { lse[p.stat_off + (b * p.heads + h) * p.seq_len + t] = m + log(l); }
}
