// matmul: C (M, N) = A (M, K) @ B (K, N) [+ bias (N)] [+ C], every operand addressed by strides.
//
// One kernel serves the forward pass and both backward products: a transposed operand is the same buffer
// read with its strides swapped. Tiled and register-blocked: a 16x16 workgroup computes a 64x64 tile of C,
// each invocation a 4x4 block of it, streaming K through workgroup memory 16 at a time.
// B may be stored in 16 bits (b_format 1 = f16, 2 = bf16, packed two per word, element 2i in the low
// half): the weights of a 16-bit working copy are read, and widened exactly, where they lie.

struct Params {
    m: u32, n: u32, k: u32, flags: u32, // flags: bit 0 = accumulate into C, bit 1 = add bias
    a_off: u32, a_row_stride: u32, a_col_stride: u32, _pad0: u32,
    b_off: u32, b_row_stride: u32, b_col_stride: u32, b_format: u32, // b_format: 0 f32, 1 f16, 2 bf16
    c_off: u32, c_row_stride: u32, bias_off: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> c: array<f32>;

const TILE_M: u32 = 64u;
const TILE_N: u32 = 64u;
const TILE_K: u32 = 16u;
const THREADS: u32 = 256u;

var<workgroup> a_tile: array<f32, 1024>; // [TILE_K][TILE_M]
var<workgroup> b_tile: array<f32, 1024>; // [TILE_K][TILE_N]

// Element i of B, widened to f32.
fn load_b(i: u32) -> f32 {
    if (p.b_format == 0u) { return bitcast<f32>(b[i]); }
    let bits = (b[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
    if (p.b_format == 1u) { return unpack2x16float(bits).x; }
    return bitcast<f32>(bits << 16u);
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row0 = wg.y * TILE_M;
    let col0 = wg.x * TILE_N;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) { acc[i] = 0.0; }

    for (var k0 = 0u; k0 < p.k; k0 += TILE_K) {
        // Load the A tile; walk the unit-stride dimension with consecutive invocations so reads coalesce.
        for (var s = 0u; s < 4u; s++) {
            let e = li + s * THREADS;
            var r: u32; var kk: u32;
            if (p.a_col_stride == 1u) { r = e / TILE_K; kk = e % TILE_K; } else { kk = e / TILE_M; r = e % TILE_M; }
            let gr = row0 + r;
            let gk = k0 + kk;
            var v = 0.0;
            if (gr < p.m && gk < p.k) { v = a[p.a_off + gr * p.a_row_stride + gk * p.a_col_stride]; }
            a_tile[kk * TILE_M + r] = v;
        }
        for (var s = 0u; s < 4u; s++) {
            let e = li + s * THREADS;
            var kk: u32; var cc: u32;
            if (p.b_col_stride == 1u) { kk = e / TILE_N; cc = e % TILE_N; } else { cc = e / TILE_K; kk = e % TILE_K; }
            let gk = k0 + kk;
            let gc = col0 + cc;
            var v = 0.0;
            if (gk < p.k && gc < p.n) { v = load_b(p.b_off + gk * p.b_row_stride + gc * p.b_col_stride); }
            b_tile[kk * TILE_N + cc] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TILE_K; kk++) {
            var av: array<f32, 4>;
            var bv: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) { av[i] = a_tile[kk * TILE_M + lid.y + 16u * i]; }
            for (var j = 0u; j < 4u; j++) { bv[j] = b_tile[kk * TILE_N + lid.x + 16u * j]; }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) { acc[i * 4u + j] = fma(av[i], bv[j], acc[i * 4u + j]); }
            }
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < 4u; i++) {
        let r = row0 + lid.y + 16u * i;
        if (r >= p.m) { continue; }
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + lid.x + 16u * j;
            if (col >= p.n) { continue; }
            var v = acc[i * 4u + j];
            if ((p.flags & 2u) != 0u) { v += bias[p.bias_off + col]; }
            let idx = p.c_off + r * p.c_row_stride + col;
            if ((p.flags & 1u) != 0u) { v += c[idx]; }
            c[idx] = v;
        }
    }
}
