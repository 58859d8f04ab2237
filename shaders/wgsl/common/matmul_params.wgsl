// The Params and binding 0 of every matmul kernel (matmul.wgsl, matmul_coop.wgsl, matmul_coop_direct.wgsl),
// so that one dispatch path (engine/src/device/gpu/matmul.rs) serves them all.

struct Params {
    m: u32, n: u32, k: u32, flags: u32, // flags: bit 0 accumulate into C, 1 add bias, 2 a4 usable, 3 b4 usable (matmul.wgsl)
    a_off: u32, a_row_stride: u32, a_col_stride: u32, _pad0: u32,
    b_off: u32, b_row_stride: u32, b_col_stride: u32, b_format: u32, // b_format: 0 f32, 1 f16, 2 bf16
    c_off: u32, c_row_stride: u32, bias_off: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
