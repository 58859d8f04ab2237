//! Exact sums of squares of f32 values, for the global gradient norm clipping divides by: the same
//! bits whatever splits the values and in whatever order the parts are added, so a norm taken over
//! ranks' slices equals one taken over the whole at any world size. The price is speed: about 0.7 ns
//! a value on one core against 0.13 for eight f64 lanes (benches/results/2026-11-29-world-size-bits.md),
//! which is why LAMB's and LARS's per-tensor norms, two per parameter in the update's own pass,
//! keep the lanes.
//!
//! An f32 `x` with exponent field `e` is `m * 2^(e - 150)` with an integer `m < 2^24` (subnormals
//! read as `e = 1` without the implicit bit), so `x^2 = m^2 * 2^(2e - 300)` with `m^2 < 2^48`: the
//! squares of one exponent add exactly as integers. [`SquareSums`] keeps one integer per exponent;
//! adding two of them is integer addition (associative), and [`SquareSums::to_f64`] rounds once per
//! exponent, in a fixed order.

use rayon::prelude::*;

/// Values per task: 2^16 squares below 2^48 each still fit a u64 per exponent.
const TASK_ELEMS: usize = 1 << 16;

/// Interleaved histograms per task: consecutive values of one exponent (the usual case) add into
/// different ones, so the additions do not wait on each other through memory.
const LANES: usize = 4;

/// The exact sum of squares of a set of f32 values, one integer per exponent (see the module doc).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SquareSums {
    /// `by_exponent[e]`: the sum of `m^2` over the values of exponent field `e` (1..=254); entry 0
    /// counts NaNs and entry 255 infinities.
    by_exponent: Box<[u128; 256]>,
}

impl Default for SquareSums {
    fn default() -> Self {
        SquareSums { by_exponent: Box::new([0; 256]) }
    }
}

impl SquareSums {
    /// The exact sum of squares of `x`, on rayon's threads (the bits never depend on how many).
    pub fn of(x: &[f32]) -> Self {
        let add = |mut sums: SquareSums, task: &[f32]| {
            sums.add_squares(task, 1.0);
            sums
        };
        x.par_chunks(TASK_ELEMS).fold(Self::default, add).reduce(Self::default, |mut a, b| {
            a.add(&b);
            a
        })
    }

    /// The exact sum of squares of the f32 products `x[i] * scale`, on this thread.
    pub fn of_scaled(x: &[f32], scale: f32) -> Self {
        let mut out = Self::default();
        out.add_squares(x, scale);
        out
    }

    /// Adds the squares of the f32 products `x[i] * scale`, on this thread.
    pub fn add_squares(&mut self, x: &[f32], scale: f32) {
        for task in x.chunks(TASK_ELEMS) {
            self.by_exponent.iter_mut().zip(task_sums(task, scale)).for_each(|(o, s)| *o += s as u128);
        }
    }

    /// Adds `other`'s values to these (exactly).
    pub fn add(&mut self, other: &SquareSums) {
        self.by_exponent.iter_mut().zip(other.by_exponent.iter()).for_each(|(a, b)| *a += b);
    }

    /// The sum as f64: NaN if any value was NaN, else infinity if any was infinite, else each
    /// exponent's integer rounded to f64 and scaled (exactly, by a power of two), added from the
    /// smallest exponent up.
    pub fn to_f64(&self) -> f64 {
        if self.by_exponent[0] > 0 {
            return f64::NAN;
        }
        if self.by_exponent[255] > 0 {
            return f64::INFINITY;
        }
        (1..255).map(|e| self.by_exponent[e] as f64 * f64::from_bits(((2 * e as u64 + 1023) - 300) << 52)).sum()
    }

    /// Words of [`Self::to_words`].
    pub const WORDS: usize = 512;

    /// As little-endian u64 words (two per exponent), for the ranks to exchange.
    pub fn to_words(&self) -> Vec<u64> {
        self.by_exponent.iter().flat_map(|&s| [s as u64, (s >> 64) as u64]).collect()
    }

