// crossentropy_chunk_stats: the cross-entropy's statistics of one vocabulary chunk of logits, per row:
// (the chunk's max m, sum over the chunk of exp(x - m), the target's logit if the target's id is in the
// chunk else 0), written to stats at stats_off + row * stats_row_stride. The host combines every
// chunk's triple into the row's log-sum-exp and loss (ops::crossentropy::crossentropy_combine).
//
// One 256-lane workgroup per row. A chunk wider than one binding is dispatched in column pieces, in
// order: the first writes its triple, each later one (bit 0 of flags) folds its own into the stored one
// (the running max and rescaled sum; the target's logit is in exactly one piece, the others add 0).
// The lanes' sums combine in a tree, not in column order as the twin sums: equal within rounding.

struct Params {
    rows: u32,
    cols: u32,             // columns of this piece
    logits_off: u32,       // element of (row 0, the piece's first column) in the logits binding
    row_stride: u32,       // elements between rows of logits
    stats_off: u32,        // element of row 0's triple in the stats binding
    stats_row_stride: u32, // elements between rows' triples (3 x chunks)
    targets_off: u32,      // element of row 0's target in the targets binding
    col_start: u32,        // vocabulary id of the piece's first column
    flags: u32,            // bit 0: fold into the stored triple instead of overwriting it
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> stats: array<f32>;

// logsumexp_add and workgroup_logsumexp_state come from common/workgroup_logsumexp.wgsl.

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) { return; } // uniform across the workgroup: every lane has the same row
    let base = p.logits_off + row * p.row_stride;
    var state = vec2<f32>(-3.0e38, 0.0);
    for (var c = lane; c < p.cols; c += 256u) { state = logsumexp_add(state, logits[base + c]); }
    let total = workgroup_logsumexp_state(lane, state);
    if (lane != 0u) { return; }
    let target_id = targets[p.targets_off + row];
    var target_logit = 0.0;
    // Unsigned: an id below col_start wraps to a large number and fails the test.
    if (target_id - p.col_start < p.cols) { target_logit = logits[base + target_id - p.col_start]; }
    let at = p.stats_off + row * p.stats_row_stride;
    var m = total.x;
    var s = total.y;
    if ((p.flags & 1u) != 0u) {
        let m_stored = stats[at];
        let mm = max(m_stored, m);
        s = stats[at + 1u] * exp(m_stored - mm) + s * exp(m - mm);
        m = mm;
        target_logit += stats[at + 2u];
    }
    stats[at] = m;
    stats[at + 1u] = s;
    stats[at + 2u] = target_logit;
}
