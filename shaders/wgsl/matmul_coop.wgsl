// matmul_coop: C (M, N) = A (M, K) @ B (K, N) [+ bias (N)] [+ C], with A and B rounded to f16 and multiplied
// on cooperative matrices (tensor cores, matrix cores): 16 x 16 x 16 products of f16 inputs summed in f32.
//
// The opt-in 16-bit path of `train --matmul-inputs f16`; matmul.wgsl (fp32 FMA) stays the default and the
// fallback. Same Params, same bindings 0-4 and the same strided-operand conventions as matmul.wgsl, so one
// dispatch path (engine/src/device/gpu_matmul.rs) serves both; flags bits 2-3 (matmul.wgsl's vec4 views)
// are ignored here. It needs three adapter features: SHADER_F16, SUBGROUP (for subgroup_id) and
// EXPERIMENTAL_COOPERATIVE_MATRIX with a 16x16x16 f16 x f16 -> f32 configuration (gpu.rs checks all three).
//
// Rounding: every element of A (f32) and of an f32 or bf16 B is rounded to f16 by `f16_bits` (common/), round to
// nearest even in integer arithmetic (values past 65504 become +-inf, tiny ones f16 subnormals or zero),
// because WGSL leaves an f32 -> f16 conversion's direction, and its result out of range, to the
// implementation. An f16 B is taken as stored. This is exactly `half::f16::from_f32`, the rounding of the
// twin (engine/src/ops/matmul_f16.rs).
//
// Design:
// - A workgroup of 256 invocations computes a 128 x 128 tile of C, as matmul.wgsl does (so the host's grid is
//   the same). The tile is cut into 8 regions of 32 x 64; a subgroup computes one region, 2 x 4 cooperative
//   16 x 16 accumulators (f32), named variables so they stay in registers.
// - The subgroup count is the adapter's business (256 / subgroup size: 8 on NVIDIA and AMD wave32, 4 on
//   wave64, 16 on SIMD16). Subgroup s takes region g = pass * count + s; with fewer than 8 subgroups the
//   workgroup makes several passes over K (every subgroup in every pass: cooperative operations must be in
//   uniform control flow, so nothing branches on the subgroup id); a subgroup with g >= 8 (more than 8
//   subgroups) computes a copy of region g % 8 and parks its result in a dump slot nobody reads.
// - K is streamed 32 at a time through one workgroup tile per operand, f16, rows padded by 8 halves (16
//   bytes) so row starts stay 16-byte aligned while rows fall into different banks: A as [m][k] (128 x 40),
//   B as [k][n] (32 x 136). Each invocation loads 16 elements of each operand per step (consecutive
//   invocations walk the operand's unit-stride dimension, as in matmul.wgsl), rounds them to f16 in
//   registers, and stores them after the barrier that ends the previous step's multiplies; the next
//   step's global loads are issued before this step's multiplies, so they are in flight meanwhile.
// - Accumulators start at zero. The epilogue takes them one 16 x 16 tile at a time through a workgroup
//   staging slot per region (coopStore), after which the whole workgroup writes C = initial + product,
//   initial being C if accumulating, plus the bias, with bounds checks (edge tiles). Outside the matrix A
//   and B are zero, so padded rows, columns and k never reach a stored element.
//
// Workgroup memory: 10240 + 8704 bytes of f16 tiles, 9 x 1 KiB f32 staging slots and 16 bytes: 28176 bytes
// (gpu_matmul.rs's COOP_WORKGROUP_STORAGE_BYTES; adapters with cooperative matrices have at least 32 KiB).
//
// Determinism: the products' order inside a cooperative multiply-add is the hardware's, but fixed for a given
// adapter and driver; no atomics, and the engine's K splitting (for bindings) is a function of the shape.
// Results differ from matmul.wgsl's by the f16 rounding of the inputs (see the twin's test for the bound).

// Its enable directives (f16, wgpu_cooperative_matrix) come first, from common/enable_f16_coop.wgsl, and
// f16_bits from common/f16_bits.wgsl (the rounding cast_f32_to_f16.wgsl also uses, so the kernel tests
// check it on any adapter); shaders/src/lib.rs prepends them (and common/matmul_io.wgsl).

// Params and bindings 0-4 come from common/matmul_io.wgsl (shared with matmul.wgsl); flags bits 2 and 3
// (matmul.wgsl's vec4 views) are not read here.

