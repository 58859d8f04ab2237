// cast_f32_to_f16: out[i] = f16(x[i]), round to nearest even; values beyond f16's range become +-inf.
// The rounding is common/f16_bits.wgsl's integer arithmetic (pack2x16float's rounding is the
// implementation's choice), the same function matmul_coop.wgsl rounds its inputs with.
// Two halves are packed per u32 word (storage of f16 arrays needs no extension this way), so a
// dispatch handles pairs; an odd tail leaves the high half zero.

struct Params { n: u32, x_off: u32, out_word_off: u32, _pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = gid.x + gid.y * nwg.x * 256u;
    let i = 2u * w;
    if (i >= p.n) { return; }
    let lo = x[p.x_off + i];
    var hi = 0.0;
    if (i + 1u < p.n) { hi = x[p.x_off + i + 1u]; }
    out[p.out_word_off + w] = f16_bits(lo) | (f16_bits(hi) << 16u);
}
