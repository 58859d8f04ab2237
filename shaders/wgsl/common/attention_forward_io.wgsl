// attention_forward_io: the bindings of both training forward kernels (attention_forward.wgsl,
// attention_forward_blocked.wgsl), prepended to each, and the `source_at` and `store` the tile helpers
// call.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;

fn source_at(b: u32, row: u32, col0: u32, d: u32, source: u32) -> f32 {
    if (row >= p.seq_len || d >= p.head_dim) { return 0.0; }
    return qkv[p.qkv_off + (b * p.seq_len + row) * p.qkv_width + col0 + d];
}
fn store(index: u32, value: f32) { out[index] = value; }
