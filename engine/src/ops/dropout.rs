//! dropout (Srivastava et al. 2014): each element kept with probability 1 - p and scaled by 1/(1 - p),
//! or zeroed. Masks come from a counter-based hash, never from stored state: element (row, col) of the
//! mask is a pure function of a 64-bit key and its coordinates, so the cpu device and every GPU draw the
//! same mask, backward (or a recomputed forward) regenerates it instead of keeping it, and a resumed
//! run draws what the uninterrupted one would have. The key comes from the seed, the step, the global
//! micro-batch index (the training contract's, so the world size does not change it), the block and
//! the site ([`DropoutKeys`]).
//!
//! Twin of `dropout.wgsl` and `dropout_residual.wgsl`; `common/dropout_mask.wgsl` is [`DropoutMask::bits`].

use rayon::prelude::*;

/// Which dropout of the model a mask belongs to (part of the key, so sites never share a mask).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropoutSite {
    /// After the token + position embedding (GPT-2's `embd_pdrop`).
    Embedding = 1,
    /// On the attention probabilities (`attn_pdrop`).
    AttentionProbs = 2,
    /// On the attention block's output projection, before the residual add (`resid_pdrop`).
    AttentionOutput = 3,
    /// On the MLP's output projection, before the residual add (`resid_pdrop`).
    MlpOutput = 4,
}

/// One mask: its key, the threshold below which a 32-bit draw drops the element, and the scale of kept
/// elements. Built only for p > 0 ([`DropoutMask::new`]); "no dropout" is `None` at every call site, so
/// a run without dropout executes exactly the kernels it did before dropout existed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutMask {
    pub key: [u32; 2],
    /// An element is dropped when its draw is below this: round(p 2^32), at least 1.
    pub threshold: u32,
    /// 1/(1 - p) in f32, what kept elements are multiplied by.
    pub scale: f32,
}

/// lowbias32 (Wellons' integer hash): a bijection of u32 with good avalanche; WGSL has the same ops.
#[inline(always)]
fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// splitmix64's finaliser, for deriving keys on the host.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl DropoutMask {
    /// The mask of probability `p` under `key`; `None` when p is 0 (nothing dropped).
    pub fn new(p: f64, key: u64) -> Option<Self> {
        assert!((0.0..1.0).contains(&p), "dropout probability {p} outside [0, 1): the config check was skipped");
        if p == 0.0 {
            return None;
        }
        let threshold = (p * 4_294_967_296.0).round().clamp(1.0, u32::MAX as f64) as u32;
        Some(DropoutMask { key: [key as u32, (key >> 32) as u32], threshold, scale: (1.0 / (1.0 - p)) as f32 })
    }

    /// The 32-bit draw of element (row, col).
    #[inline(always)]
    pub fn bits(&self, row: u32, col: u32) -> u32 {
        mix32(mix32(mix32(col ^ self.key[1]) ^ row).wrapping_add(self.key[0]))
    }

    /// What element (row, col) is multiplied by: 0 (dropped) or the scale (kept).
    #[inline(always)]
    pub fn multiplier(&self, row: u32, col: u32) -> f32 {
        if self.bits(row, col) < self.threshold { 0.0 } else { self.scale }
    }
}

/// The dropout of one micro-batch: the model's probabilities and the counters the masks are keyed by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutKeys {
    pub rates: DropoutRates,
    pub seed: u64,
    pub step: u64,
    /// The global micro-batch index of the training contract.
    pub micro_batch: u64,
}

/// A model's dropout probabilities, by transformers' names.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DropoutRates {
    pub embd: f64,
    pub attn: f64,
    pub resid: f64,
}

impl DropoutRates {
    pub fn is_zero(&self) -> bool {
        self.embd == 0.0 && self.attn == 0.0 && self.resid == 0.0
    }
}

impl DropoutKeys {
    /// The mask of `site` in block `block` (0 for the embedding), `None` where its probability is 0.
    pub fn mask(&self, block: usize, site: DropoutSite) -> Option<DropoutMask> {
        let p = match site {
            DropoutSite::Embedding => self.rates.embd,
            DropoutSite::AttentionProbs => self.rates.attn,
            DropoutSite::AttentionOutput | DropoutSite::MlpOutput => self.rates.resid,
        };
        let mut key = mix64(self.seed ^ 0x6472_6f70_6f75_7421); // "dropout!"
        for counter in [self.step, self.micro_batch, block as u64, site as u64] {
            key = mix64(key ^ counter);
        }
        DropoutMask::new(p, key)
    }
}

