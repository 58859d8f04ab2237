// coop_probe: the rate of the cooperative multiply-add itself on this adapter, for `bench kernels`: each
// subgroup loads two A and four B fragments (COOP x COOP f16) once from workgroup memory, then runs ITERS
// rounds of 8 multiply-adds into 8 f32 accumulators held in registers, as matmul_coop.wgsl's default
// does per COOP-deep block but with no global loads, no rounding and no barriers in the loop. What it
// reaches bounds what any matmul_coop variant can reach through wgpu and the driver; the gap between the
// two is the kernel's data path.
//
// A TEMPLATE: shaders/src/matmul_coop_template.rs fills COOP (8 or 16) and prepends the enable directives.
// The accumulators are stored only when p.store is 1, a value the compiler cannot know, so the multiply-adds
// are never dead code; the subgroup count goes to the word after the slots, for the host's FLOP count.

struct Params { iters: u32, store: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
// [64 subgroups][8 accumulators][COOP x COOP], then the subgroup count.
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

const COOP: u32 = {{COOP}}u;
const SLOT: u32 = {{SLOT}}u; // COOP x COOP
const COUNT_AT: u32 = {{COUNT_AT}}u; // 64 x 8 x SLOT
var<workgroup> tile: array<f16, {{TILE_HALVES}}>; // 6 fragments

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) sg_count: u32,
) {
    for (var i = li; i < 6u * SLOT; i += 256u) {
        tile[i] = f16(f32(i % 13u) * 0.0625 - 0.375);
    }
    workgroupBarrier();
    let a0 = coopLoadT<coop_mat{{COOP}}x{{COOP}}<f16, A>>(&tile[0u], COOP);
    let a1 = coopLoadT<coop_mat{{COOP}}x{{COOP}}<f16, A>>(&tile[SLOT], COOP);
    let b0 = coopLoadT<coop_mat{{COOP}}x{{COOP}}<f16, B>>(&tile[2u * SLOT], COOP);
    let b1 = coopLoadT<coop_mat{{COOP}}x{{COOP}}<f16, B>>(&tile[3u * SLOT], COOP);
    let b2 = coopLoadT<coop_mat{{COOP}}x{{COOP}}<f16, B>>(&tile[4u * SLOT], COOP);
    let b3 = coopLoadT<coop_mat{{COOP}}x{{COOP}}<f16, B>>(&tile[5u * SLOT], COOP);
    var acc0 = coop_mat{{COOP}}x{{COOP}}<f32, C>();
    var acc1 = coop_mat{{COOP}}x{{COOP}}<f32, C>();
    var acc2 = coop_mat{{COOP}}x{{COOP}}<f32, C>();
    var acc3 = coop_mat{{COOP}}x{{COOP}}<f32, C>();
    var acc4 = coop_mat{{COOP}}x{{COOP}}<f32, C>();
    var acc5 = coop_mat{{COOP}}x{{COOP}}<f32, C>();
    var acc6 = coop_mat{{COOP}}x{{COOP}}<f32, C>();
    var acc7 = coop_mat{{COOP}}x{{COOP}}<f32, C>();
    for (var i = 0u; i < p.iters; i++) {
        acc0 = coopMultiplyAdd(a0, b0, acc0);
        acc1 = coopMultiplyAdd(a0, b1, acc1);
        acc2 = coopMultiplyAdd(a0, b2, acc2);
        acc3 = coopMultiplyAdd(a0, b3, acc3);
        acc4 = coopMultiplyAdd(a1, b0, acc4);
        acc5 = coopMultiplyAdd(a1, b1, acc5);
        acc6 = coopMultiplyAdd(a1, b2, acc6);
        acc7 = coopMultiplyAdd(a1, b3, acc7);
    }
    if (p.store == 1u) {
        let base = (sg % 64u) * 8u * SLOT;
        coopStoreT(acc0, &out[base], COOP);
        coopStoreT(acc1, &out[base + SLOT], COOP);
        coopStoreT(acc2, &out[base + 2u * SLOT], COOP);
        coopStoreT(acc3, &out[base + 3u * SLOT], COOP);
        coopStoreT(acc4, &out[base + 4u * SLOT], COOP);
        coopStoreT(acc5, &out[base + 5u * SLOT], COOP);
        coopStoreT(acc6, &out[base + 6u * SLOT], COOP);
        coopStoreT(acc7, &out[base + 7u * SLOT], COOP);
    }
    if (wg.x == 0u && li == 0u) {
        out[COUNT_AT] = f32(sg_count);
    }
}
