//! The matmul checks: every operand layout (A and B transposed or not, C strided), bias and
//! accumulation, B stored in 16 bits (f16, bf16, at odd offsets), the f16-input product, and
//! `bias_backward`. [`check_matmul`] is the seam for kernel variants: run it once per variant.

use anyhow::Result;

use super::{Check, CheckResult, Size, Tolerance, halves, random, upload};
use crate::device::{Backend, HalfFormat, MatmulInputs, MatmulShape, Operand};
use crate::ops::matmul::matmul as matmul_twin;
use crate::ops::matmul_f16::matmul_f16_inputs;

/// (m, n, k) of the f32 products (`tests/kernels.rs`'s): single elements, K = 1, every kind of edge of
/// the 128 x 128 tiles (1, 3, 17, 65, 129, 130 are multiples of neither 4 nor 8), multiples of 4 (the
/// vector loads), a long K. The quick run leaves out the two largest.
const SHAPES: [(usize, usize, usize); 10] = [
    (1, 1, 1),
    (3, 17, 1),
    (63, 65, 17),
    (65, 63, 130),
    (17, 129, 65),
    (129, 130, 3),
    (130, 200, 96),
    (1, 130, 129),
    (7, 33, 4097),
    (256, 132, 40),
];

/// (m, n, k) of the products with a 16-bit B.
const SHAPES_16BIT: [(usize, usize, usize); 6] = [(1, 1, 1), (3, 17, 65), (63, 65, 17), (129, 65, 130), (130, 200, 96), (7, 33, 4097)];

/// Rounding grows with sqrt(K): K up to 4097 of f32 products.
const TOLERANCE: Tolerance = Tolerance::close(1e-4, 1e-4);
/// The f16-input product: the same rounded inputs, only the order (and the hardware's internal
/// precision) of the f32 sums differs.
const F16_INPUTS_TOLERANCE: Tolerance = Tolerance::close(5e-4, 5e-4);

/// A product's twin: `ops::matmul::matmul`, or the f16-input one.
type Twin = fn(&mut [f32], &[f32], &[f32], Option<&[f32]>, &MatmulShape, bool);

/// The four layouts of one (m, n, k): (name, shape, with bias, accumulate).
fn layouts(m: usize, n: usize, k: usize) -> [(&'static str, MatmulShape, bool, bool); 4] {
    let row_major = MatmulShape::row_major(m, n, k);
    let strided_c = Operand { offset: 3, row_stride: n + 3, col_stride: 1 };
    [
        ("forward, bias", row_major, true, false),
        ("A^T accumulate", MatmulShape { a: Operand::transposed(m), ..row_major }, false, true),
        ("B^T into strided C", MatmulShape { b: Operand::transposed(k), c: strided_c, ..row_major }, false, false),
        ("A^T B^T bias accumulate", MatmulShape { a: Operand::transposed(m), b: Operand::transposed(k), ..row_major }, true, true),
    ]
}

fn shapes<const N: usize>(all: &[(usize, usize, usize); N], size: Size) -> &[(usize, usize, usize)] {
    &all[..size.pick(N, N - 2)]
}

/// One product on the device and through `twin`, compared; C starts as `c0` (its gaps must stay).
#[allow(clippy::too_many_arguments)]
fn compare_product<D: Backend>(
    dev: &D,
    check: &mut Check,
    twin: Twin,
    case: &str,
    (a, b, bias): (&D::Tensor, &D::Tensor, Option<&D::Tensor>),
    (a_host, b_host, bias_host): (&[f32], &[f32], Option<&[f32]>),
    c0: &[f32],
    shape: &MatmulShape,
    accumulate: bool,
) -> Result<()> {
    let c_len = shape.c.offset + (shape.m - 1) * shape.c.row_stride + shape.n;
    let c = upload(dev, &c0[..c_len])?;
    dev.matmul(&c, a, b, bias, shape, accumulate);
    let mut want = c0[..c_len].to_vec();
    twin(&mut want, a_host, b_host, bias_host, shape, accumulate);
    check.compare(case, &dev.read(&c), &want);
    Ok(())
}

/// Every layout of every shape with f32 operands, into `check`.
fn f32_layouts<D: Backend>(dev: &D, check: &mut Check, twin: Twin, size: Size) -> Result<()> {
    for (i, &(m, n, k)) in shapes(&SHAPES, size).iter().enumerate() {
        let seed = 10 * i as u64;
        let (a, b, bias, c0) =
            (random(seed, m * k, 1.0), random(seed + 1, k * n, 1.0), random(seed + 2, n, 1.0), random(seed + 3, m * (n + 3), 1.0));
        let (ta, tb, tbias) = (upload(dev, &a)?, upload(dev, &b)?, upload(dev, &bias)?);
        for (what, shape, with_bias, accumulate) in layouts(m, n, k) {
            let tensors = (&ta, &tb, with_bias.then_some(&tbias));
            let host = (&a[..], &b[..], with_bias.then_some(&bias[..]));
            compare_product(dev, check, twin, &format!("{m}x{n}x{k} {what}"), tensors, host, &c0, &shape, accumulate)?;
        }
    }
    Ok(())
}

/// B stored in 16 bits, forward and transposed, at offset 0 (vector loads where N or K allow) and at an
/// odd offset (packed words split); the twin multiplies the same values widened. Also B read back.
fn b16_layouts<D: Backend>(dev: &D, check: &mut Check, twin: Twin, size: Size) -> Result<()> {
    for (i, &(m, n, k)) in shapes(&SHAPES_16BIT, size).iter().enumerate() {
        for (format, b_offset) in [(HalfFormat::F16, 0), (HalfFormat::F16, 1), (HalfFormat::Bf16, 0), (HalfFormat::Bf16, 1)] {
            let seed = 100 + 10 * i as u64;
            let a = random(seed, m * k, 1.0);
            let bits = halves(format, &random(seed + 1, k * n + b_offset, 1.0));
            let b: Vec<f32> = bits.iter().map(|&h| format.to_f32(h)).collect();
            let (ta, tb) = (upload(dev, &a)?, dev.alloc_16bit(bits.len(), "selftest b16", format)?);
            dev.write_16bit(&tb, &bits, format)?;
            let c0 = vec![0.0; m * n];
            let forward = MatmulShape { b: Operand { offset: b_offset, row_stride: n, col_stride: 1 }, ..MatmulShape::row_major(m, n, k) };
            let transposed = MatmulShape { b: Operand { offset: b_offset, row_stride: 1, col_stride: k }, ..forward };
            for (what, shape) in [("B", forward), ("B^T", transposed)] {
                let case = format!("{m}x{n}x{k} {format:?} {what} at offset {b_offset}");
                compare_product(dev, check, twin, &case, (&ta, &tb, None), (&a, &b, None), &c0, &shape, false)?;
            }
            check.compare(&format!("{format:?} B of {} read back", bits.len()), &dev.read(&tb), &b);
        }
    }
    Ok(())
}

/// The fp32 matmul (what `dev` runs now: a variant set on it is what is checked) against
/// `ops::matmul::matmul`: `label` with f32 operands in every layout, and `label` + " 16-bit B".
pub fn check_matmul<D: Backend>(dev: &D, label: &str, size: Size) -> Result<Vec<CheckResult>> {
    let mut f32_check = Check::new(label, TOLERANCE);
    f32_layouts(dev, &mut f32_check, matmul_twin, size)?;
    let f32_result = f32_check.finish();
    let mut b16_check = Check::new(&format!("{label} 16-bit B"), TOLERANCE);
    b16_layouts(dev, &mut b16_check, matmul_twin, size)?;
    Ok(vec![f32_result, b16_check.finish()])
}

/// Puts the device's matmul back to f32 inputs when dropped (also when a check panics).
struct F32Inputs<'a, D: Backend>(&'a D);

