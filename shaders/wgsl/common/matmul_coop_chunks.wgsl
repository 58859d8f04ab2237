// The staged cooperative-matrix matmul's chunk loads (matmul_coop.wgsl with Loads::Wide): A and B packed
// by the engine (pack_f16.wgsl) as [M_pad][K_pad] and [K_pad][N_pad] halves, row-major, zero-padded to whole
// workgroup tiles along M and N and whole K steps along K (Params: a_row_stride = K_pad, b_row_stride =
// N_pad, a_off and b_off in halves, multiples of 8). Each invocation loads whole 16-byte chunks of 8
// halves with no bounds check, and stores them into the tiles at the places the element loads would.

// The packed operands (pack_f16.wgsl) as 16-byte chunks of 8 halves, bias and C.
@group(0) @binding(1) var<storage, read> a8: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> b8: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> c: array<f32>;

// Chunk q of A's tile at step k0: row q / (TILE_K / 8), halves from (q % (TILE_K / 8)) * 8.
fn load_a8(row0: u32, col0: u32, k0: u32, q: u32) -> vec4<u32> {
    let r = q / (TILE_K / 8u);
    let kk = (q % (TILE_K / 8u)) * 8u;
    return a8[(p.a_off + (row0 + r) * p.a_row_stride + k0 + kk) / 8u];
}

// Chunk q of B's tile at step k0: row q / (TILE_N / 8), halves from (q % (TILE_N / 8)) * 8.
fn load_b8(row0: u32, col0: u32, k0: u32, q: u32) -> vec4<u32> {
    let kk = q / (TILE_N / 8u);
    let n = (q % (TILE_N / 8u)) * 8u;
    return b8[(p.b_off + (k0 + kk) * p.b_row_stride + col0 + n) / 8u];
}

// The 8 halves of a chunk into the tiles from `at`. Widened exactly by unpack2x16float and narrowed back
// exactly (every value is an f16), as the staged kernel stores its halves: naga has no bitcast from u32
// to vec2<f16>.
fn store8(at: u32, chunk: vec4<u32>) {
    let h0 = vec2<f16>(unpack2x16float(chunk.x));
    let h1 = vec2<f16>(unpack2x16float(chunk.y));
    let h2 = vec2<f16>(unpack2x16float(chunk.z));
    let h3 = vec2<f16>(unpack2x16float(chunk.w));
    tile_halves[at] = h0.x;
    tile_halves[at + 1u] = h0.y;
    tile_halves[at + 2u] = h1.x;
    tile_halves[at + 3u] = h1.y;
    tile_halves[at + 4u] = h2.x;
    tile_halves[at + 5u] = h2.y;
    tile_halves[at + 6u] = h3.x;
    tile_halves[at + 7u] = h3.y;
}

fn store_a8(q: u32, chunk: vec4<u32>) {
    store8(A_TILE + (q / (TILE_K / 8u)) * A_STRIDE + (q % (TILE_K / 8u)) * 8u, chunk);
}

fn store_b8(q: u32, chunk: vec4<u32>) {
    store8(B_TILE + (q / (TILE_N / 8u)) * B_STRIDE + (q % (TILE_N / 8u)) * 8u, chunk);
}
