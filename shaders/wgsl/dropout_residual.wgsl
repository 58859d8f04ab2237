// dropout_residual: out = residual + x * mask, the residual connection after a dropout (layouts and mask
// as in dropout.wgsl). One pass instead of a dropout and then a residual_forward.

struct Params {
    n: u32, x_off: u32, out_off: u32, base: u32,
    cols: u32, key0: u32, key1: u32, threshold: u32,
    scale: f32, residual_off: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> residual: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    let e = p.base + i;
    let keep = dropout_multiplier(p.key0, p.key1, p.threshold, p.scale, e / p.cols, e % p.cols);
    out[p.out_off + i] = residual[p.residual_off + i] + x[p.x_off + i] * keep;
}
