// attention_tiles: the tiles the flash-style attention kernels (attention_forward.wgsl and
// attention_backward.wgsl) share; needs attention_params.wgsl for `p`. A template (holes in double
// braces, filled per variant by shaders/src/attention_template.rs). A workgroup of LANES lanes works
// on a tile of ROWS rows (queries, or keys) by COLS columns (keys, or queries): lane
// r * LANES_PER_ROW + part owns row r, the tile columns part + 8i (i < 4: one vec4 of scores) and, in
// its row's accumulators, the head channels c CHUNK + part + 8i of each chunk c (one vec4 per chunk, so
// D <= MAX_CHUNKS * CHUNK = 256). Rows of heads are staged CHUNK channels at a time in workgroup memory,
// where every lane of the workgroup reads them, instead of each row re-reading them from device memory.
// The kernel defines `source_at(b, row, col0, d, source) -> f32`: channel d of the head whose columns
// start at col0, row `row` of batch b of tensor `source` (SOURCE_QKV or SOURCE_DOUT), 0 past the
// sequence or the head (so partial tiles and chunks add exact zeros).

// Rows per workgroup: the variant's parameter. No row's arithmetic depends on it: each row's sums run
// over the same columns in the same order whichever rows share its workgroup.
const ROWS: u32 = {{ROWS}}u;
// Columns per tile: fixed for every variant, since the forward's online softmax folds in one tile of
// COLS keys at a time (the tile's sum of exponentials, then l's rescale), so it sets an order of sums.
const COLS: u32 = 32u;
const CHUNK: u32 = 32u;
// Row stride of the staged tiles: one float of padding, so the lanes reading one column of several rows
// hit different memory banks.
const STRIDE: u32 = 33u;
// Lanes per row: fixed too, since a row's lanes' partial sums (of a tile's exponentials, of delta) are
// added in lane order. A lane owns COLS / LANES_PER_ROW = 4 columns of a tile.
const LANES_PER_ROW: u32 = 8u;
const LANES: u32 = {{LANES}}u;
const MAX_CHUNKS: u32 = 8u;
// The score of a masked (query, key) pair: exp(SCORE_NONE - m) is 0 for every real maximum m.
const SCORE_NONE: f32 = -3.0e38;
const SOURCE_QKV: u32 = 0u;
const SOURCE_DOUT: u32 = 1u;

var<workgroup> stage_a: array<f32, ROWS * STRIDE>; // CHUNK channels of ROWS rows (the tile's rows)
var<workgroup> stage_b: array<f32, COLS * STRIDE>; // CHUNK channels of COLS rows (the tile's columns)
var<workgroup> tile: array<f32, ROWS * STRIDE>;    // one value per (row, column) of the tile

// Head chunks of a dimension D.
fn head_chunks() -> u32 { return (p.head_dim + CHUNK - 1u) / CHUNK; }

// Channels c CHUNK .. c CHUNK + CHUNK of rows row0 .. row0 + ROWS into stage_a, or of row0 .. row0 + COLS
// into stage_b.
fn stage_rows_a(lane: u32, b: u32, row0: u32, col0: u32, source: u32, c: u32) {
    for (var e = lane; e < ROWS * CHUNK; e += LANES) {
        stage_a[(e / CHUNK) * STRIDE + e % CHUNK] = source_at(b, row0 + e / CHUNK, col0, c * CHUNK + e % CHUNK, source);
    }
}
fn stage_rows_b(lane: u32, b: u32, row0: u32, col0: u32, source: u32, c: u32) {
    for (var e = lane; e < COLS * CHUNK; e += LANES) {
        stage_b[(e / CHUNK) * STRIDE + e % CHUNK] = source_at(b, row0 + e / CHUNK, col0, c * CHUNK + e % CHUNK, source);
    }
}

