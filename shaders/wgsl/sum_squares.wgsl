// sum_squares: partial[g] = sum of x[i]^2 over the 4096 elements of group g (the global gradient norm's
// first stage; the host adds the partials in f64, in order).

struct Params { n: u32, x_off: u32, partial_off: u32, _pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> partial: array<f32>;

const GROUP_ELEMS: u32 = 4096u;
var<workgroup> scratch: array<f32, 256>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let g = wg.x + wg.y * nwg.x;
    let start = g * GROUP_ELEMS;
    var s = 0.0;
    for (var k = lane; k < GROUP_ELEMS; k += 256u) {
        let i = start + k;
        if (i < p.n) { let v = x[p.x_off + i]; s = fma(v, v, s); }
    }
    scratch[lane] = s;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lane < stride) { scratch[lane] += scratch[lane + stride]; }
        workgroupBarrier();
    }
    if (lane == 0u) { partial[p.partial_off + g] = scratch[0]; }
}
