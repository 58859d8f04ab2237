//! The cooperative-matrix matmul's addressing run on the CPU, statement for statement, for every
//! candidate variant of both cooperative sizes (the template's constants computed as
//! `matmul_coop_template.rs` fills them): `matmul_coop.wgsl`'s per-invocation staging of A and B into the
//! f16 tiles (`load_a`, `load_b`, both operand orientations, every B format), the wide variants' 16-byte
//! chunks of the packed operands (`common/matmul_coop_chunks.wgsl`) and `matmul_coop_direct.wgsl`'s loads
//! straight from them (after the engine's packing, `pack_f16`); the workgroup grid, the subgroups'
//! regions and passes (several passes, one, and copies parked in the dump slot), the K blocks each step
//! multiplies, the cooperative loads (row-major, 16-byte aligned, in bounds), the staging slots of the
//! epilogue and `write_c` — with only the cooperative multiply-add itself replaced by plain f32 sums.
//! Compared with the twin (`matmul_f16_inputs`), it checks every index of every variant on any machine,
//! the 16x16 ones included, which only NVIDIA's adapters run; `tests/kernels_coop.rs` checks the kernels
//! themselves where an adapter has cooperative matrices. Keep it in step with the WGSL.

use rand::{Rng, SeedableRng};
use zerostream::device::{MatmulShape, Operand};
use zerostream::ops::matmul_f16::{PackSource, PackedShape, matmul_f16_inputs, pack_f16};
use zerostream_shaders::{CoopTile, Loads};

/// A cooperative load or store needs a 16-byte aligned address and row stride (Vulkan's rule; NVIDIA's
/// driver read shifted elements when the tiles sat 4 bytes off). The kernel's two workgroup arrays are
/// each a multiple of 16 bytes long (the shaders crate's tests), so any packing starts them aligned; here
/// every offset into them is checked.
const COOP_ALIGN_BYTES: usize = 16;

/// The template's constants for one variant (`shaders/src/matmul_coop_template.rs`'s holes).
struct Tile {
    coop: usize,
    tile_m: usize,
    tile_n: usize,
    tile_k: usize,
    frag_m: usize,
    frag_n: usize,
    workgroup: usize,
    a_stride: usize,
    b_stride: usize,
    region_m: usize,
    region_n: usize,
    regions_n: usize,
    regions: usize,
    b_tile: usize,
    count_slot: usize,
    tile_halves: usize,
}

impl Tile {
    fn of(t: &CoopTile) -> Tile {
        let u = |x: u32| x as usize;
        let (coop, tile_m, tile_n, tile_k) = (u(t.coop), u(t.tile_m), u(t.tile_n), u(t.tile_k));
        let (region_m, region_n) = (u(t.frag_m) * coop, u(t.frag_n) * coop);
        let (a_stride, b_stride) = (tile_k + 8, tile_n + 8);
        let regions = (tile_m / region_m) * (tile_n / region_n);
        Tile {
            coop,
            tile_m,
            tile_n,
            tile_k,
            frag_m: u(t.frag_m),
            frag_n: u(t.frag_n),
            workgroup: u(t.workgroup),
            a_stride,
            b_stride,
            region_m,
            region_n,
            regions_n: tile_n / region_n,
            regions,
            b_tile: tile_m * a_stride,
            count_slot: (regions + 1) * coop * coop,
            tile_halves: (tile_m * a_stride + tile_k * b_stride).div_ceil(8) * 8,
        }
    }
}

/// The kernel's Params (flags bit 0 accumulate, bit 1 bias; b_format 0 f32, 1 f16, 2 bf16).
#[derive(Clone, Copy)]
struct Params {
    m: usize,
    n: usize,
    k: usize,
    flags: u32,
    a_off: usize,
    a_row_stride: usize,
    a_col_stride: usize,
    b_off: usize,
    b_row_stride: usize,
    b_col_stride: usize,
    b_format: u32,
    c_off: usize,
    c_row_stride: usize,
    bias_off: usize,
}

fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

fn a_half(p: &Params, a: &[f32], r: usize, k: usize) -> u16 {
    if r >= p.m || k >= p.k {
        return 0;
    }
    f16_bits(a[p.a_off + r * p.a_row_stride + k * p.a_col_stride])
}

fn b_half(p: &Params, b: &[u32], k: usize, n: usize) -> u16 {
    if k >= p.k || n >= p.n {
        return 0;
    }
    let i = p.b_off + k * p.b_row_stride + n * p.b_col_stride;
    if p.b_format == 0 {
        return f16_bits(f32::from_bits(b[i]));
    }
    let bits = (b[i >> 1] >> ((i & 1) * 16)) & 0xffff;
    if p.b_format == 1 {
        return bits as u16;
    }
    f16_bits(f32::from_bits(bits << 16))
}

/// `load_a`: element `idx` of A's tile at (row0, k0): its place in the tiles' array and its f16 bits.
fn load_a(t: &Tile, p: &Params, a: &[f32], row0: usize, k0: usize, idx: usize) -> (usize, u16) {
    let along_m = p.a_row_stride == 1 && p.a_col_stride != 1;
    let (r, kk) = if along_m { (idx % t.tile_m, idx / t.tile_m) } else { (idx / t.tile_k, idx % t.tile_k) };
    (r * t.a_stride + kk, a_half(p, a, row0 + r, k0 + kk))
}

/// `load_b`: element `idx` of B's tile at (k0, col0), as `load_a`.
fn load_b(t: &Tile, p: &Params, b: &[u32], k0: usize, col0: usize, idx: usize) -> (usize, u16) {
    let along_k = p.b_row_stride == 1 && p.b_col_stride != 1;
    let (kk, n) = if along_k { (idx % t.tile_k, idx / t.tile_k) } else { (idx / t.tile_n, idx % t.tile_n) };
    (t.b_tile + kk * t.b_stride + n, b_half(p, b, k0 + kk, col0 + n))
}

/// coopLoadT: a row-major `coop` x `coop` tile at `base` with `stride` elements between rows.
fn coop_load(coop: usize, tile: &[u16], base: usize, stride: usize) -> Vec<Vec<f32>> {
    assert!(
        (base * 2).is_multiple_of(COOP_ALIGN_BYTES) && (stride * 2).is_multiple_of(COOP_ALIGN_BYTES),
        "coopLoadT at {base}, stride {stride}"
    );
    (0..coop).map(|i| (0..coop).map(|j| half::f16::from_bits(tile[base + i * stride + j]).to_f32()).collect()).collect()
}

fn multiply_add(a: &[Vec<f32>], b: &[Vec<f32>], acc: &mut [Vec<f32>]) {
    let coop = a.len();
    for i in 0..coop {
        for j in 0..coop {
            acc[i][j] += (0..coop).map(|k| a[i][k] * b[k][j]).sum::<f32>();
        }
    }
}

/// One subgroup's accumulators: frag_m x frag_n tiles of coop x coop f32.
type Accumulators = Vec<Vec<Vec<f32>>>;

