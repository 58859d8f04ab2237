//! gelu: Hugging Face's `gelu_new`, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its backward.

use rayon::prelude::*;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const COEFF: f32 = 0.044715;

/// out = gelu(x). Twin of `gelu_forward.wgsl`.
pub fn gelu_forward(out: &mut [f32], x: &[f32]) {
    out.par_iter_mut().zip(x.par_iter()).for_each(|(o, &v)| {
        *o = 0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + COEFF * v * v * v)).tanh());
    });
}

/// dx += dout * gelu'(x). Twin of `gelu_backward.wgsl`.
pub fn gelu_backward(dx: &mut [f32], x: &[f32], dout: &[f32]) {
    dx.par_iter_mut().zip(x.par_iter().zip(dout.par_iter())).for_each(|(d, (&v, &g))| {
        let th = (SQRT_2_OVER_PI * (v + COEFF * v * v * v)).tanh();
        let sech2 = 1.0 - th * th;
        *d += g * (0.5 * (1.0 + th) + 0.5 * v * sech2 * SQRT_2_OVER_PI * (1.0 + 3.0 * COEFF * v * v));
    });
}
