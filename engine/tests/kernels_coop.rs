//! `matmul_coop.wgsl` (f16 inputs on cooperative matrices, f32 sums) against its twin
//! `ops::matmul_f16::matmul_f16_inputs`, at the awkward shapes of the fp32 matmul's tests (every kind of
//! edge of the variants' 64- and 128-wide tiles and 32- and 64-deep K steps), every operand layout, f32 and 16-bit B, with bias and accumulation,
//! also with 64 KiB bindings (K split into accumulating pieces, windows at odd offsets); and every variant
//! of the adapter's cooperative size against the default, bit for bit.
//!
//! Runs where the adapter lists a 16x16x16 or 8x8x8 f16 -> f32 configuration (NVIDIA; Mesa 26's lavapipe,
//! which CI runs in a Debian 13 root: `.ci/coop-lavapipe`); elsewhere (the Debian 12 lavapipe)
//! it says that it skipped the comparison and checks instead that f16 inputs are refused, naming the
//! adapter, and that the fp32 kernel stays the path. An adapter is still required under
//! ZEROSTREAM_REQUIRE_GPU=1.

mod common;

use common::kernel_check::tensor;
use common::{assert_close, coop_skipped, gpu_or_skip, random};
use zerostream::device::{Backend, GpuDevice, HalfFormat, MatmulInputs, MatmulShape, Operand};
use zerostream::ops::matmul_f16::matmul_f16_inputs;
use zerostream_shaders::Loads;

/// (m, n, k): single elements, K = 1, edges of every tile dimension, a K that needs splitting under
/// 64 KiB bindings.
const SHAPES: [(usize, usize, usize); 9] =
    [(1, 1, 1), (3, 17, 1), (63, 65, 17), (65, 63, 130), (17, 129, 65), (129, 130, 3), (130, 200, 96), (7, 33, 4097), (256, 132, 40)];

/// One product on the GPU and through the twin: `b` is given as f32 values (already 16-bit values when
/// `format` is set, so the twin sees what the GPU holds).
#[allow(clippy::too_many_arguments)]
fn compare_one(
    gpu: &GpuDevice,
    what: &str,
    a: &[f32],
    b: &[f32],
    format: Option<HalfFormat>,
    bias: Option<&[f32]>,
    c0: &[f32],
    s: &MatmulShape,
    accumulate: bool,
) {
    let ta = tensor(gpu, a);
    let tb = match format {
        None => tensor(gpu, b),
        Some(f) => {
            let bits: Vec<u16> = match f {
                HalfFormat::F16 => b.iter().map(|x| half::f16::from_f32(*x).to_bits()).collect(),
                HalfFormat::Bf16 => b.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect(),
            };
            let t = gpu.alloc_16bit(bits.len(), "b16", f).unwrap();
            gpu.write_16bit(&t, &bits, f).unwrap();
            t
        }
    };
    let tbias = bias.map(|v| tensor(gpu, v));
    let tc = tensor(gpu, c0);
    gpu.matmul(&tc, &ta, &tb, tbias.as_ref(), s, accumulate);
    let got = gpu.read(&tc);
    let mut want = c0.to_vec();
    matmul_f16_inputs(&mut want, a, b, bias, s, accumulate);
    // The same rounded inputs; only the order (and the hardware's internal precision) of the f32 sums
    // differs. The f16 rounding itself would move elements by ~2^-11 of their magnitude.
    assert_close(what, &got, &want, 5e-4, 5e-4);
}

/// Every shape of [`SHAPES`] (but those with K above `max_k`) in every layout, against the twin.
fn compare_all(gpu: &GpuDevice, label: &str, max_k: usize) {
    for (i, &(m, n, k)) in SHAPES.iter().enumerate().filter(|(_, s)| s.2 <= max_k) {
        let seed = 900 + 10 * i as u64;
        let a = random(seed, m * k, 1.0);
        let b = random(seed + 1, k * n, 1.0);
        let bias = random(seed + 2, n, 1.0);
        let c0 = random(seed + 3, m * (n + 3), 1.0);
        let what = |case: &str| format!("matmul_coop {m}x{n}x{k} {case} ({label})");
        let row_major = MatmulShape::row_major(m, n, k);
        compare_one(gpu, &what("forward, bias"), &a, &b, None, Some(&bias), &c0[..m * n], &row_major, false);
        let a_t = MatmulShape { a: Operand::transposed(m), ..row_major };
        compare_one(gpu, &what("A^T accumulate"), &a, &b, None, None, &c0[..m * n], &a_t, true);
        let b_t_strided_c =
            MatmulShape { b: Operand::transposed(k), c: Operand { offset: 3, row_stride: n + 3, col_stride: 1 }, ..row_major };
        compare_one(gpu, &what("B^T strided C"), &a, &b, None, None, &c0, &b_t_strided_c, false);
        let both_t = MatmulShape { a: Operand::transposed(m), b: Operand::transposed(k), ..row_major };
        compare_one(gpu, &what("A^T B^T bias accumulate"), &a, &b, None, Some(&bias), &c0[..m * n], &both_t, true);
        for format in [HalfFormat::F16, HalfFormat::Bf16] {
            // B's values as the 16-bit tensor holds them, at an odd offset (packed words split).
            let b16: Vec<f32> = (0..k * n + 1)
                .map(|j| b.get(j).copied().unwrap_or(0.5))
                .map(|x| match format {
                    HalfFormat::F16 => half::f16::from_f32(x).to_f32(),
                    HalfFormat::Bf16 => half::bf16::from_f32(x).to_f32(),
                })
                .collect();
            let shape = MatmulShape { b: Operand { offset: 1, row_stride: 1, col_stride: k }, ..row_major };
            compare_one(gpu, &what(&format!("{format:?} B^T at offset 1")), &a, &b16, Some(format), None, &c0[..m * n], &shape, false);
        }
    }
    // The inputs really are rounded: 1 + 2^-12 is not an f16 (it rounds to 1), 70000 is past its range.
    let one = MatmulShape::row_major(1, 1, 1);
    for (x, want) in [(1.0 + 2f32.powi(-12), 1.0), (70000.0, f32::INFINITY)] {
        let c = tensor(gpu, &[0.0]);
        gpu.matmul(&c, &tensor(gpu, &[x]), &tensor(gpu, &[1.0]), None, &one, false);
        assert_eq!(gpu.read(&c)[0], want, "matmul_coop: {x} x 1 ({label})");
    }
}

