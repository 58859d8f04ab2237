// pack_f16: out (rows_pad x cols_pad f16, row-major, two halves per u32 word) = x (rows x cols, any strides,
// f32 or halves) rounded to f16, and zero outside x. The operands of the direct cooperative-matrix matmul
// (matmul_coop_direct.wgsl): padded to whole tiles, every cooperative load it makes is in bounds and
// 16-byte aligned, so its loop has no bounds checks and no staging through workgroup memory.
//
// Two entry points, each for one kind of source: `main` for x read along its rows (neighbouring
// invocations write neighbouring words from neighbouring elements), `transposed` for x stored down its
// columns (x_row_stride < x_col_stride, a dW product's transposed operand), where `main`'s neighbours
// would read elements x_col_stride apart: `transposed` moves a tile at a time through workgroup memory,
// read down x's columns and written along out's rows. Both write every word of out; the bits are the same.
//
// The rounding is common/f16_bits.wgsl's (the staged kernels' own), so a packed operand holds exactly the
// halves the staged kernels would have put in their tiles. The twin is engine/src/ops/matmul_f16.rs's
// `pack_f16`.

struct Params {
    rows: u32, cols: u32, rows_pad: u32, cols_pad: u32, // cols_pad is even
    x_off: u32, x_row_stride: u32, x_col_stride: u32, x_format: u32, // x_format: 0 f32, 1 f16, 2 bf16 (x_off in halves)
    out_word_off: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

// x (r, col) as f16 bits, or 0 outside x.
fn element(r: u32, col: u32) -> u32 {
    if (r >= p.rows || col >= p.cols) { return 0u; }
    let i = p.x_off + r * p.x_row_stride + col * p.x_col_stride;
    if (p.x_format == 0u) { return f16_bits(bitcast<f32>(x[i])); }
    let bits = (x[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
    if (p.x_format == 1u) { return bits; }
    return f16_bits(bitcast<f32>(bits << 16u));
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = gid.x + gid.y * nwg.x * 256u;
    let words_per_row = p.cols_pad / 2u;
    if (w >= p.rows_pad * words_per_row) { return; }
    let r = w / words_per_row;
    let col = 2u * (w % words_per_row);
    out[p.out_word_off + w] = element(r, col) | (element(r, col + 1u) << 16u);
}

// transposed's tile: TILE_ROWS rows of out by TILE_COLS halves (TILE_COLS / 2 words).
const TILE_ROWS: u32 = 32u;
const TILE_COLS: u32 = 64u;
// One half per u32, [row][col], rows TILE_COLS + 1 apart: the filling lanes (neighbours a row apart)
// hit different banks; the writing lanes read two halves apart, two to a bank. 8320 bytes.
const BLOCK_STRIDE: u32 = TILE_COLS + 1u;
var<workgroup> block: array<u32, TILE_ROWS * BLOCK_STRIDE>;

// One workgroup per tile: out rows wg.y TILE_ROWS.., halves wg.x TILE_COLS...
@compute @workgroup_size(256, 1, 1)
fn transposed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let r0 = wg.y * TILE_ROWS;
    let c0 = wg.x * TILE_COLS;
    // Read: lanes next to each other take rows next to each other of one column, which lie next to
    // each other in x.
    for (var e = lane; e < TILE_ROWS * TILE_COLS; e += 256u) {
        let r = e % TILE_ROWS;
        let c = e / TILE_ROWS;
        block[r * BLOCK_STRIDE + c] = element(r0 + r, c0 + c);
    }
    workgroupBarrier();
    // Write: lanes next to each other take words next to each other of one row of out.
    let words_per_row = p.cols_pad / 2u;
    for (var e = lane; e < TILE_ROWS * TILE_COLS / 2u; e += 256u) {
        let r = e / (TILE_COLS / 2u);
        let wc = e % (TILE_COLS / 2u);
        let word = c0 / 2u + wc;
        if (r0 + r < p.rows_pad && word < words_per_row) {
            let at = r * BLOCK_STRIDE + 2u * wc;
            out[p.out_word_off + (r0 + r) * words_per_row + word] = block[at] | (block[at + 1u] << 16u);
        }
    }
}
