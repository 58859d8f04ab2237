//! fast_math: the `cpu` fast kernels' shared pieces: an exp that vectorises (no library call per element),
//! the row sums and maps built on it, and `simd_dispatch!`, which compiles a slice kernel for AVX-512 and
//! for AVX2 + FMA and picks one at run time from the CPU it runs on (no `-C target-cpu=native` builds).
//!
//! Every version performs the same IEEE operations in the same order (fused multiply-adds written out as
//! `mul_add`, sums in [`LANES`] fixed lanes added in a fixed order), so the bits do not depend on which
//! version runs, nor on the thread count; they differ from the twins' library `exp` by an ulp or two.

/// Lanes of the partial sums in [`sum_exp_shifted`]: one AVX-512 register, two AVX2 ones.
pub const LANES: usize = 16;

/// Builds `$vis fn $name(args) -> ret`, which runs `$inner(args)` compiled with AVX-512 (F, VL) and FMA, or
/// with AVX2 and FMA, or as plain code, whichever is the best the CPU has. `$inner` must be
/// `#[inline(always)]` so that it is compiled again inside each version.
macro_rules! simd_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $inner:path) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $inner($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $inner($($arg),*)
                }
                match $crate::ops::fast_math::simd_level() {
                    // SAFETY: the CPU has the features each version is compiled with (just checked).
                    $crate::ops::fast_math::SimdLevel::Avx512 => return unsafe { avx512($($arg),*) },
                    $crate::ops::fast_math::SimdLevel::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::ops::fast_math::SimdLevel::Plain => {}
                }
            }
            $inner($($arg),*)
        }
    };
}
pub(crate) use simd_dispatch;

/// The widest instruction set [`simd_dispatch!`] may use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    Avx512,
    Avx2,
    Plain,
}

/// This CPU's [`SimdLevel`] (the standard library caches the detection).
pub fn simd_level() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512vl") && has!("avx2") && has!("fma") {
            return SimdLevel::Avx512;
        }
        if has!("avx2") && has!("fma") {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Plain
}

/// e^x to about 2 ulp, in arithmetic only (so that a loop of it vectorises): x = n ln2 + r with n an
/// integer and |r| <= ln2 / 2, e^r by its Taylor polynomial of degree 7 (truncation under 1e-8), times
/// 2^n as two powers of two built in the exponent bits (each in the normal range, so that results down
/// in the subnormals round once). Below -104 it is 0, above 88.8 infinity; NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n ln2_hi is exact for the n that occur.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 * 2^23: adding it rounds to an integer (to nearest even) and leaves the integer in the low bits.
    const ROUND: f32 = 12_582_912.0;
    let clamped = x.clamp(-104.0, 88.8);
    let shifted = clamped.mul_add(LOG2E, ROUND);
    let n = shifted - ROUND;
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, clamped));
    let mut p: f32 = 1.0 / 5040.0;
    p = p.mul_add(r, 1.0 / 720.0);
    p = p.mul_add(r, 1.0 / 120.0);
    p = p.mul_add(r, 1.0 / 24.0);
    p = p.mul_add(r, 1.0 / 6.0);
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    // n in [-150, 129]: halves in [-75, 65], each a normal power of two.
    let n_hi = n_int >> 1;
    let n_lo = n_int - n_hi;
    let pow = |k: i32| f32::from_bits(((k + 127) << 23) as u32);
    let e = p * pow(n_hi) * pow(n_lo);
    if x.is_nan() {
        x
    } else if x < -104.0 {
        0.0
    } else if x > 88.8 {
        f32::INFINITY
    } else {
        e
    }
}

/// tanh(u) = 1 - 2 / (e^(2u) + 1): exact limits (+-1 at +-infinity), absolute error about 1e-7.
#[inline(always)]
pub fn tanh(u: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * u) + 1.0)
}

/// Sum over x of e^(x - shift), in [`LANES`] partial sums added in lane order at the end.
#[inline(always)]
pub fn sum_exp_shifted_inner(x: &[f32], shift: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (acc, v) in lanes.iter_mut().zip(chunk) {
            *acc += exp(v - shift);
        }
    }
    for (acc, v) in lanes.iter_mut().zip(tail) {
        *acc += exp(v - shift);
    }
    lanes.iter().sum()
}

simd_dispatch!(
    /// Sum over x of e^(x - shift), in a fixed order (see [`sum_exp_shifted_inner`]).
    pub fn sum_exp_shifted(x: &[f32], shift: f32) -> f32 => sum_exp_shifted_inner
);

/// The largest element (-infinity for none), over [`LANES`] lanes.
#[inline(always)]
pub fn max_inner(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, v) in lanes.iter_mut().zip(chunk) {
            *m = m.max(*v);
        }
    }
    for (m, v) in lanes.iter_mut().zip(tail) {
        *m = m.max(*v);
    }
    lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

simd_dispatch!(
    /// The largest element of x (-infinity if empty).
    pub fn max(x: &[f32]) -> f32 => max_inner
);

#[inline(always)]
fn exp_affine_inner(x: &mut [f32], scale: f32, shift: f32, out_scale: f32) {
    for v in x.iter_mut() {
        *v = exp(*v * scale - shift) * out_scale;
    }
}

simd_dispatch!(
    /// x = e^(x scale - shift) * out_scale, elementwise.
    pub fn exp_affine(x: &mut [f32], scale: f32, shift: f32, out_scale: f32) => exp_affine_inner
);

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i32 - b.to_bits() as i32).unsigned_abs()
    }

    #[test]
    fn exp_is_within_a_few_ulps_of_the_library() {
        let mut x = -103.9f32;
        while x < 88.7 {
            let (got, want) = (exp(x), x.exp());
            // Subnormal results carry fewer bits: compare them absolutely.
            assert!(ulps(got, want) <= 3 || (got - want).abs() <= 3e-45, "exp({x}): {got} vs {want}");
            x += 0.0137;
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn tanh_is_close_to_the_library() {
        let mut u = -12.0f32;
        while u < 12.0 {
            assert!((tanh(u) - u.tanh()).abs() <= 3e-7, "tanh({u}): {} vs {}", tanh(u), u.tanh());
            u += 0.0071;
        }
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
    }

    #[test]
    fn row_sums_and_max_match_plain_loops() {
        for n in [0, 1, 15, 16, 17, 1000] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.07).collect();
            let want_max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max(&x), want_max, "n={n}");
            let want_sum: f64 = x.iter().map(|v| ((v - 1.5) as f64).exp()).sum();
            let got = sum_exp_shifted(&x, 1.5) as f64;
            assert!((got - want_sum).abs() <= 1e-5 * (1.0 + want_sum), "n={n}: {got} vs {want_sum}");
            // Every dispatch level gives the same bits as the plain one.
            assert_eq!(sum_exp_shifted(&x, 1.5).to_bits(), sum_exp_shifted_inner(&x, 1.5).to_bits());
        }
    }
}