#[test]
fn matmul_coop_matches_twin() {
    let Some(gpu) = gpu_or_skip("matmul_coop_matches_twin") else { return };
    if !gpu.has_coop_matmul() {
        coop_skipped("matmul_coop_matches_twin", &gpu);
        // Then f16 inputs are refused, naming the adapter and the flag, and nothing changes.
        let err = format!("{:#}", gpu.set_matmul_inputs(MatmulInputs::F16).unwrap_err());
        assert!(err.contains("--matmul-inputs f16") && err.contains(&gpu.summary().name), "{err}");
        assert_eq!(gpu.matmul_path(), zerostream::device::gpu::MATMUL_PATH);
        return;
    }
    gpu.set_matmul_inputs(MatmulInputs::F16).unwrap();
    assert_eq!(gpu.matmul_path(), zerostream::device::gpu::MATMUL_COOP_PATH);
    compare_all(&gpu, "whole bindings", usize::MAX);
    let mut small = gpu_or_skip("matmul_coop_matches_twin").unwrap();
    small.limit_binding_bytes_for_tests(64 << 10);
    small.set_matmul_inputs(MatmulInputs::F16).unwrap();
    compare_all(&small, "64 KiB bindings", usize::MAX);
    // A precast variant there too: its operands' spans rounded into the scratch piece by piece (not at K =
    // 4097, whose thousands of pieces the default's pass above already walks).
    let precast = small.coop_variants().into_iter().find(|t| t.loads == Loads::Precast).expect("a precast variant");
    small.force_coop_variant(Some(precast)).unwrap();
    compare_all(&small, &format!("64 KiB bindings, {precast}"), 1024);
    // A direct variant likewise: operands packed piece by piece where a piece's packing fits a binding,
    // the staged kernel (same bits) where it does not.
    let direct = small.coop_variants().into_iter().find(|t| t.loads == Loads::Direct).expect("a direct variant");
    small.force_coop_variant(Some(direct)).unwrap();
    compare_all(&small, &format!("64 KiB bindings, {direct}"), 1024);
}

/// Every variant of the adapter's cooperative size gives the default's bits, in every layout, with a bias,
/// accumulating, with a 16-bit B: a tuner's choice never changes a result.
#[test]
fn matmul_coop_variants_give_the_default_bits() {
    let Some(gpu) = gpu_or_skip("matmul_coop_variants_give_the_default_bits") else { return };
    let variants = gpu.coop_variants();
    if variants.is_empty() {
        coop_skipped("matmul_coop_variants_give_the_default_bits", &gpu);
        assert!(!gpu.has_coop_matmul());
        return;
    }
    assert!(variants.len() >= 3, "{variants:?}");
    gpu.set_matmul_inputs(MatmulInputs::F16).unwrap();
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        let seed = 1900 + 10 * i as u64;
        let (a, b, bias, c0) =
            (random(seed, m * k, 1.0), random(seed + 1, k * n, 1.0), random(seed + 2, n, 1.0), random(seed + 3, m * n, 1.0));
        let b16: Vec<u16> = b.iter().map(|x| half::f16::from_f32(*x).to_bits()).collect();
        let both_t = MatmulShape { a: Operand::transposed(m), b: Operand::transposed(k), ..MatmulShape::row_major(m, n, k) };
        for (layout, s) in [("nn", MatmulShape::row_major(m, n, k)), ("tt", both_t)] {
            for b_format in [None, Some(HalfFormat::F16)] {
                let run = |variant| {
                    gpu.force_coop_variant(Some(variant)).unwrap();
                    let tb = match b_format {
                        None => tensor(&gpu, &b),
                        Some(f) => {
                            let t = gpu.alloc_16bit(b16.len(), "b16", f).unwrap();
                            gpu.write_16bit(&t, &b16, f).unwrap();
                            t
                        }
                    };
                    let c = tensor(&gpu, &c0);
                    gpu.matmul(&c, &tensor(&gpu, &a), &tb, Some(&tensor(&gpu, &bias)), &s, true);
                    gpu.read(&c)
                };
                let want = run(variants[0]);
                for &variant in &variants[1..] {
                    let got = run(variant);
                    let differ = got.iter().zip(&want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
                    assert_eq!(
                        differ, 0,
                        "{variant} against {}: {m}x{n}x{k} {layout} B {b_format:?}: {differ} elements differ",
                        variants[0]
                    );
                }
            }
        }
    }
    gpu.force_coop_variant(None).unwrap();
}
