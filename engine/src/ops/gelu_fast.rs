//! gelu_fast: the `cpu` device's tanh GELU, the twin [`super::gelu`]'s function with
//! [`super::fast_math::tanh`] in place of the library's (which is a call per element and does not
//! vectorise), compiled per instruction set by `simd_dispatch!`, over fixed chunks in parallel.

use rayon::prelude::*;

use super::fast_math::{self, simd_dispatch};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const COEFF: f32 = 0.044715;
/// Elements per rayon task: a fixed size, so that tasks do not depend on the thread count.
const CHUNK: usize = 16 * 1024;

#[inline(always)]
fn forward_inner(out: &mut [f32], x: &[f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = 0.5 * v * (1.0 + fast_math::tanh(SQRT_2_OVER_PI * (v + COEFF * v * v * v)));
    }
}

#[inline(always)]
fn backward_inner(dx: &mut [f32], x: &[f32], dout: &[f32]) {
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dout) {
        let th = fast_math::tanh(SQRT_2_OVER_PI * (v + COEFF * v * v * v));
        let sech2 = 1.0 - th * th;
        *d += g * (0.5 * (1.0 + th) + 0.5 * v * sech2 * SQRT_2_OVER_PI * (1.0 + 3.0 * COEFF * v * v));
    }
}

simd_dispatch!(fn forward_chunk(out: &mut [f32], x: &[f32]) => forward_inner);
simd_dispatch!(fn backward_chunk(dx: &mut [f32], x: &[f32], dout: &[f32]) => backward_inner);

/// out = gelu(x), as [`super::gelu::gelu_forward`].
pub fn gelu_forward(out: &mut [f32], x: &[f32]) {
    let n = out.len().min(x.len());
    out[..n].par_chunks_mut(CHUNK).zip(x[..n].par_chunks(CHUNK)).for_each(|(o, x)| forward_chunk(o, x));
}

/// dx += dout * gelu'(x), as [`super::gelu::gelu_backward`].
pub fn gelu_backward(dx: &mut [f32], x: &[f32], dout: &[f32]) {
    let n = dx.len().min(x.len()).min(dout.len());
    dx[..n]
        .par_chunks_mut(CHUNK)
        .zip(x[..n].par_chunks(CHUNK).zip(dout[..n].par_chunks(CHUNK)))
        .for_each(|(d, (x, g))| backward_chunk(d, x, g));
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(len: usize, seed: u64, range: f32) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-range..range)).collect()
    }

    #[test]
    fn fast_gelu_matches_twin() {
        for (len, range) in [(1, 3.0), (17, 3.0), (CHUNK + 333, 6.0), (3 * CHUNK - 5, 30.0)] {
            let x = random(len, len as u64, range);
            let dout = random(len, len as u64 + 1, 1.0);
            let (mut want, mut got) = (vec![0.0; len], vec![0.0; len]);
            crate::ops::gelu::gelu_forward(&mut want, &x);
            gelu_forward(&mut got, &x);
            for i in 0..len {
                assert!((got[i] - want[i]).abs() <= 1e-6 * (1.0 + x[i].abs()), "forward x={}: {} vs {}", x[i], got[i], want[i]);
            }
            let start = random(len, len as u64 + 2, 1.0);
            let (mut want, mut got) = (start.clone(), start);
            crate::ops::gelu::gelu_backward(&mut want, &x, &dout);
            gelu_backward(&mut got, &x, &dout);
            for i in 0..len {
                assert!((got[i] - want[i]).abs() <= 2e-6 * (1.0 + x[i].abs()), "backward x={}: {} vs {}", x[i], got[i], want[i]);
            }
        }
    }

    #[test]
    fn fast_gelu_bits_do_not_depend_on_threads() {
        let x = random(3 * CHUNK + 7, 5, 4.0);
        let run = || {
            let mut out = vec![0.0; x.len()];
            gelu_forward(&mut out, &x);
            let mut dx = vec![0.5; x.len()];
            gelu_backward(&mut dx, &x, &out);
            (out, dx)
        };
        let first = run();
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a pool").install(run);
        assert!(first.0.iter().zip(&one.0).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(first.1.iter().zip(&one.1).all(|(a, b)| a.to_bits() == b.to_bits()));
        // The plain (undispatched) code gives the same bits as the dispatched one.
        let mut plain = vec![0.0; x.len()];
        forward_inner(&mut plain, &x);
        assert!(first.0.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
