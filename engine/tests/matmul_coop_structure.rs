//! `matmul_coop.wgsl`'s addressing run on the CPU, statement for statement: the workgroup grid, the
//! per-invocation staging of A and B into the f16 tiles (`a_element`, `b_element`, both operand
//! orientations, every B format), the subgroups' regions and passes (4, 8 and 16 subgroups: several
//! passes, one pass, and copies parked in the dump slot), the cooperative loads (row-major, with the
//! tiles' strides), the staging slots of the epilogue and `write_c` — with only the 16 x 16 cooperative
//! multiply-add itself replaced by plain f32 sums. Compared with the twin (`matmul_f16_inputs`), it checks
//! every index of the kernel on any machine; `tests/kernels_coop.rs` checks the kernel itself where an
//! adapter has cooperative matrices (none here). Keep it in step with the WGSL.

use rand::{Rng, SeedableRng};
use zerostream::device::{MatmulShape, Operand};
use zerostream::ops::matmul_f16::matmul_f16_inputs;

const TILE_M: usize = 128;
const TILE_N: usize = 128;
const TILE_K: usize = 32;
const A_STRIDE: usize = 40;
const B_STRIDE: usize = 136;
const REGIONS: usize = 8;
const DUMP_SLOT: usize = 8;
/// Where A's and B's tiles start in the kernel's one f16 workgroup array, `tile_halves`.
const A_TILE: usize = 0;
const B_TILE: usize = 5120;
/// Where the subgroup count sits in `c_stage`, after the staging slots.
const COUNT_SLOT: usize = 2304;
/// A cooperative load or store needs a 16-byte aligned address and row stride (Vulkan's rule; NVIDIA's
/// driver read shifted elements when the tiles sat 4 bytes off). The kernel's two workgroup arrays are
/// each a multiple of 16 bytes long (the shaders crate's tests), so any packing starts them aligned; here
/// every offset into them is checked.
const COOP_ALIGN_BYTES: usize = 16;

/// The kernel's Params (flags bit 0 accumulate, bit 1 bias; b_format 0 f32, 1 f16, 2 bf16).
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

fn a_element(p: &Params, a: &[f32], row0: usize, k0: usize, idx: usize) -> (usize, u16) {
    let along_m = p.a_row_stride == 1 && p.a_col_stride != 1;
    let (r, kk) = if along_m { (idx % TILE_M, idx / TILE_M) } else { (idx / TILE_K, idx % TILE_K) };
    (r * A_STRIDE + kk, a_half(p, a, row0 + r, k0 + kk))
}

fn b_element(p: &Params, b: &[u32], k0: usize, col0: usize, idx: usize) -> (usize, u16) {
    let along_k = p.b_row_stride == 1 && p.b_col_stride != 1;
    let (kk, n) = if along_k { (idx % TILE_K, idx / TILE_K) } else { (idx / TILE_N, idx % TILE_N) };
    (kk * B_STRIDE + n, b_half(p, b, k0 + kk, col0 + n))
}

/// coopLoadT: a row-major 16 x 16 tile at `base` with `stride` elements between rows.
fn coop_load(tile: &[u16], base: usize, stride: usize) -> [[f32; 16]; 16] {
    assert!(
        (base * 2).is_multiple_of(COOP_ALIGN_BYTES) && (stride * 2).is_multiple_of(COOP_ALIGN_BYTES),
        "coopLoadT at {base}, stride {stride}"
    );
    let mut m = [[0.0; 16]; 16];
    for (i, row) in m.iter_mut().enumerate() {
        for (j, x) in row.iter_mut().enumerate() {
            *x = half::f16::from_bits(tile[base + i * stride + j]).to_f32();
        }
    }
    m
}

fn multiply_add(a: &[[f32; 16]; 16], b: &[[f32; 16]; 16], acc: &mut [[f32; 16]; 16]) {
    for i in 0..16 {
        for j in 0..16 {
            acc[i][j] += (0..16).map(|k| a[i][k] * b[k][j]).sum::<f32>();
        }
    }
}

