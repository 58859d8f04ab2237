// cast_half_to_f32: out[i] = f32(x[i]) for 16-bit values packed two per u32 word (element 2i in the low
// half), exactly: format 0 = f16, 1 = bfloat16 (the top half of an f32's bits).

struct Params { n: u32, x_word_off: u32, out_off: u32, format: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

fn widen(word: u32) -> vec2<f32> {
    if (p.format == 0u) { return unpack2x16float(word); }
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = gid.x + gid.y * nwg.x * 256u;
    let i = 2u * w;
    if (i >= p.n) { return; }
    let pair = widen(x[p.x_word_off + w]);
    out[p.out_off + i] = pair.x;
    if (i + 1u < p.n) { out[p.out_off + i + 1u] = pair.y; }
}