/// The whole dispatch (every workgroup of the host's grid) of variant `t` with `subgroups` subgroups per
/// workgroup: `products(row0, col0, sweep)` gives every subgroup's accumulators for one pass of one
/// workgroup (the kernel's main loop, staged or direct); the epilogue (`flush_tile`, `write_c`) is the
/// kernels' shared one.
fn run_dispatch(
    t: &Tile,
    p: &Params,
    bias: &[f32],
    c: &mut [f32],
    subgroups: usize,
    mut products: impl FnMut(usize, usize, usize) -> Vec<Accumulators>,
) {
    let (coop, slot_len) = (t.coop, t.coop * t.coop);
    let dump_slot = t.regions;
    for wg_y in 0..p.m.div_ceil(t.tile_m) {
        for wg_x in 0..p.n.div_ceil(t.tile_n) {
            let (row0, col0) = (wg_y * t.tile_m, wg_x * t.tile_n);
            let mut c_stage = vec![0.0f32; t.count_slot + 4];
            c_stage[t.count_slot] = subgroups as f32; // read back once, by every invocation
            let passes = t.regions.div_ceil(subgroups);
            for sweep in 0..passes {
                let acc = products(row0, col0, sweep);
                let (first, end) = (sweep * subgroups, t.regions.min(sweep * subgroups + subgroups));
                for fi in 0..t.frag_m {
                    for fj in 0..t.frag_n {
                        // flush_tile: every subgroup stores into its slot, then the workgroup writes C.
                        for (sg, acc) in acc.iter().enumerate() {
                            let g = sweep * subgroups + sg;
                            let slot = if g >= t.regions { dump_slot } else { g % t.regions };
                            // coopStoreT of f32 at slot * SLOT with COOP between rows.
                            assert!((slot * slot_len * 4).is_multiple_of(COOP_ALIGN_BYTES) && (coop * 4).is_multiple_of(COOP_ALIGN_BYTES));
                            for i in 0..coop {
                                for j in 0..coop {
                                    c_stage[slot * slot_len + i * coop + j] = acc[fi * t.frag_n + fj][i][j];
                                }
                            }
                        }
                        for li in 0..t.workgroup {
                            for region in first..end {
                                for e in (li..slot_len).step_by(t.workgroup) {
                                    let row = row0 + (region / t.regions_n) * t.region_m + fi * coop + e / coop;
                                    let col = col0 + (region % t.regions_n) * t.region_n + fj * coop + e % coop;
                                    if row >= p.m || col >= p.n {
                                        continue;
                                    }
                                    let i = p.c_off + row * p.c_row_stride + col;
                                    let mut x = if p.flags & 1 != 0 { c[i] } else { 0.0 };
                                    if p.flags & 2 != 0 {
                                        x += bias[p.bias_off + col];
                                    }
                                    c[i] = x + c_stage[region * slot_len + e];
                                }
                            }
                        }
                    }
                }
            }
            assert_eq!(c_stage[t.count_slot], subgroups as f32, "the staging slots overran the subgroup count");
        }
    }
}

/// `matmul_coop.wgsl`: A and B staged through the f16 tiles, element by element, a K step at a time.
fn run_kernel(t: &Tile, p: &Params, a: &[f32], b: &[u32], bias: &[f32], c: &mut [f32], subgroups: usize) {
    run_dispatch(t, p, bias, c, subgroups, |row0, col0, sweep| {
        let mut tile_halves = vec![0u16; t.tile_halves];
        let mut acc = accumulators(t, subgroups);
        for step in 0..p.k.div_ceil(t.tile_k) {
            for li in 0..t.workgroup {
                for j in 0..t.tile_m * t.tile_k / t.workgroup {
                    let (at, av) = load_a(t, p, a, row0, step * t.tile_k, li + t.workgroup * j);
                    tile_halves[at] = av;
                }
                for j in 0..t.tile_k * t.tile_n / t.workgroup {
                    let (bt, bv) = load_b(t, p, b, step * t.tile_k, col0, li + t.workgroup * j);
                    tile_halves[bt] = bv;
                }
            }
            multiply_step(t, p, &tile_halves, step, sweep, subgroups, &mut acc);
        }
        acc
    })
}

/// Every subgroup's frag_m x frag_n accumulators, zero.
fn accumulators(t: &Tile, subgroups: usize) -> Vec<Accumulators> {
    vec![vec![vec![vec![0.0f32; t.coop]; t.coop]; t.frag_m * t.frag_n]; subgroups]
}

