// encoder_forward: out (B*T, C) = wte[tokens] + wpe[position].
// wte may be bound as a window of vocabulary rows [vocab_begin, vocab_end) when it exceeds one binding;
// tokens outside the window are written by the dispatch that binds their rows.

struct Params { rows: u32, seq_len: u32, channels: u32, vocab_begin: u32, vocab_end: u32, wte_off: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> wte: array<f32>;
@group(0) @binding(3) var<storage, read> wpe: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.rows * p.channels) { return; }
    let row = i / p.channels;
    let ch = i % p.channels;
    let token = tokens[row];
    if (token < p.vocab_begin || token >= p.vocab_end) { return; }
    let t = row % p.seq_len;
    out[i] = wte[p.wte_off + (token - p.vocab_begin) * p.channels + ch] + wpe[t * p.channels + ch];
}
