// swiglu_forward: out (rows, F) = silu(gate) * up, silu(g) = g * sigmoid(g), from gate_up (rows, 2F) laid
// out [gate | up] per row. One thread per output element.

struct Params { rows: u32, hidden: u32, gate_up_off: u32, out_off: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate_up: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// sigmoid(g) comes from common/sigmoid.wgsl.

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.rows * p.hidden) { return; }
    let row = i / p.hidden;
    let gi = p.gate_up_off + row * 2u * p.hidden + i % p.hidden;
    let g = gate_up[gi];
    out[p.out_off + i] = g * sigmoid(g) * gate_up[gi + p.hidden];
}
