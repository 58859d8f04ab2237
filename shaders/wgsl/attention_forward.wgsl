// attention_forward: causal self-attention with grouped-query heads, softmax(q k^T * scale) v per query head.
//   qkv (B, T, (H + 2G) D) = [q (H D) | k (G D) | v (G D)], head h at columns h D of its part; query head
//   h reads key/value head h / group (group = H / G), shared in place by the group. GPT-2: G = H, qkv (B, T, 3C).
//   out (B, T, H D), lse (B, H, T): log-sum-exp of each score row, kept so backward recomputes the
//   probabilities instead of storing (B, H, T, T) of them. With dropout the probabilities are masked
//   after the softmax (lse is the undropped one's).
// Flash-style: one workgroup per block of ROWS query rows (x), query head h (y) and batch b (z), walking
// the tiles of COLS keys up to its diagonal (tiles past it are never visited) with the online softmax of
// common/attention_rows.wgsl, which attention_decode.wgsl runs too. Nothing of size (T, T) touches
// device memory; every sum runs in a fixed order (deterministic); lse = m + log(l).
// A template (shaders/src/attention_template.rs): ROWS and LANES vary per variant, COLS does not, so a
// row folds the same key tiles in the same order in every variant and all give the same bits.

// Params and prob_dropout come from common/attention_params.wgsl; ROWS, COLS and the staged tiles from
// common/attention_tiles.wgsl; attend_rows and store_row from common/attention_rows.wgsl; the bindings,
// source_at and store from common/attention_forward_io.wgsl.

@compute @workgroup_size({{LANES}}, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let q0 = wg.x * ROWS;
    let h = wg.y;
    let b = wg.z;
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
    let k_col = p.k_start + g * p.head_dim;
    let v_col = p.v_start + g * p.head_dim;
    attend_rows(lane, b, h, q0, h * p.head_dim, SOURCE_QKV, k_col, v_col, SOURCE_QKV, &stats, &acc0, &acc1, &acc2, &acc3, &acc4, &acc5, &acc6, &acc7);

    let t = q0 + lane / LANES_PER_ROW;
    if (t < p.seq_len) {
        let base = p.out_off + (b * p.seq_len + t) * p.heads * p.head_dim + h * p.head_dim;
        store_row(base, lane % LANES_PER_ROW, stats.y, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
        if (lane % LANES_PER_ROW == 0u) { lse[p.stat_off + (b * p.heads + h) * p.seq_len + t] = stats.x + log(stats.y); }
    }
}
