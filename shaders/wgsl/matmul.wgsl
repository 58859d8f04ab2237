// matmul: C (M, N) = A (M, K) @ B (K, N) [+ bias (N)] [+ C], every operand addressed by strides.
//
// One kernel serves the forward pass and both backward products: a transposed operand is the same buffer
// read with its strides swapped. B may be stored in 16 bits (b_format 1 = f16, 2 = bf16, packed two per
// word, element 2i in the low half): the weights of a 16-bit working copy are read, and widened exactly,
// where they lie. The math is fp32 FMA throughout.
//
// This file is a TEMPLATE: `shaders/src/matmul_template.rs` fills the holes (NAMES in double braces) from a `MatmulTile`
// (workgroup tile TILE_M x TILE_N, K step TILE_K, per-invocation tile THREAD_M x THREAD_N, one or two
// workgroup buffers, vector loads on or off), generating the accumulators and the unrolled multiply-adds
// as named variables. Every variant computes the same bits (see Determinism), so `zerostream tune` may
// pick any of them per shape. The default (128x128x8, 8x8, two buffers, vector loads) is described here.
//
// Design (the classic register-blocked SGEMM of cuBLAS-era kernels):
// - A workgroup of (TILE_M / THREAD_M) x (TILE_N / THREAD_N) invocations (default 16 x 16) computes a
//   TILE_M x TILE_N tile of C; each invocation a THREAD_M x THREAD_N block of it, held in vec4
//   accumulators (named variables, never an indexed function-scope array, so the driver keeps them in
//   registers). Its rows come in groups of 4 spaced TILE_M / (THREAD_M / 4) apart (default: 4ty..4ty+3
//   and 64+4ty..64+4ty+3), its columns likewise: every operand it reads from workgroup memory is one
//   aligned vec4, and the invocations of a row of the workgroup read consecutive vec4 (no bank conflicts).
// - K is streamed TILE_K at a time through BUFFERS workgroup buffers per operand (A as [k][m], B as
//   [k][n], vec4 each; default 2 x 2 x 8 x 128 x 4 bytes = 16 KiB, the smallest maximum any
//   Vulkan/Metal/DX12 device allows). While the tile in one buffer is multiplied, the next tile's global
//   loads are already in flight into registers; with two buffers they are stored into the other one
//   afterwards (one barrier per K step), with one buffer after a second barrier.
// - Per K step each invocation loads LOADS_A vec4 of A's tile and LOADS_B of B's, walking the operand's
//   unit-stride dimension with consecutive invocations (coalesced). Where 4 are contiguous, aligned and
//   inside the matrix, they come as one vec4 load from a second, vec4-typed binding of the same window
//   (flags bit 2 for A, bit 3 for B say that binding is usable; VECTOR_LOADS false never uses it);
//   elsewhere (edge tiles, odd offsets or strides, other layouts) as 4 scalar loads with bounds checks.
//   Both paths load the same values.
//
// Determinism: every element of C is one chain of FMAs in increasing k, started from its initial value
// (C if accumulating, plus the bias): the order never depends on the tiling (hence the variant), the grid,
// or on the engine splitting K across dispatches (a second K piece accumulates onto the first exactly as
// the chain would have continued). Past the end of K, A is padded with -0.0 (and B with +0.0): fma(-0, 0, x) = x for every
// x, so the padded steps of a last partial tile change no bit, not even the sign of a zero.

// Params and binding 0 come from common/matmul_params.wgsl, bindings 1-4 from common/matmul_io.wgsl (both
// shared with matmul_coop.wgsl).
// The windows of bindings 1 and 2 again, as whole vec4 (their length rounded down to 16 bytes).
@group(0) @binding(5) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> b4: array<vec4<u32>>;

// The variant: {{NAME}}.
const TILE_M: u32 = {{TILE_M}}u;
const TILE_N: u32 = {{TILE_N}}u;
const TILE_K: u32 = {{TILE_K}}u;
const TILE_M4: u32 = {{TILE_M4}}u; // vec4 per k of A's workgroup tile (TILE_M / 4)
const TILE_N4: u32 = {{TILE_N4}}u; // vec4 per k of B's workgroup tile (TILE_N / 4)
const K4: u32 = {{K4}}u; // quads of 4 consecutive k in a tile's row (TILE_K / 4)
const THREADS_N: u32 = {{THREADS_N}}u; // invocations along N (TILE_N / THREAD_N)
const VECTOR_LOADS: bool = {{VECTOR_LOADS}};

