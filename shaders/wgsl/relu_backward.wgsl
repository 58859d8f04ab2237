// relu_backward: dx += dout where x > 0 (0 at x = 0, as PyTorch's threshold_backward).

struct Params { n: u32, x_off: u32, dout_off: u32, dx_off: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    if (x[p.x_off + i] > 0.0) { dx[p.dx_off + i] += dout[p.dout_off + i]; }
}