/// The whole dispatch (every workgroup of the host's grid) with `subgroups` subgroups per workgroup.
fn run_kernel(p: &Params, a: &[f32], b: &[u32], bias: &[f32], c: &mut [f32], subgroups: usize) {
    for wg_y in 0..p.m.div_ceil(TILE_M) {
        for wg_x in 0..p.n.div_ceil(TILE_N) {
            let (row0, col0) = (wg_y * TILE_M, wg_x * TILE_N);
            let (mut tile_halves, mut c_stage) = (vec![0u16; 9472], vec![0.0f32; COUNT_SLOT + 4]);
            c_stage[COUNT_SLOT] = subgroups as f32; // read back once, by every invocation
            let passes = REGIONS.div_ceil(subgroups);
            for sweep in 0..passes {
                // Per subgroup: its eight accumulators (acc00..acc03, acc10..acc13).
                let mut acc = vec![[[[0.0f32; 16]; 16]; 8]; subgroups];
                for t in 0..p.k.div_ceil(TILE_K) {
                    for li in 0..256 {
                        for j in 0..16 {
                            let (at, av) = a_element(p, a, row0, t * TILE_K, li + 256 * j);
                            tile_halves[A_TILE + at] = av;
                            let (bt, bv) = b_element(p, b, t * TILE_K, col0, li + 256 * j);
                            tile_halves[B_TILE + bt] = bv;
                        }
                    }
                    for kk in (0..TILE_K).step_by(16) {
                        for (sg, acc) in acc.iter_mut().enumerate() {
                            let region = (sweep * subgroups + sg) % REGIONS;
                            let (a_base, b_base) = (A_TILE + (region / 2) * 32 * A_STRIDE, B_TILE + (region % 2) * 64);
                            let a_rows = [
                                coop_load(&tile_halves, a_base + kk, A_STRIDE),
                                coop_load(&tile_halves, a_base + 16 * A_STRIDE + kk, A_STRIDE),
                            ];
                            for ti in 0..2 {
                                for tj in 0..4 {
                                    let bj = coop_load(&tile_halves, kk * B_STRIDE + b_base + 16 * tj, B_STRIDE);
                                    multiply_add(&a_rows[ti], &bj, &mut acc[ti * 4 + tj]);
                                }
                            }
                        }
                    }
                }
                let (first, end) = (sweep * subgroups, REGIONS.min(sweep * subgroups + subgroups));
                for ti in 0..2 {
                    for tj in 0..4 {
                        // flush_tile: every subgroup stores into its slot, then the workgroup writes C.
                        for (sg, acc) in acc.iter().enumerate() {
                            let g = sweep * subgroups + sg;
                            let slot = if g >= REGIONS { DUMP_SLOT } else { g % REGIONS };
                            // coopStoreT of f32 at slot * 256 with 16 between rows.
                            assert!((slot * 256 * 4).is_multiple_of(COOP_ALIGN_BYTES) && (16 * 4usize).is_multiple_of(COOP_ALIGN_BYTES));
                            for i in 0..16 {
                                for j in 0..16 {
                                    c_stage[slot * 256 + i * 16 + j] = acc[ti * 4 + tj][i][j];
                                }
                            }
                        }
                        for li in 0..256 {
                            for region in first..end {
                                let row = row0 + (region / 2) * 32 + ti * 16 + li / 16;
                                let col = col0 + (region % 2) * 64 + tj * 16 + li % 16;
                                if row >= p.m || col >= p.n {
                                    continue;
                                }
                                let i = p.c_off + row * p.c_row_stride + col;
                                let mut x = if p.flags & 1 != 0 { c[i] } else { 0.0 };
                                if p.flags & 2 != 0 {
                                    x += bias[p.bias_off + col];
                                }
                                c[i] = x + c_stage[region * 256 + li];
                            }
                        }
                    }
                }
            }
            assert_eq!(c_stage[COUNT_SLOT], subgroups as f32, "the staging slots overran the subgroup count");
        }
    }
}

fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Every layout, each B format, bias and accumulation, at shapes with every kind of tile edge, against
/// the twin; 4, 8 and 16 subgroups give the same C.
#[test]
fn the_kernels_addressing_computes_the_twins_product() {
    let shapes = [(3, 17, 1), (1, 1, 1), (63, 65, 17), (130, 200, 96), (129, 130, 33)];
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
                for subgroups in [8, 4, 16] {
                    let mut got = c0.clone();
                    run_kernel(&p, &a, &b_words, &bias, &mut got, subgroups);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-5 * (k as f32).sqrt() * (1.0 + w.abs()),
                            "{name} m={m} n={n} k={k} b_format={b_format} accumulate={accumulate} bias={with_bias}, \
                             {subgroups} subgroups: element {i}: kernel {g}, twin {w}"
                        );
                    }
                }
            }
        }
    }
}
