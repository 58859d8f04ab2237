// attention_backward_io: the bindings and addressing of both backward kernels (attention_backward.wgsl,
// attention_backward_blocked.wgsl), prepended to each (layouts as in attention_forward.wgsl), and the
// `source_at` and `store` the tile helpers call.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> out: array<f32>;
@group(0) @binding(3) var<storage, read> dout: array<f32>;
@group(0) @binding(4) var<storage, read> lse: array<f32>;
@group(0) @binding(5) var<storage, read_write> delta: array<f32>;
@group(0) @binding(6) var<storage, read_write> dqkv: array<f32>;

fn out_index(b: u32, t: u32, h: u32) -> u32 { return p.out_off + ((b * p.seq_len + t) * p.heads + h) * p.head_dim; }
fn qkv_row(b: u32, t: u32) -> u32 { return p.qkv_off + (b * p.seq_len + t) * p.qkv_width; }
fn stat_index(b: u32, h: u32, t: u32) -> u32 { return p.stat_off + (b * p.heads + h) * p.seq_len + t; }

// col0: the head's first column in a qkv row, or h D for dout.
fn source_at(b: u32, row: u32, col0: u32, d: u32, source: u32) -> f32 {
    if (row >= p.seq_len || d >= p.head_dim) { return 0.0; }
    if (source == SOURCE_DOUT) { return dout[p.out_off + (b * p.seq_len + row) * p.heads * p.head_dim + col0 + d]; }
    return qkv[qkv_row(b, row) + col0 + d];
}
fn store(index: u32, value: f32) { dqkv[index] = value; }
