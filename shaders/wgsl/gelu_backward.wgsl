// gelu_backward: dx += dout * d gelu_new(x) / dx.

struct Params { n: u32, x_off: u32, dout_off: u32, dx_off: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

const SQRT_2_OVER_PI: f32 = 0.7978845608028654;

fn safe_tanh(u: f32) -> f32 { return tanh(clamp(u, -10.0, 10.0)); }

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    let v = x[p.x_off + i];
    let u = SQRT_2_OVER_PI * (v + 0.044715 * v * v * v);
    let th = safe_tanh(u);
    let sech2 = 1.0 - th * th;
    let grad = 0.5 * (1.0 + th) + 0.5 * v * sech2 * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * v * v);
    dx[p.dx_off + i] += dout[p.dout_off + i] * grad;
}
