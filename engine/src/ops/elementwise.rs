//! Small elementwise utilities: residual add, fill, axpy, sum of squares, f32 <-> f16 casts.

use rayon::prelude::*;

/// out = a + b. Twin of `residual_forward.wgsl`.
pub fn residual_forward(out: &mut [f32], a: &[f32], b: &[f32]) {
    out.par_iter_mut().zip(a.par_iter().zip(b.par_iter())).for_each(|(o, (x, y))| *o = x + y);
}

/// x = value. Twin of `fill.wgsl`.
pub fn fill(x: &mut [f32], value: f32) {
    x.par_iter_mut().for_each(|v| *v = value);
}

/// y = alpha * x + beta * y. Twin of `axpy.wgsl`.
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32], beta: f32) {
    y.par_iter_mut().zip(x.par_iter()).for_each(|(y, x)| *y = alpha * x + beta * *y);
}

/// Elements per partial sum, as in `sum_squares.wgsl`.
pub const SUM_SQUARES_GROUP: usize = 4096;

/// Sum of x^2: f32 partial sums over groups of 4096 elements, added in f64. Twin of `sum_squares.wgsl`.
pub fn sum_squares(x: &[f32]) -> f64 {
    x.par_chunks(SUM_SQUARES_GROUP).map(|g| g.iter().fold(0.0f32, |s, v| v.mul_add(*v, s)) as f64).collect::<Vec<_>>().iter().sum()
}

/// f32 -> f16 bits, round to nearest even. Twin of `cast_f32_to_f16.wgsl` (which packs two per word).
pub fn cast_f32_to_f16(out: &mut [u16], x: &[f32]) {
    out.par_iter_mut().zip(x.par_iter()).for_each(|(o, v)| *o = half::f16::from_f32(*v).to_bits());
}

/// bf16 bits -> f32 (exact). Twin of `cast_half_to_f32.wgsl` (format 1).
pub fn cast_bf16_to_f32(out: &mut [f32], x: &[u16]) {
    out.par_iter_mut().zip(x.par_iter()).for_each(|(o, v)| *o = half::bf16::from_bits(*v).to_f32());
}

/// f16 bits -> f32 (exact). Twin of `cast_half_to_f32.wgsl` (format 0).
pub fn cast_f16_to_f32(out: &mut [f32], x: &[u16]) {
    out.par_iter_mut().zip(x.par_iter()).for_each(|(o, v)| *o = half::f16::from_bits(*v).to_f32());
}
