// matmul_coop: C (M, N) = A (M, K) @ B (K, N) [+ bias (N)] [+ C], with A and B rounded to f16 and multiplied
// on cooperative matrices (tensor cores, matrix cores): COOP x COOP x COOP products of f16 inputs summed in f32.
//
// The opt-in 16-bit path of `train --matmul-inputs f16`; matmul.wgsl (fp32 FMA) stays the default and the
// fallback. Same Params, same bindings 0-4 and the same strided-operand conventions as matmul.wgsl, so one
// dispatch path (engine/src/device/gpu/matmul.rs) serves both; flags bits 2-3 (matmul.wgsl's vec4 views)
// are ignored here. It needs three adapter features: SHADER_F16, SUBGROUP (for subgroup_id) and
// EXPERIMENTAL_COOPERATIVE_MATRIX with a COOP x COOP x COOP f16 x f16 -> f32 configuration (16 on NVIDIA,
// 8 on Mesa's lavapipe; gpu/matmul.rs's `coop_unavailable` checks them all).
//
// This file is a TEMPLATE: `shaders/src/matmul_coop_template.rs` fills the holes (NAMES in double braces)
// from a `CoopTile` (cooperative size COOP, workgroup tile TILE_M x TILE_N, K step TILE_K, accumulators per
// subgroup FRAG_M x FRAG_N, invocations per workgroup, precast operands), writing the accumulators, the
// staged loads and the multiply-adds out as named variables (an indexed function-scope array would likely
// land in local memory). With A_PRECAST the engine has rounded A (and an f32 B, then passed as b_format 1)
// to f16 into a scratch buffer with the same function, once per product rather than once per workgroup
// that loads an element; binding 1 then holds halves packed two per word (read through bitcast).
// Every variant of one COOP computes the same bits (see Determinism), so `zerostream tune` may pick any.
//
// Rounding: every element of A (f32) and of an f32 or bf16 B is rounded to f16 by `f16_bits` (common/), round to
// nearest even in integer arithmetic (values past 65504 become +-inf, tiny ones f16 subnormals or zero),
// because WGSL leaves an f32 -> f16 conversion's direction, and its result out of range, to the
// implementation. An f16 B is taken as stored. This is exactly `half::f16::from_f32`, the rounding of the
// twin (engine/src/ops/matmul_f16.rs).
//
// Design:
// - A workgroup of WORKGROUP invocations computes a TILE_M x TILE_N tile of C. The tile is cut into
//   REGIONS regions of (FRAG_M x COOP) x (FRAG_N x COOP); a subgroup computes one region, FRAG_M x FRAG_N
//   cooperative accumulators (f32).
// - The subgroup count is the adapter's business (WORKGROUP / subgroup size). Subgroup s takes region
//   g = pass * count + s; with fewer subgroups than regions the workgroup makes several passes over K (every
//   subgroup in every pass: cooperative operations must be in uniform control flow, so nothing branches on
//   the subgroup id); a subgroup with g >= REGIONS computes a copy of region g % REGIONS and parks its
//   result in a dump slot nobody reads.
// - K is streamed TILE_K at a time through one workgroup tile per operand, f16, rows padded by 8 halves (16
//   bytes) so row starts stay 16-byte aligned while rows fall into different banks: A as [m][k], B as
//   [k][n]. Each invocation loads LOADS_A elements of A and LOADS_B of B per step (consecutive invocations
//   walk the operand's unit-stride dimension, as in matmul.wgsl), rounds them to f16 in registers, and
//   stores them after the barrier that ends the previous step's multiplies; the next step's global loads
//   are issued before this step's multiplies, so they are in flight meanwhile.
// - Accumulators start at zero. The epilogue takes them one COOP x COOP tile at a time through a workgroup
//   staging slot per region (coopStore), after which the whole workgroup writes C = initial + product,
//   initial being C if accumulating, plus the bias, with bounds checks (edge tiles). Outside the matrix A
//   and B are zero, so padded rows, columns and k never reach a stored element.
//
// Determinism: every accumulator is the chain of cooperative multiply-adds over K's COOP-deep blocks in
// increasing k (those K reaches, K rounded up to COOP, whatever the K step), from zero; the order of the products inside one multiply-add is the hardware's, but fixed
// for a given adapter and driver. Neither depends on the tile, the K step or the region a subgroup takes, so
// every variant of one COOP gives the same bits; no atomics, and the engine's K splitting (for bindings) is
// a function of the shape. Results differ from matmul.wgsl's by the f16 rounding of the inputs (see the
// twin's test for the bound), and between COOP sizes by the hardware's order inside a multiply-add.

// Its enable directives (f16, wgpu_cooperative_matrix) come first, from common/enable_f16_coop.wgsl, and
// f16_bits from common/f16_bits.wgsl (the rounding cast_f32_to_f16.wgsl also uses, so the kernel tests
// check it on any adapter); matmul_coop_template.rs prepends them (and the files named below).

// Params and binding 0 come from common/matmul_params.wgsl (every matmul kernel's). write_c and
// flush_tile, the epilogue, come from common/matmul_coop_epilogue.wgsl (shared with
// matmul_coop_direct.wgsl). Bindings 1-4 and the staged loads (the functions the LOAD_FIRST, LOAD_NEXT and
// STORE holes call) come from one of two files, by the variant's `Loads`:
// - common/matmul_coop_elements.wgsl (Elements, Precast): bindings 1-4 of common/matmul_io.wgsl (shared
//   with matmul.wgsl; flags bits 2 and 3, its vec4 views, are not read here), and each element loaded,
//   bounds-checked and rounded alone, as the Design below says;
// - common/matmul_coop_chunks.wgsl (Wide): A and B packed by the engine (pack_f16.wgsl: rounded to f16,
//   zero-padded to whole tiles and K steps), read as 16-byte chunks of 8 halves with no bounds check into
//   the same tiles. The tiles then hold the same halves, so the variants give the same bits.

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

// Two workgroup variables only, each a multiple of 16 bytes long: a cooperative load or store needs its
// address 16-byte aligned, WGSL cannot place workgroup variables, and a driver packs them in an order of
// its own. With a third, 4-byte variable (the subgroup count, as this kernel first had) NVIDIA's driver
// (580, H100 and H200) left the tiles 4 bytes off and every product read its neighbours' elements.
// `tile_halves` holds A's tile ([TILE_M][A_STRIDE] at A_TILE) and B's ([TILE_K][B_STRIDE] at B_TILE);
// `c_stage` the accumulators' staging slots ([REGIONS + 1][SLOT]) and, after them, the subgroup count
// (as an f32 value: its bits would be a subnormal, which a driver that flushes them may zero) and padding
// to 16 bytes.
const A_TILE: u32 = 0u;
const B_TILE: u32 = {{B_TILE}}u; // TILE_M * A_STRIDE
const COUNT_SLOT: u32 = {{COUNT_SLOT}}u; // (REGIONS + 1) * SLOT
var<workgroup> tile_halves: array<f16, {{TILE_HALVES}}>;
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
            // Only the COOP-deep blocks K reaches (rounded up to COOP), so every K step multiplies the same
            // blocks and a deeper step never adds blocks of padding (which would turn a -0 sum into +0).
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
