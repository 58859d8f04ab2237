// crossentropy: per row of logits (rows, V), loss = logsumexp(logits) - logits[target].
// With bit 0 of flags set it is fused with its backward: the logits are overwritten in place by
// dlogits = (softmax - onehot(target)) * grad_scale, where grad_scale is d(loss)/d(row loss), for the
// mean over B*T tokens 1/(B*T). One workgroup per row.

struct Params { rows: u32, vocab: u32, logits_off: u32, row_off: u32, grad_scale: f32, flags: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> losses: array<f32>;

// red_max, red_sum, logsumexp_add and workgroup_logsumexp come from common/workgroup_logsumexp.wgsl.

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) { return; }
    let base = p.logits_off + row * p.vocab;
    var state = vec2<f32>(-3.0e38, 0.0);
    for (var v = lane; v < p.vocab; v += 256u) { state = logsumexp_add(state, logits[base + v]); }
    let lse = workgroup_logsumexp(lane, state);
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
