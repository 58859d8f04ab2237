// attention_backward_blocked: attention_backward.wgsl's two entry points, register-blocked. The same
// outputs from the same sums in the same order (so the same bits); only which invocation computes what
// changes. In attention_backward.wgsl each invocation owns one tile row and 4 of its columns, so every
// multiply-add of a tile product reads 1.25 floats from workgroup memory, which bounds the kernel by
// that memory's bandwidth. Here each invocation owns LANE_ROWS = 4 rows by the same 4 columns: per
// channel (or per column, accumulating) it reads 4 floats of each side and does 16 multiply-adds: 0.5
// reads per multiply-add. A group of 4 rows has the 8 invocations of one row there
// (part = lane % 8 owns columns part + 8i and channels c CHUNK + part + 8i, as there).
//
// The outputs' channels are taken in groups of 64 (common/attention_blocks.wgsl says why): a head of
// more channels takes another walk over the other side per group, recomputing the tiles' probabilities.
//
// A template (shaders/src/attention_template.rs): ROWS (a multiple of 4) and LANES = 2 ROWS vary. The
// per-row delta partial sums and their order are attention_backward.wgsl's: (row, part) sums channels
// part + 8i, and a row's 8 partial sums are added in part order.

// Params and prob_dropout come from common/attention_params.wgsl; ROWS, COLS, the staged tiles and
// stage_rows_a/b from common/attention_tiles.wgsl; LANE_ROWS, GROUP_CHUNKS, Block and the blocked tile
// products from common/attention_blocks.wgsl; the bindings and addressing from
// common/attention_backward_io.wgsl.

// query_grad: each (row, part)'s part of the row's delta, then each row's delta and log-sum-exp.
var<workgroup> part_sum: array<f32, ROWS * LANES_PER_ROW>;
var<workgroup> row_stat: array<f32, 2u * ROWS>;

// query_grad's ds for tile row `row` (query t), columns part + 8i of the key tile at k0, into `tile`.
fn query_ds(b: u32, h: u32, t: u32, row: u32, part: u32, k0: u32, s: vec4<f32>, dov: vec4<f32>) {
    let row_delta = row_stat[row];
    let row_lse = row_stat[ROWS + row];
    for (var i = 0u; i < 4u; i++) {
        let key = part + i * LANES_PER_ROW;
        var ds = 0.0;
        if (k0 + key <= t && t < p.seq_len) {
            ds = exp(s[i] * p.scale - row_lse) * (dov[i] * prob_dropout(b, h, t, k0 + key) - row_delta);
        }
        tile[row * STRIDE + key] = ds;
    }
}

@compute @workgroup_size({{LANES}}, 1, 1)
fn query_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let q0 = wg.x * ROWS;
    let h = wg.y;
    let b = wg.z;
    let g = h / p.group;
    let r = first_row(lane);
    let part = lane % LANES_PER_ROW;
    let q_col = h * p.head_dim;
    let k_col = p.k_start + g * p.head_dim;
    let v_col = p.v_start + g * p.head_dim;

    // delta_t: (row, part) sums channels part + 8i, then each row's parts are added in part order.
    for (var e = lane; e < ROWS * LANES_PER_ROW; e += LANES) {
        let t = q0 + e / LANES_PER_ROW;
        var lane_delta = 0.0;
        if (t < p.seq_len) {
            let o = out_index(b, t, h);
            for (var d = e % LANES_PER_ROW; d < p.head_dim; d += LANES_PER_ROW) { lane_delta = fma(dout[o + d], out[o + d], lane_delta); }
        }
        part_sum[e] = lane_delta;
    }
    workgroupBarrier();
    for (var row = lane; row < ROWS; row += LANES) {
        var row_delta = 0.0;
        for (var q = 0u; q < LANES_PER_ROW; q++) { row_delta += part_sum[row * LANES_PER_ROW + q]; }
        var row_lse = 0.0;
        let t = q0 + row;
        if (t < p.seq_len) {
            row_lse = lse[stat_index(b, h, t)];
            delta[stat_index(b, h, t)] = row_delta;
        }
        row_stat[row] = row_delta;
        row_stat[ROWS + row] = row_lse;
    }
    workgroupBarrier();

    let tiles = (min(q0 + ROWS, p.seq_len) - 1u) / COLS + 1u;
    for (var cg = 0u; cg * GROUP_CHUNKS < head_chunks(); cg++) {
        var acc0 = zero_block();
        var acc1 = zero_block();
        for (var kt = 0u; kt < tiles; kt++) {
            let k0 = kt * COLS;
            let s = block_dots(lane, b, q0, q_col, SOURCE_QKV, false, k0, k_col, SOURCE_QKV);
            let dov = block_dots(lane, b, q0, q_col, SOURCE_DOUT, false, k0, v_col, SOURCE_QKV);
            // block_dots ends with a barrier: every invocation is done reading the last tile.
            query_ds(b, h, q0 + r, r, part, k0, s.r0, dov.r0);
            query_ds(b, h, q0 + r + 1u, r + 1u, part, k0, s.r1, dov.r1);
            query_ds(b, h, q0 + r + 2u, r + 2u, part, k0, s.r2, dov.r2);
            query_ds(b, h, q0 + r + 3u, r + 3u, part, k0, s.r3, dov.r3);
            block_accumulate_group(lane, b, k0, k_col, SOURCE_QKV, cg, &acc0, &acc1);
        }
        let t = q0 + r;
        if (t < p.seq_len) { store_group(qkv_row(b, t) + q_col, part, cg, acc0.r0, acc1.r0, p.scale); }
        if (t + 1u < p.seq_len) { store_group(qkv_row(b, t + 1u) + q_col, part, cg, acc0.r1, acc1.r1, p.scale); }
        if (t + 2u < p.seq_len) { store_group(qkv_row(b, t + 2u) + q_col, part, cg, acc0.r2, acc1.r2, p.scale); }
        if (t + 3u < p.seq_len) { store_group(qkv_row(b, t + 3u) + q_col, part, cg, acc0.r3, acc1.r3, p.scale); }
    }
}

