// matmul_coop_direct: C (M, N) = A (M, K) @ B (K, N) [+ bias (N)] [+ C], with A and B already rounded to f16
// and packed by pack_f16.wgsl, multiplied on cooperative matrices straight from storage memory.
//
// The staged kernel (matmul_coop.wgsl) moves every element through registers and workgroup memory one at
// a time, with bounds checks and index arithmetic per element: on an H200 that made it reach 20 TFLOP/s
// where its multiply-adds alone reach 574 (benches/results/2026-11-27-h200-gpu.md). Here the engine has
// packed A as [M_pad][K_pad] and B as [K_pad][N_pad] halves, row-major, zero-padded to whole workgroup
// tiles along M and N and whole K steps along K (Params: a_row_stride = K_pad, b_row_stride = N_pad,
// a_off and b_off in halves, multiples of 8). So every cooperative load of a region is in bounds and
// 16-byte aligned, the loop has no branch, no barrier and no workgroup memory, and the caches serve the
// reuse between the subgroups of a workgroup. The epilogue is the staged kernel's
// (common/matmul_coop_epilogue.wgsl).
//
// This file is a TEMPLATE: `shaders/src/matmul_coop_template.rs` fills the holes from a `CoopTile` with
// `direct` set (cooperative size COOP, workgroup tile TILE_M x TILE_N, TILE_K / COOP blocks loaded
// before their multiply-adds, accumulators per subgroup FRAG_M x FRAG_N, invocations per workgroup).
//
// Determinism: every accumulator is the chain of cooperative multiply-adds over K's COOP-deep blocks in
// increasing k (those K reaches, K rounded up to COOP), from zero, on the same halves as the staged
// kernel's tiles hold (the same rounding; zero outside the matrix), so a direct variant gives the staged
// variants' bits and `zerostream tune` may choose among them all.

// The variant: {{NAME}}.
const COOP: u32 = {{COOP}}u;
const TILE_M: u32 = {{TILE_M}}u;
const TILE_N: u32 = {{TILE_N}}u;
const TILE_K: u32 = {{TILE_K}}u; // the K loaded before its multiply-adds: TILE_K / COOP blocks
const REGION_M: u32 = {{REGION_M}}u; // rows of C per region: FRAG_M x COOP
const REGION_N: u32 = {{REGION_N}}u; // columns of C per region: FRAG_N x COOP
const REGIONS_N: u32 = {{REGIONS_N}}u; // regions across the tile (TILE_N / REGION_N)
const REGIONS: u32 = {{REGIONS}}u;
const DUMP_SLOT: u32 = {{REGIONS}}u; // the staging slot of subgroups computing a copy of a region
const SLOT: u32 = {{SLOT}}u; // f32 per staging slot: COOP x COOP

// The packed operands (pack_f16.wgsl), bias and C.
@group(0) @binding(1) var<storage, read> ah: array<f16>;
@group(0) @binding(2) var<storage, read> bh: array<f16>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> c: array<f32>;

// The accumulators' staging slots ([REGIONS + 1][SLOT]) and, after them, the subgroup count (as the
// staged kernel keeps it: an f32 in a 16-byte tail, so the slots stay 16-byte aligned).
const COUNT_SLOT: u32 = {{COUNT_SLOT}}u; // (REGIONS + 1) * SLOT
var<workgroup> c_stage: array<f32, {{C_STAGE}}>; // COUNT_SLOT + 4

@compute @workgroup_size({{WORKGROUP}}, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) sg_count: u32,
) {
    let row0 = wg.y * TILE_M;
    let col0 = wg.x * TILE_N;
    let count = uniform_subgroup_count(li, sg_count);
    let passes = (REGIONS + count - 1u) / count;
    let blocks = (p.k + COOP - 1u) / COOP; // the COOP-deep blocks K reaches
    let steps = blocks / (TILE_K / COOP); // whole steps; the blocks after them go one at a time
    let sa = p.a_row_stride;
    let sb = p.b_row_stride;

    for (var sweep = 0u; sweep < passes; sweep++) {
        let g = sweep * count + sg;
        let region = g % REGIONS;
        let slot = select(region, DUMP_SLOT, g >= REGIONS);
        let a_at = p.a_off + (row0 + (region / REGIONS_N) * REGION_M) * sa; // the region's first row of A
        let b_at = p.b_off + col0 + (region % REGIONS_N) * REGION_N; // its first column of B
{{ACCUMULATORS}}

        for (var t = 0u; t < steps; t++) {
            let k0 = t * TILE_K;
{{MULTIPLY_STEP}}
        }
        for (var kb = steps * (TILE_K / COOP); kb < blocks; kb++) {
            let k0 = kb * COOP;
{{MULTIPLY_BLOCK}}
        }

        // This pass computed regions sweep * count .. min(REGIONS, (sweep + 1) * count).
        let first = sweep * count;
        let end = min(REGIONS, first + count);
{{FLUSH}}
    }
}
