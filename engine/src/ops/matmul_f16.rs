//! The f16-input matmul (`train --matmul-inputs f16`): C = A @ B [+ bias] [+ C] with every element of A and
//! B first rounded to f16 (nearest, ties to even; past 65504 infinity), the products summed in f32. The
//! plain-Rust twin of `matmul_coop.wgsl` (which rounds exactly so, then multiplies on cooperative
//! matrices), and what the cpu device runs under `--matmul-inputs f16`.
//!
//! The rounded operands are copies of the spans the product touches, handed to a matmul of f32 inputs:
//! the twin to [`super::matmul::matmul`], the cpu device to [`super::matmul_fast::matmul`].

use super::matmul::{MatmulShape, Operand};

/// `x` rounded to the nearest f16 (ties to even), as an f32 (exact).
pub fn round_to_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// The elements `op` touches for rows `rows` x cols `cols`, rounded to f16, and the operand that addresses
/// them in the copy.
fn rounded_span(values: &[f32], op: &Operand, rows: usize, cols: usize) -> (Vec<f32>, Operand) {
    let span = op.span(0..rows, 0..cols);
    let copy = values[span.clone()].iter().map(|&v| round_to_f16(v)).collect();
    (copy, Operand { offset: op.offset - span.start, ..*op })
}

/// C = round16(A) @ round16(B) (+ bias) (+ C if `accumulate`) through `matmul`, a product of f32 inputs
/// with the signature of [`super::matmul::matmul`].
pub fn matmul_rounded_with(
    matmul: impl FnOnce(&mut [f32], &[f32], &[f32], Option<&[f32]>, &MatmulShape, bool),
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    s: &MatmulShape,
    accumulate: bool,
) {
    let (a16, a_op) = rounded_span(a, &s.a, s.m, s.k);
    let (b16, b_op) = rounded_span(b, &s.b, s.k, s.n);
    matmul(c, &a16, &b16, bias, &MatmulShape { a: a_op, b: b_op, ..*s }, accumulate);
}

/// The twin: C = round16(A) @ round16(B) (+ bias) (+ C if `accumulate`), sums in f32.
pub fn matmul_f16_inputs(c: &mut [f32], a: &[f32], b: &[f32], bias: Option<&[f32]>, s: &MatmulShape, accumulate: bool) {
    matmul_rounded_with(super::matmul::matmul, c, a, b, bias, s, accumulate);
}

/// An operand's source for [`pack_f16`]: f32 values, or halves (f16 or bf16) as stored.
#[derive(Clone, Copy, Debug)]
pub enum PackSource<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Bf16(&'a [u16]),
}

/// Where [`pack_f16`] puts a `rows` x `cols` operand: row-major `[rows_pad][cols_pad]`, zero outside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedShape {
    pub rows: usize,
    pub cols: usize,
    pub rows_pad: usize,
    pub cols_pad: usize,
}

