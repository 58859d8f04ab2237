// axpy: y = alpha * x + beta * y; scales (x = y is not allowed: use beta alone) and accumulates.

struct Params { n: u32, x_off: u32, y_off: u32, _pad: u32, alpha: f32, beta: f32, _pad1: u32, _pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    y[p.y_off + i] = p.alpha * x[p.x_off + i] + p.beta * y[p.y_off + i];
}