/// The staged kernels' multiply-adds of one K step from the tiles: the blocks K reaches, each region's
/// fragments with the tiles' strides.
fn multiply_step(t: &Tile, p: &Params, tile_halves: &[u16], step: usize, sweep: usize, subgroups: usize, acc: &mut [Accumulators]) {
    let coop = t.coop;
    let k_end = t.tile_k.min((p.k - step * t.tile_k).div_ceil(coop) * coop);
    for kk in (0..k_end).step_by(coop) {
        for (sg, acc) in acc.iter_mut().enumerate() {
            let region = (sweep * subgroups + sg) % t.regions;
            let a_base = (region / t.regions_n) * t.region_m * t.a_stride;
            let b_base = t.b_tile + (region % t.regions_n) * t.region_n;
            let a_frags: Vec<_> =
                (0..t.frag_m).map(|i| coop_load(coop, tile_halves, a_base + i * coop * t.a_stride + kk, t.a_stride)).collect();
            for fj in 0..t.frag_n {
                let bj = coop_load(coop, tile_halves, kk * t.b_stride + b_base + fj * coop, t.b_stride);
                for (fi, a_frag) in a_frags.iter().enumerate() {
                    multiply_add(a_frag, &bj, &mut acc[fi * t.frag_n + fj]);
                }
            }
        }
    }
}

/// The engine's packing for the packing variants (`gpu/matmul.rs`'s `pack_operands`, the twin
/// `pack_f16`): A as [M_pad][K_pad] and B as [K_pad][N_pad] halves, padded to whole tiles along M and N
/// and whole K steps along K; and the Params the kernel then gets (offsets 0, the padded row lengths as
/// row strides, B as f16).
fn pack_for(t: &Tile, p: &Params, a: &[f32], b: &[u32]) -> (Vec<u16>, Vec<u16>, Params) {
    let (mp, np, kp) = (p.m.next_multiple_of(t.tile_m), p.n.next_multiple_of(t.tile_n), p.k.next_multiple_of(t.tile_k));
    let a_op = Operand { offset: p.a_off, row_stride: p.a_row_stride, col_stride: p.a_col_stride };
    let ah = pack_f16(PackSource::F32(a), &a_op, &PackedShape { rows: p.m, cols: p.k, rows_pad: mp, cols_pad: kp });
    let b_halves: Vec<u16> = b.iter().flat_map(|w| [*w as u16, (*w >> 16) as u16]).collect();
    let b_f32: Vec<f32> = b.iter().map(|w| f32::from_bits(*w)).collect();
    let b_source = match p.b_format {
        0 => PackSource::F32(&b_f32),
        1 => PackSource::F16(&b_halves),
        _ => PackSource::Bf16(&b_halves),
    };
    let b_op = Operand { offset: p.b_off, row_stride: p.b_row_stride, col_stride: p.b_col_stride };
    let bh = pack_f16(b_source, &b_op, &PackedShape { rows: p.k, cols: p.n, rows_pad: kp, cols_pad: np });
    let packed = Params { a_off: 0, a_row_stride: kp, a_col_stride: 1, b_off: 0, b_row_stride: np, b_col_stride: 1, b_format: 1, ..*p };
    (ah, bh, packed)
}

