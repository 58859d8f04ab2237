// gelu_erf_backward: dx += dout * (Phi(x) + x phi(x)), the derivative of the exact GELU; phi is the
// standard normal density, Phi comes from common/erfc.wgsl.

struct Params { n: u32, x_off: u32, dout_off: u32, dx_off: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

// 1 / sqrt(2 pi)
const FRAC_1_SQRT_2PI: f32 = 0.3989422804014327;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    let v = x[p.x_off + i];
    let pdf = FRAC_1_SQRT_2PI * exp(-0.5 * v * v);
    dx[p.dx_off + i] += dout[p.dout_off + i] * (normal_cdf(v) + v * pdf);
}
