// gelu_erf_forward: out = x Phi(x), the exact GELU (transformers' `gelu`); Phi from common/erfc.wgsl.

struct Params { n: u32, x_off: u32, out_off: u32, _pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    let v = x[p.x_off + i];
    out[p.out_off + i] = v * normal_cdf(v);
}
