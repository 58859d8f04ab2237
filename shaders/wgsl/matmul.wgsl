// matmul: C (M, N) = A (M, K) @ B (K, N) [+ bias (N)] [+ C], every operand addressed by strides.
//
// One kernel serves the forward pass and both backward products: a transposed operand is the same buffer
// read with its strides swapped. B may be stored in 16 bits (b_format 1 = f16, 2 = bf16, packed two per
// word, element 2i in the low half): the weights of a 16-bit working copy are read, and widened exactly,
// where they lie. The math is fp32 FMA throughout.
//
// Design (the classic register-blocked SGEMM of cuBLAS-era kernels):
// - A workgroup of 256 invocations (16 x 16) computes a 128 x 128 tile of C; each invocation an 8 x 8
//   block of it, held in 16 vec4 accumulators (named variables, never an indexed function-scope array, so
//   the driver keeps them in registers). Its rows are 4ty..4ty+3 and 64+4ty..64+4ty+3, its columns
//   4tx..4tx+3 and 64+4tx..64+4tx+3: every operand it reads from workgroup memory is one aligned vec4,
//   and the 16 invocations of a row of the workgroup read 16 consecutive vec4 (no bank conflicts).
// - K is streamed 8 at a time through two workgroup buffers per operand (A as [k][m], B as [k][n], vec4
//   each: 2 x 2 x 8 x 128 x 4 bytes = 16 KiB, the smallest maximum any Vulkan/Metal/DX12 device allows).
//   While the tile in one buffer is multiplied (64 FMAs per invocation per k: 512 between barriers), the
//   next tile's global loads are already in flight into registers and are stored into the other buffer
//   afterwards, so there is one barrier per K step.
// - Each invocation loads 4 elements of A's tile and 4 of B's per K step, walking the operand's unit-stride
//   dimension with consecutive invocations (coalesced). Where those 4 are contiguous, aligned and inside
//   the matrix, they come as one vec4 load from a second, vec4-typed binding of the same window (flags bit
//   2 for A, bit 3 for B say that binding is usable); elsewhere (edge tiles, odd offsets or strides, other
//   layouts) as 4 scalar loads with bounds checks. Both paths load the same values.
//
// Determinism: every element of C is one chain of FMAs in increasing k, started from its initial value
// (C if accumulating, plus the bias): the order never depends on the tiling, the grid, or on the engine
// splitting K across dispatches (a second K piece accumulates onto the first exactly as the chain would
// have continued). Past the end of K, A is padded with -0.0 (and B with +0.0): fma(-0, 0, x) = x for every
// x, so the padded steps of a last partial tile change no bit, not even the sign of a zero.

// Params and bindings 0-4 come from common/matmul_io.wgsl (shared with matmul_coop.wgsl).
// The windows of bindings 1 and 2 again, as whole vec4 (their length rounded down to 16 bytes).
@group(0) @binding(5) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> b4: array<vec4<u32>>;

const TILE_M: u32 = 128u;
const TILE_N: u32 = 128u;
const TILE_K: u32 = 8u;
const TILE_M4: u32 = 32u; // vec4 per row of a workgroup tile (TILE_M / 4 = TILE_N / 4)
const HALF4: u32 = 16u; // vec4 offset of the second half of an invocation's rows or columns

var<workgroup> a_tile: array<vec4<f32>, 512>; // [buffer][TILE_K][TILE_M / 4]
var<workgroup> b_tile: array<vec4<f32>, 512>; // [buffer][TILE_K][TILE_N / 4]

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

