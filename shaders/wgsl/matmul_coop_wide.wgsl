// matmul_coop_wide: C (M, N) = A (M, K) @ B (K, N) [+ bias (N)] [+ C], with A and B already rounded to f16
// and packed by pack_f16.wgsl, staged through workgroup memory 16 bytes per load and multiplied on
// cooperative matrices.
//
// The staged kernel (matmul_coop.wgsl) loads each element alone, with its bounds checks, its index
// arithmetic and its rounding; the direct kernel (matmul_coop_direct.wgsl) stages nothing and lets every
// subgroup load its own fragments from storage memory. Here the engine has packed A as [M_pad][K_pad] and
// B as [K_pad][N_pad] halves, row-major, zero-padded to whole workgroup tiles along M and N and whole K
// steps along K (Params: a_row_stride = K_pad, b_row_stride = N_pad, a_off and b_off in halves, multiples
// of 8). So every invocation loads whole 16-byte chunks of 8 halves, with no bounds check, into the same
// workgroup tiles as the staged kernel (same layout, same padding of the rows), and the subgroups read
// their fragments from there. The epilogue is the staged kernel's (common/matmul_coop_epilogue.wgsl).
//
// This file is a TEMPLATE: `shaders/src/matmul_coop_template.rs` fills the holes from a `CoopTile` with
// `Loads::Wide` (the staged kernel's holes, its loads replaced by chunks).
//
// Determinism: the tiles hold the halves the staged kernel's hold (the same rounding, by pack_f16.wgsl;
// zero outside the matrix), and the multiply-adds are the staged kernel's, block by block in increasing k
// over the blocks K reaches, so a wide variant gives the staged variants' bits.

// The variant: {{NAME}}.
const COOP: u32 = {{COOP}}u;
const TILE_M: u32 = {{TILE_M}}u;
const TILE_N: u32 = {{TILE_N}}u;
const TILE_K: u32 = {{TILE_K}}u;
const A_STRIDE: u32 = {{A_STRIDE}}u; // halves per row of A's tile: TILE_K + 8
const B_STRIDE: u32 = {{B_STRIDE}}u; // halves per row of B's tile: TILE_N + 8
const REGION_M: u32 = {{REGION_M}}u; // rows of C per region: FRAG_M x COOP
const REGION_N: u32 = {{REGION_N}}u; // columns of C per region: FRAG_N x COOP
const REGIONS_N: u32 = {{REGIONS_N}}u; // regions across the tile (TILE_N / REGION_N)
const REGIONS: u32 = {{REGIONS}}u;
const DUMP_SLOT: u32 = {{REGIONS}}u; // the staging slot of subgroups computing a copy of a region
const SLOT: u32 = {{SLOT}}u; // f32 per staging slot: COOP x COOP

// The packed operands (pack_f16.wgsl) as 16-byte chunks of 8 halves, bias and C.
@group(0) @binding(1) var<storage, read> a8: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> b8: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> c: array<f32>;

// The staged kernel's two workgroup arrays (its header says why exactly two, each a multiple of 16 bytes).
const A_TILE: u32 = 0u;
const B_TILE: u32 = {{B_TILE}}u; // TILE_M * A_STRIDE
const COUNT_SLOT: u32 = {{COUNT_SLOT}}u; // (REGIONS + 1) * SLOT
var<workgroup> tile_halves: array<f16, {{TILE_HALVES}}>;
var<workgroup> c_stage: array<f32, {{C_STAGE}}>; // COUNT_SLOT + 4

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

@compute @workgroup_size({{WORKGROUP}}, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) sg_count: u32,
) {
    let row0 = wg.y * TILE_M;
    let col0 = wg.x * TILE_N;
    if (li == 0u) { c_stage[COUNT_SLOT] = f32(sg_count); }
    // The count through workgroup memory: a value the validator knows is uniform, for the pass loop.
    let count = u32(workgroupUniformLoad(&c_stage[COUNT_SLOT]));
    let passes = (REGIONS + count - 1u) / count;
    let tiles = (p.k + TILE_K - 1u) / TILE_K;

    for (var sweep = 0u; sweep < passes; sweep++) {
        let g = sweep * count + sg;
        let region = g % REGIONS;
        let slot = select(region, DUMP_SLOT, g >= REGIONS);
        let a_base = A_TILE + (region / REGIONS_N) * REGION_M * A_STRIDE; // the region's first row of A's tile
        let b_base = B_TILE + (region % REGIONS_N) * REGION_N; // its first column of B's tile
{{ACCUMULATORS}}

{{LOAD_FIRST}}
        for (var t = 0u; t < tiles; t++) {
            // The previous step's cooperative loads are done before the tiles are overwritten.
            workgroupBarrier();
{{STORE}}
            workgroupBarrier();
            if (t + 1u < tiles) {
{{LOAD_NEXT}}
            }
            // Only the COOP-deep blocks K reaches (rounded up to COOP), as the staged kernel.
            let k_end = min(TILE_K, (p.k - t * TILE_K + COOP - 1u) / COOP * COOP);
            for (var kk = 0u; kk < k_end; kk += COOP) {
{{MULTIPLY}}
            }
        }

        // This pass computed regions sweep * count .. min(REGIONS, (sweep + 1) * count).
        let first = sweep * count;
        let end = min(REGIONS, first + count);
{{FLUSH}}
    }
}