/// `matmul_coop_direct.wgsl`, statement for statement, on the packed operands: whole steps of
/// `tile_k / coop` blocks (each block's fragments at `k0 + s * COOP`), then the blocks after them one at a
/// time, every cooperative load straight from the packed A and B with their row strides. An index past
/// the packed operands panics here (the padding must cover every load).
fn run_direct(t: &Tile, p: &Params, a: &[f32], b: &[u32], bias: &[f32], c: &mut [f32], subgroups: usize) {
    let coop = t.coop;
    let (ah, bh, q) = pack_for(t, p, a, b);
    let (sa, sb) = (q.a_row_stride, q.b_row_stride);
    let blocks = q.k.div_ceil(coop);
    let per_step = t.tile_k / coop;
    let steps = blocks / per_step;
    run_dispatch(t, &q, bias, c, subgroups, |row0, col0, sweep| {
        let mut acc = accumulators(t, subgroups);
        for (sg, acc) in acc.iter_mut().enumerate() {
            let region = (sweep * subgroups + sg) % t.regions;
            let a_at = q.a_off + (row0 + (region / t.regions_n) * t.region_m) * sa;
            let b_at = q.b_off + col0 + (region % t.regions_n) * t.region_n;
            // One block: its fragments (`a{s}_{i}`, `b{s}_{j}`), then every accumulator's multiply-add.
            let mut block = |k0: usize, s: usize| {
                let a_frags: Vec<_> = (0..t.frag_m).map(|i| coop_load(coop, &ah, a_at + i * coop * sa + k0 + s * coop, sa)).collect();
                let b_frags: Vec<_> = (0..t.frag_n).map(|j| coop_load(coop, &bh, b_at + (k0 + s * coop) * sb + j * coop, sb)).collect();
                for (fi, a_frag) in a_frags.iter().enumerate() {
                    for (fj, b_frag) in b_frags.iter().enumerate() {
                        multiply_add(a_frag, b_frag, &mut acc[fi * t.frag_n + fj]);
                    }
                }
            };
            for step in 0..steps {
                for s in 0..per_step {
                    block(step * t.tile_k, s);
                }
            }
            for kb in steps * per_step..blocks {
                block(kb * coop, 0);
            }
        }
        acc
    })
}

/// `matmul_coop.wgsl` with chunk loads (`common/matmul_coop_chunks.wgsl`) on the packed operands: each invocation copies whole chunks of 8 halves (16
/// bytes, 16-byte aligned) into the staged kernel's tiles, then the staged multiply-adds. A chunk past the
/// packed operands panics here.
fn run_wide(t: &Tile, p: &Params, a: &[f32], b: &[u32], bias: &[f32], c: &mut [f32], subgroups: usize) {
    let (ah, bh, q) = pack_for(t, p, a, b);
    let chunk = |from: &[u16], at: usize| -> [u16; 8] {
        assert!((at * 2).is_multiple_of(16), "a chunk at half {at}");
        from[at..at + 8].try_into().unwrap()
    };
    run_dispatch(t, &q, bias, c, subgroups, |row0, col0, sweep| {
        let mut tile_halves = vec![0u16; t.tile_halves];
        let mut acc = accumulators(t, subgroups);
        for step in 0..q.k.div_ceil(t.tile_k) {
            let k0 = step * t.tile_k;
            for li in 0..t.workgroup {
                for j in 0..t.tile_m * t.tile_k / 8 / t.workgroup {
                    let qi = li + j * t.workgroup;
                    let (r, kk) = (qi / (t.tile_k / 8), (qi % (t.tile_k / 8)) * 8);
                    let halves = chunk(&ah, q.a_off + (row0 + r) * q.a_row_stride + k0 + kk);
                    tile_halves[r * t.a_stride + kk..][..8].copy_from_slice(&halves);
                }
                for j in 0..t.tile_k * t.tile_n / 8 / t.workgroup {
                    let qi = li + j * t.workgroup;
                    let (kk, n) = (qi / (t.tile_n / 8), (qi % (t.tile_n / 8)) * 8);
                    let halves = chunk(&bh, q.b_off + (k0 + kk) * q.b_row_stride + col0 + n);
                    tile_halves[t.b_tile + kk * t.b_stride + n..][..8].copy_from_slice(&halves);
                }
            }
            multiply_step(t, &q, &tile_halves, step, sweep, subgroups, &mut acc);
        }
        acc
    })
}

fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Every variant of both cooperative sizes (`CoopTile::candidates`), every layout, each B format, bias
/// and accumulation, at shapes with every kind of tile edge, against the twin; subgroup counts that
/// make several passes, one, and copies parked in the dump slot give the same C.
#[test]
fn the_kernels_addressing_computes_the_twins_product() {
    let shapes = [(3, 17, 1), (1, 1, 1), (63, 65, 17), (130, 200, 96), (129, 130, 33), (70, 260, 72)];
    // Precast variants stage exactly as their plain twins; direct and wide ones run their own loops.
    let variants: Vec<CoopTile> = [16, 8].into_iter().flat_map(CoopTile::candidates).filter(|t| t.loads != Loads::Precast).collect();
    let mut seed = 0;
    for (m, n, k) in shapes {
        let rm = MatmulShape::row_major(m, n, k);
        let layouts = [
            ("row-major", rm),
            ("A^T", MatmulShape { a: Operand::transposed(m), ..rm }),
            ("B^T", MatmulShape { b: Operand::transposed(k), ..rm }),
            (
                "windows",
                MatmulShape {
                    a: Operand { offset: 3, row_stride: k + 5, col_stride: 1 },
                    c: Operand { offset: 7, row_stride: n + 2, col_stride: 1 },
                    ..rm
                },
            ),
        ];
        for (name, s) in layouts {
            for (b_format, accumulate, with_bias) in [(0u32, false, false), (2, true, true), (1, false, true)] {
                seed += 1;
                let a = random(s.a.span(0..m, 0..k).end + 2, seed);
                // B as the kernel reads it: f32 bits, or 16-bit values packed two per word from an odd
                // element offset (the twin gets the same values as f32).
                let b_off = if b_format == 0 { s.b.offset } else { s.b.offset + 1 };
                let b_len = s.b.span(0..k, 0..n).end + 1;
                let b_values: Vec<f32> = random(b_len + 1, seed + 100)
                    .iter()
                    .map(|&x| match b_format {
                        1 => half::f16::from_f32(x).to_f32(),
                        2 => half::bf16::from_f32(x).to_f32(),
                        _ => x,
                    })
                    .collect();
                let b_words: Vec<u32> = match b_format {
                    0 => b_values.iter().map(|x| x.to_bits()).collect(),
                    _ => {
                        let bits: Vec<u16> =
                            std::iter::once(0)
                                .chain(b_values.iter().map(|&x| {
                                    if b_format == 1 { half::f16::from_f32(x).to_bits() } else { half::bf16::from_f32(x).to_bits() }
                                }))
                                .collect();
                        bits.chunks(2).map(|w| w[0] as u32 | (*w.get(1).unwrap_or(&0) as u32) << 16).collect()
                    }
                };
                let bias = random(n + 3, seed + 200);
                let c0 = random(s.c.span(0..m, 0..n).end + 4, seed + 300);
                let mut want = c0.clone();
                let bias_used = with_bias.then_some(&bias[3..]);
                matmul_f16_inputs(&mut want, &a, &b_values, bias_used, &s, accumulate);
                let p = Params {
                    m,
                    n,
                    k,
                    flags: accumulate as u32 | (with_bias as u32) << 1,
                    a_off: s.a.offset,
                    a_row_stride: s.a.row_stride,
                    a_col_stride: s.a.col_stride,
                    b_off,
                    b_row_stride: s.b.row_stride,
                    b_col_stride: s.b.col_stride,
                    b_format,
                    c_off: s.c.offset,
                    c_row_stride: s.c.row_stride,
                    bias_off: 3,
                };
                // Each variant at one subgroup count, in turn: a pass per region, several, and more
                // subgroups than regions.
                for (v, variant) in variants.iter().enumerate() {
                    let t = Tile::of(variant);
                    let subgroups = [t.regions, 2.max(t.regions / 4), 2 * t.regions][(v + seed as usize) % 3];
                    let mut got = c0.clone();
                    let run = match variant.loads {
                        Loads::Direct => run_direct,
                        Loads::Wide => run_wide,
                        Loads::Elements | Loads::Precast => run_kernel,
                    };
                    run(&t, &p, &a, &b_words, &bias, &mut got, subgroups);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-5 * (k as f32).sqrt() * (1.0 + w.abs()),
                            "{variant} {name} m={m} n={n} k={k} b_format={b_format} accumulate={accumulate} bias={with_bias}, \
                             {subgroups} subgroups: element {i}: kernel {g}, twin {w}"
                        );
                    }
                }
            }
        }
    }
}
