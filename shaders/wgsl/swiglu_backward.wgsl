// swiglu_backward: d_gate_up (rows, 2F) = [dout * up * silu'(gate) | dout * silu(gate)], overwritten (it is
// the gradient of one matmul's output), with silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
// One thread per (row, j < F) writes both halves.

struct Params { rows: u32, hidden: u32, gate_up_off: u32, dout_off: u32, d_gate_up_off: u32, _pad0: u32, _pad1: u32, _pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate_up: array<f32>;
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read_write> d_gate_up: array<f32>;

// sigmoid(g) comes from common/sigmoid.wgsl.

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.rows * p.hidden) { return; }
    let row = i / p.hidden;
    let j = row * 2u * p.hidden + i % p.hidden;
    let g = gate_up[p.gate_up_off + j];
    let u = gate_up[p.gate_up_off + j + p.hidden];
    let d = dout[p.dout_off + i];
    let sig = sigmoid(g);
    d_gate_up[p.d_gate_up_off + j] = d * u * sig * fma(g, 1.0 - sig, 1.0);
    d_gate_up[p.d_gate_up_off + j + p.hidden] = d * (g * sig);
}