// key_value_grad's probabilities for tile row `row` (key j), columns part + 8i (queries query0 + 8i):
// the dropped-out probabilities into `tile`, and ds returned. lse4 and delta4 are the columns' queries'.
fn key_row(b: u32, h: u32, j: u32, row: u32, part: u32, query0: u32, s: vec4<f32>, dov: vec4<f32>, lse4: vec4<f32>, delta4: vec4<f32>) -> vec4<f32> {
    var ds = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        let query = query0 + i * LANES_PER_ROW;
        var dropped = 0.0;
        if (query >= j && query < p.seq_len) {
            let m = prob_dropout(b, h, query, j);
            let pu = exp(s[i] * p.scale - lse4[i]);
            ds[i] = pu * (dov[i] * m - delta4[i]);
            dropped = pu * m;
        }
        tile[row * STRIDE + part + i * LANES_PER_ROW] = dropped;
    }
    return ds;
}

// Writes ds's four rows into `tile`.
fn write_block(r: u32, part: u32, ds: Block) {
    for (var i = 0u; i < 4u; i++) {
        let col = part + i * LANES_PER_ROW;
        tile[r * STRIDE + col] = ds.r0[i];
        tile[(r + 1u) * STRIDE + col] = ds.r1[i];
        tile[(r + 2u) * STRIDE + col] = ds.r2[i];
        tile[(r + 3u) * STRIDE + col] = ds.r3[i];
    }
}

@compute @workgroup_size({{LANES}}, 1, 1)
fn key_value_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let k0 = wg.x * ROWS;
    let g = wg.y;
    let b = wg.z;
    let r = first_row(lane);
    let part = lane % LANES_PER_ROW;
    let j = k0 + r;
    let k_col = p.k_start + g * p.head_dim;
    let v_col = p.v_start + g * p.head_dim;
    let query_tiles = (p.seq_len + COLS - 1u) / COLS;

    for (var cg = 0u; cg * GROUP_CHUNKS < head_chunks(); cg++) {
        var dk0 = zero_block();
        var dk1 = zero_block();
        var dv0 = zero_block();
        var dv1 = zero_block();
        for (var h = g * p.group; h < (g + 1u) * p.group; h++) {
            let q_col = h * p.head_dim;
            // Query tiles from the one holding the block's first key on (its earlier queries are masked).
            for (var qt = k0 / COLS; qt < query_tiles; qt++) {
                let i0 = qt * COLS;
                // Transposed tiles: row r is key j, column part + 8i query i0 + part + 8i.
                let s = block_dots(lane, b, k0, k_col, SOURCE_QKV, false, i0, q_col, SOURCE_QKV);
                let dov = block_dots(lane, b, k0, v_col, SOURCE_QKV, false, i0, q_col, SOURCE_DOUT);
                var lse4 = vec4<f32>(0.0);
                var delta4 = vec4<f32>(0.0);
                for (var i = 0u; i < 4u; i++) {
                    let query = i0 + part + i * LANES_PER_ROW;
                    if (query < p.seq_len) {
                        lse4[i] = lse[stat_index(b, h, query)];
                        delta4[i] = delta[stat_index(b, h, query)];
                    }
                }
                let query0 = i0 + part;
                let ds = Block(
                    key_row(b, h, j, r, part, query0, s.r0, dov.r0, lse4, delta4),
                    key_row(b, h, j + 1u, r + 1u, part, query0, s.r1, dov.r1, lse4, delta4),
                    key_row(b, h, j + 2u, r + 2u, part, query0, s.r2, dov.r2, lse4, delta4),
                    key_row(b, h, j + 3u, r + 3u, part, query0, s.r3, dov.r3, lse4, delta4),
                );
                block_accumulate_group(lane, b, i0, q_col, SOURCE_DOUT, cg, &dv0, &dv1);
                // block_accumulate ends with a barrier: every invocation is done reading the probabilities.
                write_block(r, part, ds);
                block_accumulate_group(lane, b, i0, q_col, SOURCE_QKV, cg, &dk0, &dk1);
            }
        }
        if (j < p.seq_len) { store_key_row(qkv_row(b, j) + k_col, qkv_row(b, j) + v_col, part, cg, dk0.r0, dk1.r0, dv0.r0, dv1.r0); }
        if (j + 1u < p.seq_len) { store_key_row(qkv_row(b, j + 1u) + k_col, qkv_row(b, j + 1u) + v_col, part, cg, dk0.r1, dk1.r1, dv0.r1, dv1.r1); }
        if (j + 2u < p.seq_len) { store_key_row(qkv_row(b, j + 2u) + k_col, qkv_row(b, j + 2u) + v_col, part, cg, dk0.r2, dk1.r2, dv0.r2, dv1.r2); }
        if (j + 3u < p.seq_len) { store_key_row(qkv_row(b, j + 3u) + k_col, qkv_row(b, j + 3u) + v_col, part, cg, dk0.r3, dk1.r3, dv0.r3, dv1.r3); }
    }
}

// One key row's dk (times the scale) and dv, channel group cg: the row's k and v columns start at
// k_at and v_at.
fn store_key_row(k_at: u32, v_at: u32, part: u32, cg: u32, dk0: vec4<f32>, dk1: vec4<f32>, dv0: vec4<f32>, dv1: vec4<f32>) {
    store_group(k_at, part, cg, dk0, dk1, p.scale);
    store_group(v_at, part, cg, dv0, dv1, 1.0);
}
