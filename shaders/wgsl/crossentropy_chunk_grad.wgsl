// crossentropy_chunk_grad: one vocabulary chunk of logits overwritten in place by d(loss)/d(logits) =
// (exp(x - lse[row]) - onehot(target)) * grad_scale, lse being the whole row's log-sum-exp (combined on
// the host from every chunk's crossentropy_chunk_stats). One 256-lane workgroup per row; a chunk wider
// than one binding is dispatched in column pieces (each element is independent of the others).

struct Params {
    rows: u32,
    cols: u32,         // columns of this piece
    logits_off: u32,   // element of (row 0, the piece's first column) in the logits binding
    row_stride: u32,   // elements between rows of logits
    lse_off: u32,      // element of row 0's log-sum-exp in the lse binding
    targets_off: u32,  // element of row 0's target in the targets binding
    col_start: u32,    // vocabulary id of the piece's first column
    grad_scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read> lse: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) { return; }
    let base = p.logits_off + row * p.row_stride;
    let row_lse = lse[p.lse_off + row];
    // The target's column in this piece; ids outside it wrap (unsigned) past every column.
    let target_col = targets[p.targets_off + row] - p.col_start;
    for (var c = lane; c < p.cols; c += 256u) {
        var g = exp(logits[base + c] - row_lse);
        if (c == target_col) { g -= 1.0; }
        logits[base + c] = g * p.grad_scale;
    }
}
