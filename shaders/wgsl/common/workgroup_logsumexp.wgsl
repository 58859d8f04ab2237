// Shared by the kernels that take a log-sum-exp over a row with one 256-lane workgroup (prepended to
// their source): each lane folds its values into a running (max, sum of exp(x - max)), then the lanes
// are combined in a fixed tree order (deterministic).

var<workgroup> red_max: array<f32, 256>;
var<workgroup> red_sum: array<f32, 256>;

// Folds x into a lane's running state (max, sum of exp(value - max)).
fn logsumexp_add(state: vec2<f32>, x: f32) -> vec2<f32> {
    if (x > state.x) { return vec2<f32>(x, state.y * exp(state.x - x) + 1.0); }
    return vec2<f32>(state.x, state.y + exp(x - state.x));
}

// log(sum of exp over every lane's values), from each lane's running state.
fn workgroup_logsumexp(lane: u32, state: vec2<f32>) -> f32 {
    let total = workgroup_logsumexp_state(lane, state);
    return total.x + log(total.y);
}

// The workgroup's combined running state (max, sum of exp(x - max)) over every lane's values, for the
// kernels that keep the two apart (a vocabulary chunk's statistics).
fn workgroup_logsumexp_state(lane: u32, state: vec2<f32>) -> vec2<f32> {
    red_max[lane] = state.x;
    red_sum[lane] = state.y;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lane < stride) {
            let m1 = red_max[lane];
            let m2 = red_max[lane + stride];
            let mm = max(m1, m2);
            red_sum[lane] = red_sum[lane] * exp(m1 - mm) + red_sum[lane + stride] * exp(m2 - mm);
            red_max[lane] = mm;
        }
        workgroupBarrier();
    }
    let total = vec2<f32>(red_max[0], red_sum[0]);
    workgroupBarrier();
    return total;
}