const TILE_M: u32 = 128u;
const TILE_N: u32 = 128u;
const TILE_K: u32 = 32u;
const A_STRIDE: u32 = 40u; // halves per row of A's tile: TILE_K + 8
const B_STRIDE: u32 = 136u; // halves per row of B's tile: TILE_N + 8
const REGIONS: u32 = 8u; // 32 x 64 regions of the C tile
const DUMP_SLOT: u32 = 8u; // the staging slot of subgroups computing a copy of a region

// Two workgroup variables only, each a multiple of 16 bytes long: a cooperative load or store needs its
// address 16-byte aligned, WGSL cannot place workgroup variables, and a driver packs them in an order of
// its own. With a third, 4-byte variable (the subgroup count, as this kernel first had) NVIDIA's driver
// (580, H100 and H200) left the tiles 4 bytes off and every product read its neighbours' elements.
// `tile_halves` holds A's tile ([TILE_M][A_STRIDE] at A_TILE) and B's ([TILE_K][B_STRIDE] at B_TILE, 10240
// bytes in); `c_stage` the accumulators' staging slots ([REGIONS + 1][16 x 16]) and, after them, the
// subgroup count (as an f32 value: its bits would be a subnormal, which a driver that flushes them
// may zero) and padding to 16 bytes.
const A_TILE: u32 = 0u;
const B_TILE: u32 = 5120u; // TILE_M * A_STRIDE
const COUNT_SLOT: u32 = 2304u; // (REGIONS + 1) * 256
var<workgroup> tile_halves: array<f16, 9472>; // 5120 + TILE_K * B_STRIDE
var<workgroup> c_stage: array<f32, 2308>; // COUNT_SLOT + 4

// Whether A is read along M (a transposed operand: unit row stride) rather than along K.
fn a_along_m() -> bool {
    return p.a_row_stride == 1u && p.a_col_stride != 1u;
}

// Whether B is read along K (a transposed operand: unit row stride) rather than along N.
fn b_along_k() -> bool {
    return p.b_row_stride == 1u && p.b_col_stride != 1u;
}

