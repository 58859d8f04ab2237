// pack_f16: out (rows_pad x cols_pad f16, row-major, two halves per u32 word) = x (rows x cols, any strides,
// f32 or halves) rounded to f16, and zero outside x. The operands of the direct cooperative-matrix matmul
// (matmul_coop_direct.wgsl): padded to whole tiles, every cooperative load it makes is in bounds and
// 16-byte aligned, so its loop has no bounds checks and no staging through workgroup memory.
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
