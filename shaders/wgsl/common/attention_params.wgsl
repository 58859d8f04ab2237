// attention_params: the Params the attention kernels (attention_forward.wgsl, attention_backward.wgsl,
// attention_decode.wgsl) bind at @binding(0) as `p`, and the dropout multiplier of one probability (needs dropout_mask.wgsl).

struct Params {
    seq_len: u32, heads: u32, group: u32, head_dim: u32,
    scale: f32, qkv_off: u32, out_off: u32, stat_off: u32,
    // Floats per qkv row, and where its k and v parts start.
    qkv_width: u32, k_start: u32, v_start: u32,
    // The batch this call's b = 0 is in the whole tensor (the gpu device splits attention by batch).
    batch_base: u32,
    // Dropout on the probabilities (common/dropout_mask.wgsl); threshold 0 means none.
    drop_key0: u32, drop_key1: u32, drop_threshold: u32, drop_scale: f32,
    // Decode only (0 in training): the rows already in the key/value cache (the new rows' first
    // position) and where the cache's window starts.
    past: u32, cache_off: u32, _pad0: u32, _pad1: u32,
}

// What probability (query t, key j) of head h in batch b is multiplied by after the softmax: the
// dropout mask's 0 or 1/(1 - p), or exactly 1 without dropout. Mask row (b H + h) T + t, column j.
fn prob_dropout(b: u32, h: u32, t: u32, j: u32) -> f32 {
    if (p.drop_threshold == 0u) { return 1.0; }
    let row = ((p.batch_base + b) * p.heads + h) * p.seq_len + t;
    return dropout_multiplier(p.drop_key0, p.drop_key1, p.drop_threshold, p.drop_scale, row, j);
}
