//! How the update's f32 results become 16-bit: bf16 rounded to nearest even (the working copy, as
//! `Tensor.to(torch.bfloat16)` does), with a streaming-store form for x86, and bf16 rounded
//! stochastically (the moments of `--adam-state bf16`), with noise that depends only on where an element
//! sits in its group and on the step, so the result is the same at any world size, thread count or
//! instruction set.

use half::bf16;

/// f32 -> bf16, round to nearest even (NaN stays NaN). Branch-free so the loop vectorises.
#[inline(always)]
pub(crate) fn bf16_from_f32(x: f32) -> bf16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    bf16::from_bits(if nan { ((bits >> 16) | 0x40) as u16 } else { rounded as u16 })
}

#[inline(always)]
pub(crate) fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// Writes the bf16 copy of `src` with non-temporal stores: the copy is only ever read by the device
/// transfer, so bypassing the cache saves the read-for-ownership of every destination line (2 of the
/// 30 bytes a mixed-precision update would otherwise move per parameter). Same roundings as
/// [`bf16_from_f32`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn store_bf16_streaming(src: &[f32], out: &mut [bf16]) {
    use std::arch::x86_64::{__m256i, _mm_sfence, _mm256_packus_epi32, _mm256_permute4x64_epi64, _mm256_stream_si256};
    let n = src.len().min(out.len());
    let mut i = 0;
    while i < n && !(out[i..].as_ptr() as usize).is_multiple_of(32) {
        out[i] = bf16_from_f32(src[i]);
        i += 1;
    }
    while i + 16 <= n {
        // SAFETY: src[i..i + 16] is in bounds; out[i..i + 16] is in bounds and 32-byte aligned.
        unsafe {
            let lo = bf16_bits_x8(src[i..].as_ptr());
            let hi = bf16_bits_x8(src[i + 8..].as_ptr());
            // packus works within 128-bit lanes: (lo0 hi0 lo1 hi1) -> reorder to (lo0 lo1 hi0 hi1).
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(lo, hi));
            _mm256_stream_si256(out[i..].as_mut_ptr().cast::<__m256i>(), packed);
        }
        i += 16;
    }
    for j in i..n {
        out[j] = bf16_from_f32(src[j]);
    }
    // Order the streaming stores before anything that follows (the caller may hand the copy on).
    _mm_sfence();
}

/// Eight f32 at `src` rounded to bf16 bits (in the low half of each 32-bit lane): the vector form of
/// [`bf16_from_f32`], NaN handling included.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn bf16_bits_x8(src: *const f32) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees 8 readable floats at src.
    let bits = _mm256_castps_si256(unsafe { _mm256_loadu_ps(src) });
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)));
    let magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fff_ffff));
    let nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f80_0000));
    let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(0x40));
    _mm256_blendv_epi8(rounded, quiet, nan)
}

/// A bijective 32-bit mixer (Chris Wellons' "lowbias32" constants): consecutive inputs give outputs
/// with no visible correlation, using only 32-bit multiplies and shifts, so the noise loop vectorises.
#[inline(always)]
fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Which random stream a moment's rounding draws from: one per (step, group, moment). Element `i` of
/// the group draws `mix32(i ^ key)`, so a slice of the group draws the same noise whichever rank holds
/// it and however it is cut into chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoiseKey(u32);

impl NoiseKey {
    /// The stream of `moment` (0: first, 1: second) of `group` at AdamW step `step`, under `seed`.
    pub fn new(seed: u64, step: u64, group: u64, moment: u32) -> Self {
        let fold = |x: u64| mix32(x as u32 ^ mix32((x >> 32) as u32));
        NoiseKey(mix32(fold(seed) ^ mix32(fold(step) ^ mix32(fold(group) ^ mix32(moment.wrapping_add(0x9e37_79b9))))))
    }
    /// The noise of element `index` of the group (below 2^32: a group holds fewer elements).
    #[inline(always)]
    pub fn noise(self, index: u32) -> u32 {
        mix32(index ^ self.0)
    }
}

