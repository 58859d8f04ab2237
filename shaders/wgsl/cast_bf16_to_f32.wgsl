// cast_bf16_to_f32: out[i] = f32(x[i]) for bfloat16 values packed two per u32 word (exact: a bf16 is
// the top half of an f32's bits).

struct Params { n: u32, x_word_off: u32, out_off: u32, _pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = gid.x + gid.y * nwg.x * 256u;
    let i = 2u * w;
    if (i >= p.n) { return; }
    let word = x[p.x_word_off + w];
    out[p.out_off + i] = bitcast<f32>(word << 16u);
    if (i + 1u < p.n) { out[p.out_off + i + 1u] = bitcast<f32>(word & 0xffff0000u); }
}
