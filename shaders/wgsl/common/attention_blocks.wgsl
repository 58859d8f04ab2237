// attention_blocks: the register-blocked tile products of attention_forward_blocked.wgsl and
// attention_backward_blocked.wgsl; needs attention_tiles.wgsl (the staged tiles, COLS, CHUNK, STRIDE,
// LANES_PER_ROW) and the kernel's `source_at` and `store`. Each invocation owns LANE_ROWS = 4 tile rows
// by the 4 columns part + 8i (part = lane % 8), and in its rows' accumulators the channels
// c CHUNK + part + 8i, as one row's 8 invocations do in attention_tiles.wgsl: every element is the
// same FMA chain as there, in the same order, so the blocked kernels give the unblocked ones' bits.
// Per channel (or per column, accumulating) an invocation reads 4 floats of each side from workgroup
// memory for 16 multiply-adds, against 5 for 4 there: 0.5 reads per multiply-add instead of 1.25.
//
// The price is registers: 4 rows of accumulators per channel. So the outputs' channels are taken in
// groups of GROUP_CHUNKS chunks (64 channels, a whole head for GPT-2 and Llama-3.2-1B), each group a
// walk of its own over the other side.

// Tile rows per invocation.
const LANE_ROWS: u32 = 4u;
// Chunks of output channels accumulated per walk over the other side.
const GROUP_CHUNKS: u32 = 2u;

// One invocation's four tile rows, 4 columns (or channels) each.
struct Block { r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32> }

fn zero_block() -> Block { return Block(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0)); }

// The invocation's first tile row.
fn first_row(lane: u32) -> u32 { return (lane / LANES_PER_ROW) * LANE_ROWS; }

// tile_dots for the invocation's 4 rows: (tile row) . (tile column part + 8i) over all D channels, rows
// from a_row0 of one head, columns from b_row0 of another, each an FMA chain in channel order.
// keep_a: stage_a already holds the rows (one chunk, staged before).
fn block_dots(lane: u32, b: u32, a_row0: u32, a_col0: u32, a_source: u32, keep_a: bool, b_row0: u32, b_col0: u32, b_source: u32) -> Block {
    let r = first_row(lane);
    let part = lane % LANES_PER_ROW;
    var s = zero_block();
    for (var c = 0u; c < head_chunks(); c++) {
        if (!keep_a) { stage_rows_a(lane, b, a_row0, a_col0, a_source, c); }
        stage_rows_b(lane, b, b_row0, b_col0, b_source, c);
        workgroupBarrier();
        for (var d = 0u; d < CHUNK; d++) {
            let k = part * STRIDE + d;
            let cols = vec4<f32>(stage_b[k], stage_b[k + 8u * STRIDE], stage_b[k + 16u * STRIDE], stage_b[k + 24u * STRIDE]);
            let a = r * STRIDE + d;
            s.r0 = fma(vec4<f32>(stage_a[a]), cols, s.r0);
            s.r1 = fma(vec4<f32>(stage_a[a + STRIDE]), cols, s.r1);
            s.r2 = fma(vec4<f32>(stage_a[a + 2u * STRIDE]), cols, s.r2);
            s.r3 = fma(vec4<f32>(stage_a[a + 3u * STRIDE]), cols, s.r3);
        }
        workgroupBarrier();
    }
    return s;
}

// accumulate_chunk for the invocation's 4 rows: acc += sum over the tile's columns j, in order, of
// tile[row][j] times channels c CHUNK + part + 8i of row b_row0 + j of a head (staged into stage_b).
fn block_accumulate(lane: u32, b: u32, b_row0: u32, b_col0: u32, b_source: u32, c: u32, acc: ptr<function, Block>) {
    stage_rows_b(lane, b, b_row0, b_col0, b_source, c);
    workgroupBarrier();
    let r = first_row(lane);
    let part = lane % LANES_PER_ROW;
    var a = *acc;
    for (var j = 0u; j < COLS; j++) {
        let v = j * STRIDE + part;
        let x = vec4<f32>(stage_b[v], stage_b[v + 8u], stage_b[v + 16u], stage_b[v + 24u]);
        let t = r * STRIDE + j;
        a.r0 = fma(vec4<f32>(tile[t]), x, a.r0);
        a.r1 = fma(vec4<f32>(tile[t + STRIDE]), x, a.r1);
        a.r2 = fma(vec4<f32>(tile[t + 2u * STRIDE]), x, a.r2);
        a.r3 = fma(vec4<f32>(tile[t + 3u * STRIDE]), x, a.r3);
    }
    *acc = a;
    workgroupBarrier();
}

// block_accumulate for channel group cg's chunks (the second only where the head has it).
fn block_accumulate_group(
    lane: u32, b: u32, b_row0: u32, b_col0: u32, b_source: u32, cg: u32, a0: ptr<function, Block>, a1: ptr<function, Block>,
) {
    block_accumulate(lane, b, b_row0, b_col0, b_source, GROUP_CHUNKS * cg, a0);
    if (GROUP_CHUNKS * cg + 1u < head_chunks()) { block_accumulate(lane, b, b_row0, b_col0, b_source, GROUP_CHUNKS * cg + 1u, a1); }
}

// Writes channel group cg of one output row (from index base): acc0 and acc1 times factor.
fn store_group(base: u32, part: u32, cg: u32, acc0: vec4<f32>, acc1: vec4<f32>, factor: f32) {
    store_chunk(base, part, GROUP_CHUNKS * cg, acc0, factor);
    store_chunk(base, part, GROUP_CHUNKS * cg + 1u, acc1, factor);
}