// The lane's four dot products (tile row r) . (tile column part + 8i) over all D channels, rows from
// a_row0 of one head and columns from b_row0 of another, each a fused multiply-add chain in channel
// order (as the twins' `dot`). keep_a: stage_a already holds the rows (one chunk, staged before).
fn tile_dots(lane: u32, b: u32, a_row0: u32, a_col0: u32, a_source: u32, keep_a: bool, b_row0: u32, b_col0: u32, b_source: u32) -> vec4<f32> {
    let r = lane / LANES_PER_ROW;
    let part = lane % LANES_PER_ROW;
    var s = vec4<f32>(0.0);
    for (var c = 0u; c < head_chunks(); c++) {
        if (!keep_a) { stage_rows_a(lane, b, a_row0, a_col0, a_source, c); }
        stage_rows_b(lane, b, b_row0, b_col0, b_source, c);
        workgroupBarrier();
        for (var d = 0u; d < CHUNK; d++) {
            let k = part * STRIDE + d;
            let cols = vec4<f32>(stage_b[k], stage_b[k + 8u * STRIDE], stage_b[k + 16u * STRIDE], stage_b[k + 24u * STRIDE]);
            s = fma(vec4<f32>(stage_a[r * STRIDE + d]), cols, s);
        }
        workgroupBarrier();
    }
    return s;
}

// acc += sum over the tile's columns j, in order, of tile[r][j] times channels c CHUNK + part + 8i of
// row b_row0 + j of a head (staged into stage_b). The caller has written `tile`.
fn accumulate_chunk(lane: u32, b: u32, b_row0: u32, b_col0: u32, b_source: u32, c: u32, acc: ptr<function, vec4<f32>>) {
    stage_rows_b(lane, b, b_row0, b_col0, b_source, c);
    workgroupBarrier();
    let r = lane / LANES_PER_ROW;
    let part = lane % LANES_PER_ROW;
    var a = *acc;
    for (var j = 0u; j < COLS; j++) {
        let v = j * STRIDE + part;
        a = fma(vec4<f32>(tile[r * STRIDE + j]), vec4<f32>(stage_b[v], stage_b[v + 8u], stage_b[v + 16u], stage_b[v + 24u]), a);
    }
    *acc = a;
    workgroupBarrier();
}

// accumulate_chunk for every chunk of the head, each into its own accumulator (separate variables
// rather than an array indexed by the chunk, so they can live in registers).
fn accumulate_tile(
    lane: u32, b: u32, b_row0: u32, b_col0: u32, b_source: u32,
    a0: ptr<function, vec4<f32>>, a1: ptr<function, vec4<f32>>, a2: ptr<function, vec4<f32>>, a3: ptr<function, vec4<f32>>,
    a4: ptr<function, vec4<f32>>, a5: ptr<function, vec4<f32>>, a6: ptr<function, vec4<f32>>, a7: ptr<function, vec4<f32>>,
) {
    let chunks = head_chunks();
    accumulate_chunk(lane, b, b_row0, b_col0, b_source, 0u, a0);
    if (chunks > 1u) { accumulate_chunk(lane, b, b_row0, b_col0, b_source, 1u, a1); }
    if (chunks > 2u) { accumulate_chunk(lane, b, b_row0, b_col0, b_source, 2u, a2); }
    if (chunks > 3u) { accumulate_chunk(lane, b, b_row0, b_col0, b_source, 3u, a3); }
    if (chunks > 4u) { accumulate_chunk(lane, b, b_row0, b_col0, b_source, 4u, a4); }
    if (chunks > 5u) { accumulate_chunk(lane, b, b_row0, b_col0, b_source, 5u, a5); }
    if (chunks > 6u) { accumulate_chunk(lane, b, b_row0, b_col0, b_source, 6u, a6); }
    if (chunks > 7u) { accumulate_chunk(lane, b, b_row0, b_col0, b_source, 7u, a7); }
}

// Writes channels c CHUNK + part + 8i (those below D) of acc * factor to dst[base + channel] through the
// kernel's `store(index, value)`.
fn store_chunk(base: u32, part: u32, c: u32, acc: vec4<f32>, factor: f32) {
    for (var i = 0u; i < 4u; i++) {
        let d = c * CHUNK + part + i * LANES_PER_ROW;
        if (d < p.head_dim) { store(base + d, acc[i] * factor); }
    }
}
