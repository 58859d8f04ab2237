// Shared by the exact-GELU kernels (prepended to their source).

// erf(x) for |x| < 1: its Taylor series to x^23 (1.1283791670955126 = 2 / sqrt(pi)). Twin: erf_series in ops/gelu_erf.rs.
fn erf_series(x: f32) -> f32 {
    let x2 = x * x;
    return x * (1.1283791670955126 + x2 * (-0.37612638903183754 + x2 * (0.11283791670955126 + x2 * (-0.026866170645131252 + x2 * (0.005223977625442188 + x2 * (-0.0008548327023450852 + x2 * (0.00012055332981789664 + x2 * (-1.492565035840625e-05 + x2 * (1.6462114365889246e-06 + x2 * (-1.6365844691234924e-07 + x2 * (1.4807192815879218e-08 + x2 * (-1.2290555301717926e-09))))))))))));
}

// erfc(x) = 1 - erf(x) (WGSL has no erf): the series for |x| < 1, else Numerical Recipes' Chebyshev fit
// t exp(-z^2 + P(t)), t = 1 / (1 + z/2), z = |x|, relative error below 1.2e-7. Twin: erfc in
// ops/gelu_erf.rs (same coefficients, same order).
fn erfc(x: f32) -> f32 {
    let z = abs(x);
    if (z < 1.0) { return 1.0 - erf_series(x); }
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let r = t * exp(-z * z + p);
    return select(2.0 - r, r, x >= 0.0);
}

// Phi(x), the standard normal CDF, as erfc(-x / sqrt 2) / 2: accurate in the negative tail, where
// (1 + erf) / 2 would cancel.
fn normal_cdf(x: f32) -> f32 {
    return 0.5 * erfc(-x * 0.7071067811865476);
}
