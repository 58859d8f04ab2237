// crossentropy: per row of logits (rows, V), loss = logsumexp(logits) - logits[target].
// With bit 0 of flags set it is fused with its backward: the logits are overwritten in place by
// dlogits = (softmax - onehot(target)) * grad_scale, where grad_scale is d(loss)/d(row loss), for the
// mean over B*T tokens 1/(B*T). One workgroup per row.

struct Params { rows: u32, vocab: u32, logits_off: u32, row_off: u32, grad_scale: f32, flags: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> losses: array<f32>;

var<workgroup> red_max: array<f32, 256>;
var<workgroup> red_sum: array<f32, 256>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) { return; }
    let base = p.logits_off + row * p.vocab;
    var m = -3.0e38;
    var s = 0.0;
    for (var v = lane; v < p.vocab; v += 256u) {
        let x = logits[base + v];
        if (x > m) { s = s * exp(m - x) + 1.0; m = x; } else { s += exp(x - m); }
    }
    red_max[lane] = m;
    red_sum[lane] = s;
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
    let lse = red_max[0] + log(red_sum[0]);
    let target_id = targets[p.row_off + row];
    workgroupBarrier(); // every lane has read its logits before any is overwritten
    if (lane == 0u) { losses[p.row_off + row] = lse - logits[base + target_id]; }
    workgroupBarrier();
    if ((p.flags & 1u) != 0u) {
        for (var v = lane; v < p.vocab; v += 256u) {
            var g = exp(logits[base + v] - lse);
            if (v == target_id) { g -= 1.0; }
            logits[base + v] = g * p.grad_scale;
        }
    }
}
