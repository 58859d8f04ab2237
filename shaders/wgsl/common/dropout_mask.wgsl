// dropout_mask: the counter-based dropout draw of element (row, col) under a 64-bit key (key0, key1), the
// same integer ops as DropoutMask::bits in engine/src/ops/dropout.rs, so every device draws one mask.

// lowbias32: a bijection of u32 with good avalanche.
fn mix32(v: u32) -> u32 {
    var x = v;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    return x ^ (x >> 16u);
}

// 0 where the element is dropped (its draw is below threshold), else scale.
fn dropout_multiplier(key0: u32, key1: u32, threshold: u32, scale: f32, row: u32, col: u32) -> f32 {
    let bits = mix32(mix32(mix32(col ^ key1) ^ row) + key0);
    return select(scale, 0.0, bits < threshold);
}