// A (r, k) as f16 bits, or 0 outside the matrix.
fn a_half(r: u32, k: u32) -> u32 {
    if (r >= p.m || k >= p.k) { return 0u; }
    return f16_bits(a[p.a_off + r * p.a_row_stride + k * p.a_col_stride]);
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

// Element `idx` (0..4096) of A's tile at (row0, k0): its place in A's tile, and its f16 bits.
fn a_element(row0: u32, k0: u32, idx: u32) -> vec2<u32> {
    var r: u32;
    var kk: u32;
    if (a_along_m()) {
        kk = idx / TILE_M;
        r = idx % TILE_M;
    } else {
        r = idx / TILE_K;
        kk = idx % TILE_K;
    }
    return vec2<u32>(r * A_STRIDE + kk, a_half(row0 + r, k0 + kk));
}

// Element `idx` (0..4096) of B's tile at (k0, col0): its place in B's tile, and its f16 bits.
fn b_element(k0: u32, col0: u32, idx: u32) -> vec2<u32> {
    var kk: u32;
    var n: u32;
    if (b_along_k()) {
        n = idx / TILE_K;
        kk = idx % TILE_K;
    } else {
        kk = idx / TILE_N;
        n = idx % TILE_N;
    }
    return vec2<u32>(kk * B_STRIDE + n, b_half(k0 + kk, col0 + n));
}

// This invocation's 16 elements of each operand's tile at k0: places (low half) and f16 bits (high half).
struct Staged {
    a: array<u32, 16>,
    b: array<u32, 16>,
}

fn load_tiles(row0: u32, col0: u32, k0: u32, li: u32) -> Staged {
    var s: Staged;
    for (var j = 0u; j < 16u; j++) {
        let ea = a_element(row0, k0, li + 256u * j);
        s.a[j] = ea.x | (ea.y << 16u);
        let eb = b_element(k0, col0, li + 256u * j);
        s.b[j] = eb.x | (eb.y << 16u);
    }
    return s;
}

// The f16 bits are widened exactly by unpack2x16float and narrowed back exactly (every value is an f16):
// naga has no bitcast from u32 to vec2<f16>.
fn store_tiles(s: Staged) {
    for (var j = 0u; j < 16u; j++) {
        tile_halves[A_TILE + (s.a[j] & 0xffffu)] = f16(unpack2x16float(s.a[j]).y);
        tile_halves[B_TILE + (s.b[j] & 0xffffu)] = f16(unpack2x16float(s.b[j]).y);
    }
}

// Writes C at (row, col) of the tile = initial value + product, inside the matrix only.
fn write_c(row: u32, col: u32, product: f32) {
    if (row >= p.m || col >= p.n) { return; }
    let i = p.c_off + row * p.c_row_stride + col;
    var x = 0.0;
    if ((p.flags & 1u) != 0u) { x = c[i]; }
    if ((p.flags & 2u) != 0u) { x += bias[p.bias_off + col]; }
    c[i] = x + product;
}

// Every subgroup parks accumulator tile (ti, tj) of its region in its slot; then the workgroup writes the
// slots of regions first..end (this pass's) to C.
fn flush_tile(acc: coop_mat16x16<f32, C>, slot: u32, ti: u32, tj: u32, first: u32, end: u32, row0: u32, col0: u32, li: u32) {
    coopStoreT(acc, &c_stage[slot * 256u], 16u);
    workgroupBarrier();
    for (var region = first; region < end; region++) {
        let row = row0 + (region / 2u) * 32u + ti * 16u + li / 16u;
        let col = col0 + (region % 2u) * 64u + tj * 16u + li % 16u;
        write_c(row, col, c_stage[region * 256u + li]);
    }
    workgroupBarrier();
}

@compute @workgroup_size(256, 1, 1)
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
        let a_base = A_TILE + (region / 2u) * 32u * A_STRIDE; // the region's first row of A's tile
        let b_base = B_TILE + (region % 2u) * 64u; // its first column of B's tile
        var acc00 = coop_mat16x16<f32, C>();
        var acc01 = coop_mat16x16<f32, C>();
        var acc02 = coop_mat16x16<f32, C>();
        var acc03 = coop_mat16x16<f32, C>();
        var acc10 = coop_mat16x16<f32, C>();
        var acc11 = coop_mat16x16<f32, C>();
        var acc12 = coop_mat16x16<f32, C>();
        var acc13 = coop_mat16x16<f32, C>();

        var staged = load_tiles(row0, col0, 0u, li);
        for (var t = 0u; t < tiles; t++) {
            // The previous step's cooperative loads are done before the tiles are overwritten.
            workgroupBarrier();
            store_tiles(staged);
            workgroupBarrier();
            if (t + 1u < tiles) {
                staged = load_tiles(row0, col0, (t + 1u) * TILE_K, li);
            }
            for (var kk = 0u; kk < TILE_K; kk += 16u) {
                let a0 = coopLoadT<coop_mat16x16<f16, A>>(&tile_halves[a_base + kk], A_STRIDE);
                let a1 = coopLoadT<coop_mat16x16<f16, A>>(&tile_halves[a_base + 16u * A_STRIDE + kk], A_STRIDE);
                let b0 = coopLoadT<coop_mat16x16<f16, B>>(&tile_halves[kk * B_STRIDE + b_base], B_STRIDE);
                let b1 = coopLoadT<coop_mat16x16<f16, B>>(&tile_halves[kk * B_STRIDE + b_base + 16u], B_STRIDE);
                let b2 = coopLoadT<coop_mat16x16<f16, B>>(&tile_halves[kk * B_STRIDE + b_base + 32u], B_STRIDE);
                let b3 = coopLoadT<coop_mat16x16<f16, B>>(&tile_halves[kk * B_STRIDE + b_base + 48u], B_STRIDE);
                acc00 = coopMultiplyAdd(a0, b0, acc00);
                acc01 = coopMultiplyAdd(a0, b1, acc01);
                acc02 = coopMultiplyAdd(a0, b2, acc02);
                acc03 = coopMultiplyAdd(a0, b3, acc03);
                acc10 = coopMultiplyAdd(a1, b0, acc10);
                acc11 = coopMultiplyAdd(a1, b1, acc11);
                acc12 = coopMultiplyAdd(a1, b2, acc12);
                acc13 = coopMultiplyAdd(a1, b3, acc13);
            }
        }

        // This pass computed regions sweep * count .. min(8, (sweep + 1) * count).
        let first = sweep * count;
        let end = min(REGIONS, first + count);
        flush_tile(acc00, slot, 0u, 0u, first, end, row0, col0, li);
        flush_tile(acc01, slot, 0u, 1u, first, end, row0, col0, li);
        flush_tile(acc02, slot, 0u, 2u, first, end, row0, col0, li);
        flush_tile(acc03, slot, 0u, 3u, first, end, row0, col0, li);
        flush_tile(acc10, slot, 1u, 0u, first, end, row0, col0, li);
        flush_tile(acc11, slot, 1u, 1u, first, end, row0, col0, li);
        flush_tile(acc12, slot, 1u, 2u, first, end, row0, col0, li);
        flush_tile(acc13, slot, 1u, 3u, first, end, row0, col0, li);
    }
}
