// Shared by the kernels that reduce a row with one 256-lane workgroup (prepended to their source).

var<workgroup> scratch: array<f32, 256>;

// The sum of `value` over the workgroup's 256 lanes, in a fixed tree order (deterministic).
fn workgroup_sum(lane: u32, value: f32) -> f32 {
    scratch[lane] = value;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lane < stride) { scratch[lane] += scratch[lane + stride]; }
        workgroupBarrier();
    }
    let total = scratch[0];
    workgroupBarrier();
    return total;
}

