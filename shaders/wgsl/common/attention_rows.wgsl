// attention_rows: the online-softmax walk of one block of query rows over the key tiles up to its
// diagonal, the one loop both attention_forward.wgsl (every row of a sequence) and attention_decode.wgsl
// (new rows against a key/value cache) run, so a cached step folds exactly the operations of the full
// forward and gives its bits. Needs attention_params.wgsl (`p`, prob_dropout), attention_tiles.wgsl and
// the kernel's `source_at`. Rows are positions in the sequence: query row t sees keys 0 ..= t, and
// positions from p.seq_len on are masked.
//
// Each tile's keys, then its values, are staged in workgroup memory and read there by all the block's
// rows. Each row keeps a running maximum m and sum l of exp(score - m): its output accumulators are
// rescaled by exp(m_old - m_new) when the maximum grows and divided by l at the end (by the caller).
// A row before a visited tile's first key (only when ROWS does not divide COLS, or for a block that
// starts mid-tile) sees it wholly masked: m, l and the accumulators come out exactly as they went in
// (rescale exp(0) = 1, sums of exact zeros), so every row's bits are those of a block that ends at the
// row's own diagonal tile, whatever block the row is in.

// Each lane's maximum of its scores in the tile, then its sum of their exponentials.
var<workgroup> part_max: array<f32, LANES>;
var<workgroup> part_sum: array<f32, LANES>;

// The block of rows q0 .. q0 + ROWS of query head h (its channels from q_col of q_source) against the
// keys and values of kv_source (their channels from k_col and v_col). Leaves the lane's row's (m, l) in
// `stats` and its unnormalised output chunks in acc0 ..= acc7 (both as initialised by the caller:
// (SCORE_NONE, 0) and zeros).
fn attend_rows(
    lane: u32, b: u32, h: u32, q0: u32, q_col: u32, q_source: u32, k_col: u32, v_col: u32, kv_source: u32,
    stats: ptr<function, vec2<f32>>,
    acc0: ptr<function, vec4<f32>>, acc1: ptr<function, vec4<f32>>, acc2: ptr<function, vec4<f32>>, acc3: ptr<function, vec4<f32>>,
    acc4: ptr<function, vec4<f32>>, acc5: ptr<function, vec4<f32>>, acc6: ptr<function, vec4<f32>>, acc7: ptr<function, vec4<f32>>,
) {
    let r = lane / LANES_PER_ROW;
    let part = lane % LANES_PER_ROW;
    let t = q0 + r;
    // Key tiles 0 ..= the one holding the block's last row's diagonal.
    let tiles = (min(q0 + ROWS, p.seq_len) - 1u) / COLS + 1u;
    let one_chunk = head_chunks() == 1u;
    var m = (*stats).x;
    var l = (*stats).y;

    for (var kt = 0u; kt < tiles; kt++) {
        let k0 = kt * COLS;
        // With a single chunk the queries stay staged from the first tile on.
        var s = tile_dots(lane, b, q0, q_col, q_source, one_chunk && kt > 0u, k0, k_col, kv_source);

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

        *acc0 *= rescale;
        *acc1 *= rescale;
        *acc2 *= rescale;
        *acc3 *= rescale;
        *acc4 *= rescale;
        *acc5 *= rescale;
        *acc6 *= rescale;
        *acc7 *= rescale;
        accumulate_tile(lane, b, k0, v_col, kv_source, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
    }
    *stats = vec2<f32>(m, l);
}

// Writes the lane's share of its row's output, acc / l, at dst[base ..] through the kernel's `store`.
fn store_row(base: u32, part: u32, l: f32, acc0: vec4<f32>, acc1: vec4<f32>, acc2: vec4<f32>, acc3: vec4<f32>,
             acc4: vec4<f32>, acc5: vec4<f32>, acc6: vec4<f32>, acc7: vec4<f32>) {
    let inv_l = 1.0 / l;
    store_chunk(base, part, 0u, acc0, inv_l);
    store_chunk(base, part, 1u, acc1, inv_l);
    store_chunk(base, part, 2u, acc2, inv_l);
    store_chunk(base, part, 3u, acc3, inv_l);
    store_chunk(base, part, 4u, acc4, inv_l);
    store_chunk(base, part, 5u, acc5, inv_l);
    store_chunk(base, part, 6u, acc6, inv_l);
    store_chunk(base, part, 7u, acc7, inv_l);
}
