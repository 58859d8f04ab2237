//! gelu_erf: the exact GELU, x Phi(x) with Phi the standard normal CDF, transformers' `gelu` (PyTorch's
//! `F.gelu` without approximation), and its backward.
//!
//! WGSL has no erf, so the kernels and these twins share one approximation of erfc (`common/erfc.wgsl`):
//! for |x| < 1 erf's Taylor series to x^23 (truncation below 1e-9), else Numerical Recipes' Chebyshev
//! fit, erfc(z) = t exp(-z^2 + P(t)) with t = 1 / (1 + z/2), whose relative error is below 1.2e-7 for
//! every z >= 0 (the fit alone would cost erf about 3e-7 near 0, where erfc is near 1). Phi(x) is taken as
//! erfc(-x / sqrt 2) / 2 rather than (1 + erf(x / sqrt 2)) / 2, which keeps its relative accuracy in the
//! negative tail instead of cancelling to 0.

use rayon::prelude::*;

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 1 / sqrt(2 pi), the standard normal density at 0.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// erfc(x) = 1 - erf(x), to about 1.2e-7 relative (see the module docs). Twin of `common/erfc.wgsl`.
// The coefficients are written as published, and as the kernel has them. rustfmt is kept off these
// nested polynomials: its search over their layouts took minutes of `cargo fmt --check` in CI.
#[allow(clippy::excessive_precision)]
#[rustfmt::skip]
pub fn erfc(x: f32) -> f32 {
    let z = x.abs();
    if z < 1.0 {
        return 1.0 - erf_series(x);
    }
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07 + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * (-z * z + p).exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// erf(x): the series near 0 (where 1 - erfc would lose its relative accuracy), else 1 - erfc(x).
pub fn erf(x: f32) -> f32 {
    if x.abs() < 1.0 { erf_series(x) } else { 1.0 - erfc(x) }
}

/// erf(x) for |x| < 1: 2/sqrt(pi) sum_n (-1)^n x^(2n+1) / (n! (2n + 1)) to n = 11. Twin of
/// `erf_series` in `common/erfc.wgsl`.
#[allow(clippy::excessive_precision)]
#[rustfmt::skip]
fn erf_series(x: f32) -> f32 {
    let x2 = x * x;
    x * (std::f32::consts::FRAC_2_SQRT_PI
        + x2 * (-0.37612638903183754
            + x2 * (0.11283791670955126
                + x2 * (-0.026866170645131252
                    + x2 * (0.005223977625442188
                        + x2 * (-0.0008548327023450852
                            + x2 * (0.00012055332981789664
                                + x2 * (-1.492565035840625e-05
                                    + x2 * (1.6462114365889246e-06
                                        + x2 * (-1.6365844691234924e-07
                                            + x2 * (1.4807192815879218e-08 + x2 * (-1.2290555301717926e-09))))))))))))
}

/// Phi(x), the standard normal CDF.
fn normal_cdf(x: f32) -> f32 {
    0.5 * erfc(-x * FRAC_1_SQRT_2)
}

/// out = x Phi(x). Twin of `gelu_erf_forward.wgsl`.
pub fn gelu_erf_forward(out: &mut [f32], x: &[f32]) {
    out.par_iter_mut().zip(x.par_iter()).for_each(|(o, &v)| *o = v * normal_cdf(v));
}

/// dx += dout * (Phi(x) + x phi(x)), phi the normal density. Twin of `gelu_erf_backward.wgsl`.
pub fn gelu_erf_backward(dx: &mut [f32], x: &[f32], dout: &[f32]) {
    dx.par_iter_mut().zip(x.par_iter().zip(dout.par_iter())).for_each(|(d, (&v, &g))| {
        let pdf = FRAC_1_SQRT_2PI * (-0.5 * v * v).exp();
        *d += g * (normal_cdf(v) + v * pdf);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf in f64 by its Taylor series (accurate to ~1e-12 for |x| <= 3).
    fn erf_series(x: f64) -> f64 {
        let (mut term, mut sum) = (x, x);
        for n in 1..200 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    /// erfc in f64 by its continued fraction (accurate for x >= 2).
    fn erfc_continued_fraction(x: f64) -> f64 {
        let mut f = x;
        for n in (1..300).rev() {
            f = x + (n as f64 / 2.0) / f;
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / f
    }

    #[test]
    fn erf_is_float32_accurate() {
        // Absolute error on [-3, 3], where erf crosses from -1 to 1.
        for i in -3000..=3000 {
            let x = i as f32 / 1000.0;
            let err = (erf(x) as f64 - erf_series(x as f64)).abs();
            assert!(err < 2e-7, "erf({x}): error {err:.2e}");
        }
        // Relative error of erfc in the tail, where 1 - erf would have cancelled.
        for i in 200..=900 {
            let x = i as f32 / 100.0;
            let want = erfc_continued_fraction(x as f64);
            let rel = ((erfc(x) as f64 - want) / want).abs();
            // Bounded by the f32 rounding of z^2 in exp(-z^2 + P): half an ulp of 81 is 4e-6 of exp's value.
            assert!(rel < 1e-5, "erfc({x}): relative error {rel:.2e}");
        }
        assert_eq!((erfc(f32::INFINITY), erfc(f32::NEG_INFINITY), erfc(-1e4)), (0.0, 2.0, 2.0));
    }

    #[test]
    fn gelu_erf_gradient_is_the_derivative() {
        for i in -80..=80 {
            let x = i as f32 / 10.0;
            let (mut lo, mut hi) = ([0.0f32], [0.0f32]);
            let h = 1e-2;
            gelu_erf_forward(&mut lo, &[x - h]);
            gelu_erf_forward(&mut hi, &[x + h]);
            let mut d = [0.0f32];
            gelu_erf_backward(&mut d, &[x], &[1.0]);
            let numeric = (hi[0] - lo[0]) / (2.0 * h);
            assert!((d[0] - numeric).abs() < 1e-3, "gelu'({x}) = {} vs {numeric}", d[0]);
        }
    }
}