/// out = x * mask, x and out (rows, cols) row-major: element i is (i / cols, i % cols) of the mask.
/// Twin of `dropout.wgsl`.
pub fn dropout(out: &mut [f32], x: &[f32], cols: usize, mask: &DropoutMask) {
    let n = out.len().min(x.len());
    out[..n].par_iter_mut().zip(&x[..n]).enumerate().with_min_len(4096).for_each(|(i, (o, v))| {
        *o = v * mask.multiplier((i / cols) as u32, (i % cols) as u32);
    });
}

/// out = residual + x * mask (layouts as in [`dropout`]). Twin of `dropout_residual.wgsl`.
pub fn dropout_residual(out: &mut [f32], residual: &[f32], x: &[f32], cols: usize, mask: &DropoutMask) {
    let n = out.len().min(x.len()).min(residual.len());
    out[..n].par_iter_mut().zip(&residual[..n]).zip(&x[..n]).enumerate().with_min_len(4096).for_each(|(i, ((o, r), v))| {
        *o = r + v * mask.multiplier((i / cols) as u32, (i % cols) as u32);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_drop_about_p_and_scale_the_rest() {
        for p in [0.1, 0.5, 0.9] {
            let mask = DropoutMask::new(p, 0x1234_5678_9abc_def0).unwrap();
            let (rows, cols) = (300u32, 257u32);
            let dropped = (0..rows).flat_map(|r| (0..cols).map(move |c| (r, c))).filter(|&(r, c)| mask.multiplier(r, c) == 0.0).count();
            let fraction = dropped as f64 / (rows * cols) as f64;
            // 77k draws: the standard deviation of the fraction is below 0.002.
            assert!((fraction - p).abs() < 0.01, "p {p}: dropped {fraction}");
            assert_eq!(mask.scale, (1.0 / (1.0 - p)) as f32);
        }
        assert!(DropoutMask::new(0.0, 7).is_none());
    }

    #[test]
    fn keys_differ_by_every_counter_and_site() {
        let rates = DropoutRates { embd: 0.1, attn: 0.1, resid: 0.1 };
        let base = DropoutKeys { rates, seed: 1, step: 2, micro_batch: 3 };
        let k = |d: DropoutKeys, block, site| d.mask(block, site).unwrap().key;
        let reference = k(base, 4, DropoutSite::MlpOutput);
        assert_eq!(reference, k(base, 4, DropoutSite::MlpOutput), "a pure function of its counters");
        for other in [
            k(DropoutKeys { seed: 9, ..base }, 4, DropoutSite::MlpOutput),
            k(DropoutKeys { step: 9, ..base }, 4, DropoutSite::MlpOutput),
            k(DropoutKeys { micro_batch: 9, ..base }, 4, DropoutSite::MlpOutput),
            k(base, 5, DropoutSite::MlpOutput),
            k(base, 4, DropoutSite::AttentionOutput),
        ] {
            assert_ne!(reference, other);
        }
        // Rows and columns both move the draw: neighbouring masks are not shifted copies.
        let m = base.mask(0, DropoutSite::Embedding).unwrap();
        let row0: Vec<bool> = (0..64).map(|c| m.multiplier(0, c) == 0.0).collect();
        let row1: Vec<bool> = (0..64).map(|c| m.multiplier(1, c) == 0.0).collect();
        let shifted: Vec<bool> = (1..65).map(|c| m.multiplier(0, c) == 0.0).collect();
        assert_ne!(row0, row1);
        assert_ne!(row1, shifted);
    }

    #[test]
    fn dropout_residual_is_residual_plus_dropout() {
        let mask = DropoutMask::new(0.3, 42).unwrap();
        let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
        let r: Vec<f32> = (0..1000).map(|i| (i % 13) as f32).collect();
        let (mut d, mut dr) = (vec![0.0; 1000], vec![0.0; 1000]);
        dropout(&mut d, &x, 37, &mask);
        dropout_residual(&mut dr, &r, &x, 37, &mask);
        for i in 0..1000 {
            assert_eq!(dr[i], r[i] + d[i]);
            let kept = mask.multiplier((i / 37) as u32, (i % 37) as u32) != 0.0;
            assert_eq!(d[i], if kept { x[i] * mask.scale } else { 0.0 });
        }
    }
}