impl<D: Backend> Drop for F32Inputs<'_, D> {
    fn drop(&mut self) {
        let _ = self.0.set_matmul_inputs(MatmulInputs::F32);
    }
}

/// The matmul under `--matmul-inputs f16` (the gpu's `matmul_coop.wgsl`, the cpu device's rounded
/// copies) against `ops::matmul_f16::matmul_f16_inputs`, every layout and 16-bit B; and that the inputs
/// really are rounded: 1 + 2^-12 is no f16 (it rounds to 1), 70000 is past its range (infinity).
pub fn check_matmul_f16_inputs<D: Backend>(dev: &D, label: &str, size: Size) -> Result<Vec<CheckResult>> {
    dev.set_matmul_inputs(MatmulInputs::F16)?;
    let _restore = F32Inputs(dev);
    let mut check = Check::new(label, F16_INPUTS_TOLERANCE);
    f32_layouts(dev, &mut check, matmul_f16_inputs, size)?;
    b16_layouts(dev, &mut check, matmul_f16_inputs, size)?;
    let mut rounding = Check::new(&format!("{label} input rounding"), Tolerance::Bits);
    let one = MatmulShape::row_major(1, 1, 1);
    for (x, want) in [(1.0 + 2f32.powi(-12), 1.0), (70000.0, f32::INFINITY)] {
        let c = upload(dev, &[0.0])?;
        dev.matmul(&c, &upload(dev, &[x])?, &upload(dev, &[1.0])?, None, &one, false);
        rounding.compare(&format!("{x} x 1"), &dev.read(&c), &[want]);
    }
    Ok(vec![check.finish(), rounding.finish()])
}

/// dbias (N) += column sums of dout (M, N), at the matmul's shapes, into a non-zero dbias.
pub fn check_bias_backward<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    let mut check = Check::new("bias_backward", TOLERANCE);
    for (i, &(m, n, _)) in shapes(&SHAPES, size).iter().enumerate() {
        let seed = 10 * i as u64;
        let (dbias0, dout) = (random(seed + 2, n, 1.0), random(seed + 3, m * n, 1.0));
        let dbias = upload(dev, &dbias0)?;
        dev.bias_backward(&dbias, &upload(dev, &dout)?, m, n);
        let mut want = dbias0;
        crate::ops::matmul::bias_backward(&mut want, &dout, m, n);
        check.compare(&format!("{m}x{n}"), &dev.read(&dbias), &want);
    }
    Ok(vec![check.finish()])
}