    /// The inverse of [`Self::to_words`].
    pub fn from_words(words: &[u64]) -> Self {
        assert_eq!(words.len(), Self::WORDS, "SquareSums::from_words: 2 words per exponent");
        let mut out = Self::default();
        out.by_exponent.iter_mut().zip(words.chunks_exact(2)).for_each(|(o, w)| *o = w[0] as u128 | (w[1] as u128) << 64);
        out
    }
}

/// At most [`TASK_ELEMS`] values' sums, in u64: the lanes' together stay below 2^16 * 2^48. Without
/// branches: NaNs are counted apart (entry 0), and infinity and NaN both land in entry 255.
fn task_sums(x: &[f32], scale: f32) -> [u64; 256] {
    let mut lanes = [[0u64; 256]; LANES];
    let mut nan = false;
    let mut add = |lane: &mut [u64; 256], v: f32| {
        let bits = (v * scale).to_bits() & 0x7fff_ffff;
        let e = bits >> 23;
        let normal = u32::from(e != 0);
        // Subnormals (e = 0) are m * 2^(1 - 150) without the implicit bit: entry 1's scale.
        let (slot, m) = ((e | (normal ^ 1)) as usize, (bits & 0x7f_ffff | normal << 23) as u64);
        lane[slot] += m * m;
        nan |= bits > 0x7f80_0000;
    };
    let whole = x.chunks_exact(LANES);
    let tail = whole.remainder();
    for values in whole {
        for (lane, &v) in lanes.iter_mut().zip(values) {
            add(lane, v);
        }
    }
    for &v in tail {
        add(&mut lanes[0], v);
    }
    let mut sums = lanes[0];
    for lane in &lanes[1..] {
        sums.iter_mut().zip(lane).for_each(|(s, l)| *s += l);
    }
    sums[0] += u64::from(nan);
    sums
}

#[cfg(test)]
mod tests {
    use super::SquareSums;

    /// Against f64 sums of squares (which are exact here: integers times one power of two, or few
    /// values), and independent of how the values are split and of their order; subnormals, NaN
    /// and infinity.
    #[test]
    fn sums_are_exact_and_independent_of_the_split() {
        // Integers below 2^20 at one scale: their squares' f64 sum is exact below 2^53.
        let x: Vec<f32> = (0..70_001u32).map(|i| ((i * 7919) % 1000) as f32 * 0.125 * if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
        let exact: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        assert_eq!(SquareSums::of(&x).to_f64(), exact);
        // Values over the whole range: every split and order gives the same bits.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // Every exponent field but 255 (infinity and NaN), both signs.
        let mut y: Vec<f32> = (0..200_003).map(|_| f32::from_bits(next() as u32)).filter(|v| v.is_finite()).collect();
        y.extend([f32::from_bits(1), f32::from_bits(0x007f_ffff), 0.0, -0.0, f32::MAX, f32::MIN_POSITIVE]);
        let whole = SquareSums::of(&y);
        for parts in [2usize, 3, 7, 64] {
            let mut sum = SquareSums::default();
            for part in y.chunks(y.len().div_ceil(parts)).rev() {
                sum.add(&SquareSums::of(part));
            }
            assert_eq!(sum, whole, "{parts} parts");
        }
        let mut reversed = y.clone();
        reversed.reverse();
        assert_eq!(SquareSums::of(&reversed).to_f64().to_bits(), whole.to_f64().to_bits());
        assert_eq!(SquareSums::from_words(&whole.to_words()), whole);
        assert_eq!(SquareSums::of_scaled(&y, 1.0), whole, "one thread, tasks in order");
        let halves: Vec<f32> = x.iter().map(|v| v * 0.5).collect();
        assert_eq!(SquareSums::of_scaled(&x, 0.5), SquareSums::of(&halves), "scaled");
        // A few values far apart: the f64 sum of the smallest first is exact to f64's precision.
        let few = [3.0f32, 1e-30, 2.5e-41, 1e20];
        let want = few.iter().map(|&v| v as f64 * v as f64).fold(0.0, |a, b| a + b);
        let got = SquareSums::of(&few).to_f64();
        assert!((got - want).abs() <= want * 1e-15, "{got} vs {want}");
        assert!(SquareSums::of(&[1.0, f32::INFINITY]).to_f64().is_infinite());
        assert!(SquareSums::of(&[f32::NAN, f32::INFINITY]).to_f64().is_nan());
    }
}
