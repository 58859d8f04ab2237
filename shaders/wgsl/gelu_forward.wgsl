// gelu_forward: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), Hugging Face's `gelu_new`.

struct Params { n: u32, x_off: u32, out_off: u32, _pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

const SQRT_2_OVER_PI: f32 = 0.7978845608028654;

// tanh through exp overflows for large |u| on some drivers; |u| >= 10 is already +-1 in f32.
fn safe_tanh(u: f32) -> f32 { return tanh(clamp(u, -10.0, 10.0)); }

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    let v = x[p.x_off + i];
    out[p.out_off + i] = 0.5 * v * (1.0 + safe_tanh(SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)));
}
