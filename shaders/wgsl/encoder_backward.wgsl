// encoder_backward: dtable[token] += sum of dout over the positions holding that token; dwpe[t] += sum over b.
// Positions are grouped by token on the host (tokens come from the host anyway), so each output element
// has exactly one writer and the sum order is fixed: deterministic without atomics.

struct Params {
    buckets: u32, channels: u32, batch: u32, seq_len: u32,
    vocab_begin: u32, table_off: u32, bucket_off: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> dout: array<f32>;           // (B*T, C)
@group(0) @binding(2) var<storage, read> bucket_token: array<u32>;   // (buckets)
@group(0) @binding(3) var<storage, read> bucket_start: array<u32>;   // (buckets + 1) into positions
@group(0) @binding(4) var<storage, read> positions: array<u32>;      // (B*T), grouped by token
@group(0) @binding(5) var<storage, read_write> dtable: array<f32>;     // token_grad: a window of dwte (V, C); position_grad: dwpe (P, C)

@compute @workgroup_size(256, 1, 1)
fn token_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.buckets * p.channels) { return; }
    let bucket = p.bucket_off + i / p.channels;
    let ch = i % p.channels;
    var sum = 0.0;
    for (var s = bucket_start[bucket]; s < bucket_start[bucket + 1u]; s++) {
        sum += dout[positions[s] * p.channels + ch];
    }
    let row = bucket_token[bucket] - p.vocab_begin;
    dtable[p.table_off + row * p.channels + ch] += sum;
}

@compute @workgroup_size(256, 1, 1)
fn position_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.seq_len * p.channels) { return; }
    var sum = 0.0;
    for (var b = 0u; b < p.batch; b++) { sum += dout[b * p.seq_len * p.channels + i]; }
    dtable[i] += sum;
}