var<workgroup> a_tile: array<vec4<f32>, {{A_TILE_VEC4}}>; // [buffer][TILE_K][TILE_M / 4]
var<workgroup> b_tile: array<vec4<f32>, {{B_TILE_VEC4}}>; // [buffer][TILE_K][TILE_N / 4]

// Whether A is read along M (a transposed operand: unit row stride) rather than along K.
fn a_along_m() -> bool {
    return p.a_row_stride == 1u && p.a_col_stride != 1u;
}

// Whether B is read along K (a transposed operand: unit row stride) rather than along N.
fn b_along_k() -> bool {
    return p.b_row_stride == 1u && p.b_col_stride != 1u;
}

// A (r, k), or -0.0 outside the matrix (see the header: padding that changes no sum).
fn a_at(r: u32, k: u32) -> f32 {
    if (r < p.m && k < p.k) { return a[p.a_off + r * p.a_row_stride + k * p.a_col_stride]; }
    return bitcast<f32>(0x80000000u);
}

// Two packed 16-bit values widened: element 2i (the low half) in x.
fn widen2(word: u32) -> vec2<f32> {
    if (p.b_format == 1u) { return unpack2x16float(word); }
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

// B (k, n) widened to f32, or 0.0 outside the matrix.
fn b_at(k: u32, n: u32) -> f32 {
    if (k >= p.k || n >= p.n) { return 0.0; }
    let i = p.b_off + k * p.b_row_stride + n * p.b_col_stride;
    if (p.b_format == 0u) { return bitcast<f32>(b[i]); }
    let bits = (b[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
    if (p.b_format == 1u) { return unpack2x16float(bits).x; }
    return bitcast<f32>(bits << 16u);
}

// Quad q of A's tile at (row0, k0): 4 consecutive rows of one k if A is read along M, else 4 consecutive
// k of one row.
fn load_a(row0: u32, k0: u32, q: u32) -> vec4<f32> {
    let vec_ok = VECTOR_LOADS && (p.flags & 4u) != 0u;
    if (a_along_m()) {
        let r = row0 + (q % TILE_M4) * 4u;
        let k = k0 + q / TILE_M4;
        if (vec_ok && k < p.k && r + 3u < p.m) {
            let i = p.a_off + r + k * p.a_col_stride;
            if ((i & 3u) == 0u && (i >> 2u) < arrayLength(&a4)) { return a4[i >> 2u]; }
        }
        return vec4<f32>(a_at(r, k), a_at(r + 1u, k), a_at(r + 2u, k), a_at(r + 3u, k));
    }
    let r = row0 + q / K4;
    let k = k0 + (q % K4) * 4u;
    if (vec_ok && p.a_col_stride == 1u && r < p.m && k + 3u < p.k) {
        let i = p.a_off + r * p.a_row_stride + k;
        if ((i & 3u) == 0u && (i >> 2u) < arrayLength(&a4)) { return a4[i >> 2u]; }
    }
    return vec4<f32>(a_at(r, k), a_at(r, k + 1u), a_at(r, k + 2u), a_at(r, k + 3u));
}

// Four consecutive elements of B from index i (a multiple of 4) in one vector load, if they lie in the
// vec4 binding: for 16-bit B, one half of a vec4 of words.
fn b_vec4(i: u32, out: ptr<function, vec4<f32>>) -> bool {
    if ((i & 3u) != 0u) { return false; }
    if (p.b_format == 0u) {
        if ((i >> 2u) >= arrayLength(&b4)) { return false; }
        *out = bitcast<vec4<f32>>(b4[i >> 2u]);
        return true;
    }
    if ((i >> 3u) >= arrayLength(&b4)) { return false; }
    let words = b4[i >> 3u];
    let pair = select(words.xy, words.zw, (i & 4u) != 0u);
    *out = vec4<f32>(widen2(pair.x), widen2(pair.y));
    return true;
}

// Quad q of B's tile at (k0, col0): 4 consecutive k of one column if B is read along K, else 4
// consecutive columns of one k.
fn load_b(k0: u32, col0: u32, q: u32) -> vec4<f32> {
    let vec_ok = VECTOR_LOADS && (p.flags & 8u) != 0u;
    var v: vec4<f32>;
    if (b_along_k()) {
        let n = col0 + q / K4;
        let k = k0 + (q % K4) * 4u;
        if (vec_ok && n < p.n && k + 3u < p.k && b_vec4(p.b_off + k + n * p.b_col_stride, &v)) { return v; }
        return vec4<f32>(b_at(k, n), b_at(k + 1u, n), b_at(k + 2u, n), b_at(k + 3u, n));
    }
    let n = col0 + (q % TILE_N4) * 4u;
    let k = k0 + q / TILE_N4;
    if (vec_ok && p.b_col_stride == 1u && k < p.k && n + 3u < p.n && b_vec4(p.b_off + k * p.b_row_stride + n, &v)) {
        return v;
    }
    return vec4<f32>(b_at(k, n), b_at(k, n + 1u), b_at(k, n + 2u), b_at(k, n + 3u));
}

// Stores what load_a loaded for quad q into buffer `buf` of a_tile ([k][m]).
fn store_a(buf: u32, q: u32, v: vec4<f32>) {
    if (a_along_m()) {
        a_tile[(buf * TILE_K + q / TILE_M4) * TILE_M4 + q % TILE_M4] = v;
        return;
    }
    let r = q / K4;
    let base = (buf * TILE_K + (q % K4) * 4u) * TILE_M4 + r / 4u;
    let lane = r % 4u;
    a_tile[base][lane] = v.x;
    a_tile[base + TILE_M4][lane] = v.y;
    a_tile[base + 2u * TILE_M4][lane] = v.z;
    a_tile[base + 3u * TILE_M4][lane] = v.w;
}

// Stores what load_b loaded for quad q into buffer `buf` of b_tile ([k][n]).
fn store_b(buf: u32, q: u32, v: vec4<f32>) {
    if (!b_along_k()) {
        b_tile[(buf * TILE_K + q / TILE_N4) * TILE_N4 + q % TILE_N4] = v;
        return;
    }
    let n = q / K4;
    let base = (buf * TILE_K + (q % K4) * 4u) * TILE_N4 + n / 4u;
    let lane = n % 4u;
    b_tile[base][lane] = v.x;
    b_tile[base + TILE_N4][lane] = v.y;
    b_tile[base + 2u * TILE_N4][lane] = v.z;
    b_tile[base + 3u * TILE_N4][lane] = v.w;
}

// The starting value of C (r, col..col+3): C if accumulating, plus the bias; 0 outside the matrix.
fn initial4(r: u32, col: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (r >= p.m) { return v; }
    for (var j = 0u; j < 4u; j++) {
        let cj = col + j;
        if (cj < p.n) {
            var x = 0.0;
            if ((p.flags & 1u) != 0u) { x = c[p.c_off + r * p.c_row_stride + cj]; }
            if ((p.flags & 2u) != 0u) { x += bias[p.bias_off + cj]; }
            v[j] = x;
        }
    }
    return v;
}

// Writes C (r, col..col+3), the elements inside the matrix.
fn store4(r: u32, col: u32, v: vec4<f32>) {
    if (r >= p.m) { return; }
    let base = p.c_off + r * p.c_row_stride;
    if (col < p.n) { c[base + col] = v.x; }
    if (col + 1u < p.n) { c[base + col + 1u] = v.y; }
    if (col + 2u < p.n) { c[base + col + 2u] = v.z; }
    if (col + 3u < p.n) { c[base + col + 3u] = v.w; }
}

@compute @workgroup_size({{WORKGROUP}}, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row0 = wg.y * TILE_M;
    let col0 = wg.x * TILE_N;
    let tx = li % THREADS_N;
    let ty = li / THREADS_N;
    // This invocation's rows are r0 + (row offsets below), its columns c0 + (column offsets).
    let r0 = row0 + 4u * ty;
    let c0 = col0 + 4u * tx;
{{ACCUMULATORS}}
    let tiles = (p.k + TILE_K - 1u) / TILE_K;
{{LOAD_FIRST}}
    workgroupBarrier();
    for (var t = 0u; t < tiles; t++) {
        let buf = {{BUF}};
        let more = t + 1u < tiles;
        if (more) {
            // The next tile's global loads, in flight while this tile is multiplied.
{{LOAD_NEXT}}
        }
        for (var kk = 0u; kk < TILE_K; kk++) {
            let a_base = (buf * TILE_K + kk) * TILE_M4;
            let b_base = (buf * TILE_K + kk) * TILE_N4;
{{MULTIPLY}}
        }
{{STORE_NEXT}}
        workgroupBarrier();
    }

{{STORE_C}}
}