// This invocation's 4 elements of A's tile at (row0, k0): 4 consecutive rows of one k if A is read along
// M, else 4 consecutive k of one row.
fn load_a(row0: u32, k0: u32, li: u32) -> vec4<f32> {
    let vec_ok = (p.flags & 4u) != 0u;
    if (a_along_m()) {
        let r = row0 + (li % TILE_M4) * 4u;
        let k = k0 + li / TILE_M4;
        if (vec_ok && k < p.k && r + 3u < p.m) {
            let i = p.a_off + r + k * p.a_col_stride;
            if ((i & 3u) == 0u && (i >> 2u) < arrayLength(&a4)) { return a4[i >> 2u]; }
        }
        return vec4<f32>(a_at(r, k), a_at(r + 1u, k), a_at(r + 2u, k), a_at(r + 3u, k));
    }
    let r = row0 + li / 2u;
    let k = k0 + (li % 2u) * 4u;
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

// This invocation's 4 elements of B's tile at (k0, col0): 4 consecutive k of one column if B is read
// along K, else 4 consecutive columns of one k.
fn load_b(k0: u32, col0: u32, li: u32) -> vec4<f32> {
    let vec_ok = (p.flags & 8u) != 0u;
    var v: vec4<f32>;
    if (b_along_k()) {
        let n = col0 + li / 2u;
        let k = k0 + (li % 2u) * 4u;
        if (vec_ok && n < p.n && k + 3u < p.k && b_vec4(p.b_off + k + n * p.b_col_stride, &v)) { return v; }
        return vec4<f32>(b_at(k, n), b_at(k + 1u, n), b_at(k + 2u, n), b_at(k + 3u, n));
    }
    let n = col0 + (li % TILE_M4) * 4u;
    let k = k0 + li / TILE_M4;
    if (vec_ok && p.b_col_stride == 1u && k < p.k && n + 3u < p.n && b_vec4(p.b_off + k * p.b_row_stride + n, &v)) {
        return v;
    }
    return vec4<f32>(b_at(k, n), b_at(k, n + 1u), b_at(k, n + 2u), b_at(k, n + 3u));
}

// Stores what load_a loaded into buffer `buf` of a_tile ([k][m]).
fn store_a(buf: u32, li: u32, v: vec4<f32>) {
    if (a_along_m()) {
        a_tile[(buf * TILE_K + li / TILE_M4) * TILE_M4 + li % TILE_M4] = v;
        return;
    }
    let r = li / 2u;
    let base = (buf * TILE_K + (li % 2u) * 4u) * TILE_M4 + r / 4u;
    let lane = r % 4u;
    a_tile[base][lane] = v.x;
    a_tile[base + TILE_M4][lane] = v.y;
    a_tile[base + 2u * TILE_M4][lane] = v.z;
    a_tile[base + 3u * TILE_M4][lane] = v.w;
}

// Stores what load_b loaded into buffer `buf` of b_tile ([k][n]).
fn store_b(buf: u32, li: u32, v: vec4<f32>) {
    if (!b_along_k()) {
        b_tile[(buf * TILE_K + li / TILE_M4) * TILE_M4 + li % TILE_M4] = v;
        return;
    }
    let n = li / 2u;
    let base = (buf * TILE_K + (li % 2u) * 4u) * TILE_M4 + n / 4u;
    let lane = n % 4u;
    b_tile[base][lane] = v.x;
    b_tile[base + TILE_M4][lane] = v.y;
    b_tile[base + 2u * TILE_M4][lane] = v.z;
    b_tile[base + 3u * TILE_M4][lane] = v.w;
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

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row0 = wg.y * TILE_M;
    let col0 = wg.x * TILE_N;
    let tx = li % 16u;
    let ty = li / 16u;
    // This invocation's rows: r0..r0+3 and r0+64..r0+67; columns c0..c0+3 ("lo") and c0+64..c0+67 ("hi").
    let r0 = row0 + 4u * ty;
    let c0 = col0 + 4u * tx;

    var acc0_lo = initial4(r0, c0);
    var acc0_hi = initial4(r0, c0 + 64u);
    var acc1_lo = initial4(r0 + 1u, c0);
    var acc1_hi = initial4(r0 + 1u, c0 + 64u);
    var acc2_lo = initial4(r0 + 2u, c0);
    var acc2_hi = initial4(r0 + 2u, c0 + 64u);
    var acc3_lo = initial4(r0 + 3u, c0);
    var acc3_hi = initial4(r0 + 3u, c0 + 64u);
    var acc4_lo = initial4(r0 + 64u, c0);
    var acc4_hi = initial4(r0 + 64u, c0 + 64u);
    var acc5_lo = initial4(r0 + 65u, c0);
    var acc5_hi = initial4(r0 + 65u, c0 + 64u);
    var acc6_lo = initial4(r0 + 66u, c0);
    var acc6_hi = initial4(r0 + 66u, c0 + 64u);
    var acc7_lo = initial4(r0 + 67u, c0);
    var acc7_hi = initial4(r0 + 67u, c0 + 64u);

    let tiles = (p.k + TILE_K - 1u) / TILE_K;
    var next_a = load_a(row0, 0u, li);
    var next_b = load_b(0u, col0, li);
    store_a(0u, li, next_a);
    store_b(0u, li, next_b);
    workgroupBarrier();
    for (var t = 0u; t < tiles; t++) {
        let buf = t % 2u;
        let more = t + 1u < tiles;
        if (more) {
            // The next tile's global loads, in flight while this tile is multiplied.
            next_a = load_a(row0, (t + 1u) * TILE_K, li);
            next_b = load_b((t + 1u) * TILE_K, col0, li);
        }
        for (var kk = 0u; kk < TILE_K; kk++) {
            let base = (buf * TILE_K + kk) * TILE_M4;
            let a_lo = a_tile[base + ty];
            let a_hi = a_tile[base + HALF4 + ty];
            let b_lo = b_tile[base + tx];
            let b_hi = b_tile[base + HALF4 + tx];
            acc0_lo = fma(vec4<f32>(a_lo.x), b_lo, acc0_lo);
            acc0_hi = fma(vec4<f32>(a_lo.x), b_hi, acc0_hi);
            acc1_lo = fma(vec4<f32>(a_lo.y), b_lo, acc1_lo);
            acc1_hi = fma(vec4<f32>(a_lo.y), b_hi, acc1_hi);
            acc2_lo = fma(vec4<f32>(a_lo.z), b_lo, acc2_lo);
            acc2_hi = fma(vec4<f32>(a_lo.z), b_hi, acc2_hi);
            acc3_lo = fma(vec4<f32>(a_lo.w), b_lo, acc3_lo);
            acc3_hi = fma(vec4<f32>(a_lo.w), b_hi, acc3_hi);
            acc4_lo = fma(vec4<f32>(a_hi.x), b_lo, acc4_lo);
            acc4_hi = fma(vec4<f32>(a_hi.x), b_hi, acc4_hi);
            acc5_lo = fma(vec4<f32>(a_hi.y), b_lo, acc5_lo);
            acc5_hi = fma(vec4<f32>(a_hi.y), b_hi, acc5_hi);
            acc6_lo = fma(vec4<f32>(a_hi.z), b_lo, acc6_lo);
            acc6_hi = fma(vec4<f32>(a_hi.z), b_hi, acc6_hi);
            acc7_lo = fma(vec4<f32>(a_hi.w), b_lo, acc7_lo);
            acc7_hi = fma(vec4<f32>(a_hi.w), b_hi, acc7_hi);
        }
        if (more) {
            // The other buffer was last read before the previous barrier: free to overwrite.
            store_a(1u - buf, li, next_a);
            store_b(1u - buf, li, next_b);
        }
        workgroupBarrier();
    }

    store4(r0, c0, acc0_lo);
    store4(r0, c0 + 64u, acc0_hi);
    store4(r0 + 1u, c0, acc1_lo);
    store4(r0 + 1u, c0 + 64u, acc1_hi);
    store4(r0 + 2u, c0, acc2_lo);
    store4(r0 + 2u, c0 + 64u, acc2_hi);
    store4(r0 + 3u, c0, acc3_lo);
    store4(r0 + 3u, c0 + 64u, acc3_hi);
    store4(r0 + 64u, c0, acc4_lo);
    store4(r0 + 64u, c0 + 64u, acc4_hi);
    store4(r0 + 65u, c0, acc5_lo);
    store4(r0 + 65u, c0 + 64u, acc5_hi);
    store4(r0 + 66u, c0, acc6_lo);
    store4(r0 + 66u, c0 + 64u, acc6_hi);
    store4(r0 + 67u, c0, acc7_lo);
    store4(r0 + 67u, c0 + 64u, acc7_hi);
}