/// f32 -> bf16 rounded stochastically: up (away from zero) with probability equal to the fraction of
/// a bf16 ulp that truncation would drop, given 16 uniform bits of `noise`. Unbiased, so a moment
/// whose per-step change is below half a bf16 ulp (the second moment's `beta2 * v`, 0.1% of v against
/// bf16's 0.4% ulp) still moves in expectation instead of sticking. Infinities and NaN take
/// nearest-even; a finite value never rounds up to infinity (it truncates instead).
#[inline(always)]
pub(crate) fn bf16_stochastic(x: f32, noise: u32) -> u16 {
    let bits = x.to_bits();
    let up = bits.wrapping_add(noise & 0xffff) >> 16;
    let finite = (bits & 0x7f80_0000) != 0x7f80_0000;
    let overflowed = (up & 0x7f80) == 0x7f80;
    // Selects, not branches, so the loops over a chunk vectorise.
    let finite_result = if overflowed { bits >> 16 } else { up };
    (if finite { finite_result } else { bf16_from_f32(x).to_bits() as u32 }) as u16
}

/// `out[i]` = `src[i]` rounded stochastically with element `first + i`'s noise of stream `key`.
#[inline(always)]
pub(crate) fn round_stochastic_into(out: &mut [bf16], src: &[f32], key: NoiseKey, first: u32) {
    let n = out.len().min(src.len());
    let (out, src) = (&mut out[..n], &src[..n]);
    for i in 0..n {
        out[i] = bf16::from_bits(bf16_stochastic(src[i], key.noise(first.wrapping_add(i as u32))));
    }
}

/// `out` = `src` widened to f32 (exact).
#[inline(always)]
pub(crate) fn widen_into(out: &mut Vec<f32>, src: &[bf16]) {
    out.resize(src.len(), 0.0);
    let out = &mut out[..src.len()];
    for i in 0..src.len() {
        out[i] = bf16_to_f32(src[i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even_and_keeps_nan_and_inf() {
        for x in [0.0f32, -0.0, 1.0, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, 3.14158, -2.5e-3, 1e38, f32::INFINITY, f32::NEG_INFINITY, 1e-40]
        {
            assert_eq!(bf16_from_f32(x).to_bits(), bf16::from_f32(x).to_bits(), "{x}");
        }
        assert!(bf16_from_f32(f32::NAN).is_nan());
    }

    #[test]
    fn stochastic_rounding_keeps_bf16_values_and_is_unbiased_between_its_two_neighbours() {
        let key = NoiseKey::new(1, 2, 3, 0);
        for x in [1.0f32, -0.75, 2.0f32.powi(-70), 65280.0] {
            assert!((0..1000).all(|i| bf16_stochastic(x, key.noise(i)) == bf16_from_f32(x).to_bits()), "{x} is a bf16 value");
        }
        // 1 + a quarter ulp, and minus that: a quarter of the draws go one ulp away from zero.
        for x in [1.0f32 + 1.0 / 512.0, -(1.0 + 1.0 / 512.0), 0.1] {
            let (down, up) = (f32::from_bits(x.to_bits() & 0xffff_0000), f32::from_bits((x.to_bits() & 0xffff_0000) + 0x1_0000));
            let n = 1 << 16;
            let mut sum = 0.0f64;
            for i in 0..n {
                let y = f32::from_bits((bf16_stochastic(x, key.noise(i)) as u32) << 16);
                assert!(y == down || y == up, "{x} went to {y}, not {down} or {up}");
                sum += y as f64;
            }
            // The mean of 2^16 draws has a standard deviation of at most ulp/512: 0.01 ulp is 5 of them.
            let mean = sum / n as f64;
            assert!((mean - x as f64).abs() < 0.01 * (up - down).abs() as f64, "{x}: mean {mean}");
        }
        assert_eq!(bf16_stochastic(f32::INFINITY, 0xffff), 0x7f80);
        assert!(f32::from_bits((bf16_stochastic(f32::NAN, 0xffff) as u32) << 16).is_nan());
        // The largest finite f32 never rounds up to infinity.
        assert_eq!(bf16_stochastic(f32::MAX, 0xffff), 0x7f7f);
        assert_eq!(bf16_stochastic(f32::from_bits(0x7f7f_0001), 0xffff), 0x7f7f);
    }

    #[test]
    fn noise_keys_differ_by_step_group_and_moment() {
        let keys = [
            NoiseKey::new(0, 1, 0, 0),
            NoiseKey::new(0, 2, 0, 0),
            NoiseKey::new(0, 1, 1, 0),
            NoiseKey::new(0, 1, 0, 1),
            NoiseKey::new(9, 1, 0, 0),
        ];
        for (a, ka) in keys.iter().enumerate() {
            for kb in &keys[a + 1..] {
                assert_ne!(ka, kb);
                // Not merely different keys: different draws for most elements.
                assert!((0..100).filter(|&i| ka.noise(i) == kb.noise(i)).count() < 2);
            }
        }
    }
}
