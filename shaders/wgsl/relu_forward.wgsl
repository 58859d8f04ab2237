// relu_forward: out = max(x, 0), transformers' `relu`.

struct Params { n: u32, x_off: u32, out_off: u32, _pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    let v = x[p.x_off + i];
    out[p.out_off + i] = select(0.0, v, v > 0.0);
}