/// The twin of `pack_f16.wgsl`: the operand `op` addresses in `x` (rows x cols), rounded to f16 bits as
/// [`round_to_f16`] rounds (an f16 source as stored, a bf16 one widened first), row-major in
/// `rows_pad` x `cols_pad` halves and zero outside the operand. What the direct cooperative-matrix matmul
/// multiplies.
pub fn pack_f16(x: PackSource, op: &Operand, shape: &PackedShape) -> Vec<u16> {
    assert!(shape.rows <= shape.rows_pad && shape.cols <= shape.cols_pad, "pack_f16: {shape:?} pads to less than the operand");
    let mut out = vec![0u16; shape.rows_pad * shape.cols_pad];
    for r in 0..shape.rows {
        for col in 0..shape.cols {
            let i = op.at(r, col);
            out[r * shape.cols_pad + col] = match x {
                PackSource::F32(v) => half::f16::from_f32(v[i]).to_bits(),
                PackSource::F16(h) => h[i],
                PackSource::Bf16(h) => half::f16::from_f32(half::bf16::from_bits(h[i]).to_f32()).to_bits(),
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matmul::matmul;
    use rand::{Rng, SeedableRng};

    /// A transposed, offset operand packed with padding: the elements where they belong, rounded, zeros
    /// around them; the three sources agree where their values do.
    #[test]
    fn pack_places_rounds_and_pads() {
        let x: Vec<f32> = (0..20).map(|i| i as f32 + 1.0 / 4096.0).collect(); // 1/4096 rounds away above 1 (under half an ulp)
        let op = Operand { offset: 2, row_stride: 1, col_stride: 3 }; // (r, c) at 2 + r + 3c: a transpose
        let shape = PackedShape { rows: 3, cols: 4, rows_pad: 4, cols_pad: 8 };
        let packed = pack_f16(PackSource::F32(&x), &op, &shape);
        assert_eq!(packed.len(), 32);
        for r in 0..4 {
            for c in 0..8 {
                let want = if r < 3 && c < 4 { half::f16::from_f32((2 + r + 3 * c) as f32).to_bits() } else { 0 };
                assert_eq!(packed[r * 8 + c], want, "({r}, {c})");
            }
        }
        let f16s: Vec<u16> = x.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
        let bf16s: Vec<u16> = x.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        assert_eq!(pack_f16(PackSource::F16(&f16s), &op, &shape), packed);
        assert_eq!(pack_f16(PackSource::Bf16(&bf16s), &op, &shape), packed);
    }

    #[test]
    fn rounding_is_nearest_even_with_overflow_to_infinity() {
        assert_eq!(round_to_f16(1.0 + 2f32.powi(-12)), 1.0); // a tie below: to even
        assert_eq!(round_to_f16(1.0 + 3.0 * 2f32.powi(-12)), 1.0 + 2f32.powi(-10)); // a tie above: to even
        assert_eq!(round_to_f16(65504.0), 65504.0);
        assert_eq!(round_to_f16(65519.0), 65504.0);
        assert_eq!(round_to_f16(65520.0), f32::INFINITY);
        assert_eq!(round_to_f16(-1e6), f32::NEG_INFINITY);
        assert_eq!(round_to_f16(2f32.powi(-24)), 2f32.powi(-24)); // the smallest subnormal
        assert_eq!(round_to_f16(2f32.powi(-25)), 0.0); // a tie with zero: to even
    }

    /// Against the fp32 twin on strided operands (a transposed B, windows at offsets), with and without
    /// bias and accumulation: the difference is within the f16 rounding of the inputs, element by element
    /// (|x16 y16 - x y| <= (2u + u^2) |x y| with u = 2^-11, plus both sums' f32 rounding), and not zero.
    #[test]
    fn within_f16_rounding_of_the_fp32_product() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        for &(m, n, k) in &[(1, 1, 1), (5, 7, 3), (33, 17, 129), (64, 96, 200)] {
            for (accumulate, with_bias) in [(false, false), (true, true)] {
                let a: Vec<f32> = (0..3 + m * k).map(|_| rng.random_range(-2.0..2.0)).collect();
                let b: Vec<f32> = (0..k * n + 5).map(|_| rng.random_range(-2.0..2.0)).collect();
                let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
                let c0: Vec<f32> = (0..m * n).map(|_| rng.random_range(-1.0..1.0)).collect();
                let s = MatmulShape {
                    m,
                    n,
                    k,
                    a: Operand { offset: 3, row_stride: k, col_stride: 1 },
                    b: Operand { offset: 0, row_stride: 1, col_stride: k }, // B^T stored (n, k)
                    c: Operand::row_major(n),
                };
                let bias = with_bias.then_some(bias.as_slice());
                let (mut c16, mut c32) = (c0.clone(), c0.clone());
                matmul_f16_inputs(&mut c16, &a, &b, bias, &s, accumulate);
                matmul(&mut c32, &a, &b, bias, &s, accumulate);
                let u = 2f64.powi(-11);
                let mut differs = false;
                for r in 0..m {
                    for col in 0..n {
                        let abs_sum: f64 = (0..k).map(|i| (a[s.a.at(r, i)] as f64 * b[s.b.at(i, col)] as f64).abs()).sum();
                        let init = if accumulate { c0[r * n + col].abs() as f64 } else { 0.0 } + bias.map_or(0.0, |v| v[col].abs() as f64);
                        let bound = abs_sum * (2.0 * u + u * u) + (abs_sum + init) * 2.0 * (k as f64 + 2.0) * 2f64.powi(-24);
                        let diff = (c16[r * n + col] as f64 - c32[r * n + col] as f64).abs();
                        assert!(diff <= bound, "({m},{n},{k}) C[{r},{col}]: |{} - {}| > {bound}", c16[r * n + col], c32[r * n + col]);
                        differs |= diff > 0.0;
                    }
                }
                assert!(differs || m * n * k == 1, "({m},{n},{k}): no element changed: were the inputs rounded?");
            }
        }
    }

    #[test]
    fn inputs_are_rounded_before_the_product() {
        // 1 + 2^-12 is not an f16: it rounds to 1, so the product is exactly 1 (fp32: 1 + 2^-12).
        let mut c = [0.0f32];
        matmul_f16_inputs(&mut c, &[1.0 + 2f32.powi(-12)], &[1.0], None, &MatmulShape::row_major(1, 1, 1), false);
        assert_eq!(c[0], 1.0);
        // Past f16's range: infinity, as the kernel's inputs would be.
        matmul_f16_inputs(&mut c, &[70000.0], &[1.0], None, &MatmulShape::row_major(1, 1, 1), false);
        assert_eq!(c[0], f32::INFINITY);
    }
}
