//! relu: max(x, 0) and its backward, transformers' `relu` activation.

use rayon::prelude::*;

/// out = max(x, 0). Twin of `relu_forward.wgsl`.
pub fn relu_forward(out: &mut [f32], x: &[f32]) {
    out.par_iter_mut().zip(x.par_iter()).for_each(|(o, &v)| *o = if v > 0.0 { v } else { 0.0 });
}

/// dx += dout where x > 0. At x = 0 the gradient is 0, as PyTorch's `threshold_backward` gives it.
/// Twin of `relu_backward.wgsl`.
pub fn relu_backward(dx: &mut [f32], x: &[f32], dout: &[f32]) {
    dx.par_iter_mut().zip(x.par_iter().zip(dout.par_iter())).for_each(|(d, (&v, &g))| {
        if v > 0.0 {
            *d += g;
        }
    });
}
