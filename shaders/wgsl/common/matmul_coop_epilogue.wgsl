// The epilogue of both cooperative-matrix matmuls (matmul_coop.wgsl, matmul_coop_direct.wgsl): the
// accumulators leave one COOP x COOP tile at a time through a workgroup staging slot (coopStore), after
// which the whole workgroup writes C = initial + product with bounds checks; and the subgroup count both
// read first. Needs, from the kernel: p, c, bias, c_stage and the constants COOP, SLOT, COUNT_SLOT,
// REGIONS_N, REGION_M, REGION_N; {{COOP}} and {{WORKGROUP}} are the template's holes.

// The workgroup's subgroup count through workgroup memory: a value the validator knows is uniform, for
// the pass loop. Every invocation calls it, in uniform control flow.
fn uniform_subgroup_count(li: u32, sg_count: u32) -> u32 {
    if (li == 0u) { c_stage[COUNT_SLOT] = f32(sg_count); }
    return u32(workgroupUniformLoad(&c_stage[COUNT_SLOT]));
}

// Writes C at (row, col) = initial value + product, inside the matrix only.
fn write_c(row: u32, col: u32, product: f32) {
    if (row >= p.m || col >= p.n) { return; }
    let i = p.c_off + row * p.c_row_stride + col;
    var x = 0.0;
    if ((p.flags & 1u) != 0u) { x = c[i]; }
    if ((p.flags & 2u) != 0u) { x += bias[p.bias_off + col]; }
    c[i] = x + product;
}

// Every subgroup parks accumulator (fi, fj) of its region in its slot; then the workgroup writes the
// slots of regions first..end (this pass's) to C.
fn flush_tile(acc: coop_mat{{COOP}}x{{COOP}}<f32, C>, slot: u32, fi: u32, fj: u32, first: u32, end: u32, row0: u32, col0: u32, li: u32) {
    coopStoreT(acc, &c_stage[slot * SLOT], COOP);
    workgroupBarrier();
    for (var region = first; region < end; region++) {
        for (var e = li; e < SLOT; e += {{WORKGROUP}}u) {
            let row = row0 + (region / REGIONS_N) * REGION_M + fi * COOP + e / COOP;
            let col = col0 + (region % REGIONS_N) * REGION_N + fj * COOP + e % COOP;
            write_c(row, col, c_stage[region * SLOT + e]);
        }
    }
    workgroupBarrier();
}
