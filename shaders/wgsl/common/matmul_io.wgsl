// Bindings 1-4 of both staged matmul kernels (matmul.wgsl, matmul_coop.wgsl), after
// common/matmul_params.wgsl: A as f32, B as f32 words or halves packed two per word (Params.b_format).

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> c: array<f32>;
