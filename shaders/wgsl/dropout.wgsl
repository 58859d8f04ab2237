// dropout: out = x * mask, x and out (rows, cols) row-major; element i of the whole tensor is (i / cols,
// i % cols) of the mask (common/dropout_mask.wgsl). `base` is this piece's first element in the tensor.

struct Params {
    n: u32, x_off: u32, out_off: u32, base: u32,
    cols: u32, key0: u32, key1: u32, threshold: u32,
    scale: f32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    let e = p.base + i;
    out[p.out_off + i] = x[p.x_off + i] * dropout_multiplier(p.key0, p.key1, p.threshold, p.scale, e / p.cols, e % p.cols);
}
