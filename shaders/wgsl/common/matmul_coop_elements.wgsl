// The staged cooperative-matrix matmul's element loads (matmul_coop.wgsl with Loads::Elements or
// Loads::Precast, after common/matmul_io.wgsl's bindings and common/f16_bits.wgsl): each invocation loads
// single elements of A and B, bounds-checked, rounds them to f16 (or reads the halves precast), and keeps
// each with its place in the tiles until it stores it.

// Whether A is read along M (a transposed operand: unit row stride) rather than along K.
fn a_along_m() -> bool {
    return p.a_row_stride == 1u && p.a_col_stride != 1u;
}

// Whether B is read along K (a transposed operand: unit row stride) rather than along N.
fn b_along_k() -> bool {
    return p.b_row_stride == 1u && p.b_col_stride != 1u;
}

// Whether A arrives as f16 halves packed two per word (the engine rounded it already), not as f32.
const A_PRECAST: bool = {{A_PRECAST}};

// A (r, k) as f16 bits, or 0 outside the matrix.
fn a_half(r: u32, k: u32) -> u32 {
    if (r >= p.m || k >= p.k) { return 0u; }
    let i = p.a_off + r * p.a_row_stride + k * p.a_col_stride;
    if (A_PRECAST) { return (bitcast<u32>(a[i >> 1u]) >> ((i & 1u) * 16u)) & 0xffffu; }
    return f16_bits(a[i]);
}

// B (k, n) as f16 bits (an f16 B as stored, f32 and bf16 rounded), or 0 outside the matrix.
fn b_half(k: u32, n: u32) -> u32 {
    if (k >= p.k || n >= p.n) { return 0u; }
    let i = p.b_off + k * p.b_row_stride + n * p.b_col_stride;
    if (p.b_format == 0u) { return f16_bits(bitcast<f32>(b[i])); }
    let bits = (b[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
    if (p.b_format == 1u) { return bits; }
    return f16_bits(bitcast<f32>(bits << 16u));
}

// Element `idx` (0..TILE_M * TILE_K) of A's tile at (row0, k0): its place in the tile (low half) and its
// f16 bits (high half).
fn load_a(row0: u32, k0: u32, idx: u32) -> u32 {
    var r: u32;
    var kk: u32;
    if (a_along_m()) {
        kk = idx / TILE_M;
        r = idx % TILE_M;
    } else {
        r = idx / TILE_K;
        kk = idx % TILE_K;
    }
    return (r * A_STRIDE + kk) | (a_half(row0 + r, k0 + kk) << 16u);
}

// Element `idx` (0..TILE_K * TILE_N) of B's tile at (k0, col0), as `load_a`.
fn load_b(k0: u32, col0: u32, idx: u32) -> u32 {
    var kk: u32;
    var n: u32;
    if (b_along_k()) {
        n = idx / TILE_K;
        kk = idx % TILE_K;
    } else {
        kk = idx / TILE_N;
        n = idx % TILE_N;
    }
    return (B_TILE + kk * B_STRIDE + n) | (b_half(k0 + kk, col0 + n) << 16u);
}

// Stores a staged element (place, f16 bits) into the tiles. The f16 bits are widened exactly by
// unpack2x16float and narrowed back exactly (every value is an f16): naga has no bitcast from u32 to
// vec2<f16>.
fn store_half(staged: u32) {
    tile_halves[staged & 0xffffu] = f16(unpack2x16float(staged).y);
}
