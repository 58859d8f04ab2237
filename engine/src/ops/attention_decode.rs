//! attention_decode: causal attention of new query rows against a key/value cache, for generation with
//! a KV cache (one sequence).
//!
//! Layouts, with H query heads, G key/value heads and head dim D as in [`super::attention`]:
//! qkv (n, (H + 2G) D) = [q | k | v] of the n new tokens, at positions past .. past + n;
//! cache (capacity, 2 G D), row t = [k_t (G D) | v_t (G D)] (the k and v parts of qkv row t, side by
//! side); out (n, H D). The op first copies the new rows' k and v into cache rows past .. past + n, then
//! new row i attends over cache rows 0 ..= past + i, query head h with key/value head h / (H / G).
//!
//! The arithmetic is [`super::attention::attention_forward`]'s, step for step (the same fused dot
//! products, maximum, log-sum-exp and weighted sum, in the same order), so a cached step gives the
//! bits a full recompute of the same k and v gives on the cpu device. The gpu kernel instead runs
//! `attention_forward.wgsl`'s tiled online softmax (their shared `common/attention_rows.wgsl`), so there
//! too a cached step gives the full recompute's bits (the two devices differ from each other by
//! rounding, as for every kernel). The kernel's head dim and workgroup memory are the forward's
//! ([`super::attention::MAX_HEAD_DIM`], checked against the WGSL in `attention/tests.rs`).

use anyhow::{Result, bail};
use rayon::prelude::*;

use super::attention::{AttentionDims, axpy, dot};

/// The shape of one decode call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeDims {
    /// The new rows' attention: batch 1, `seq_len` new rows, the heads, head dim and score scale.
    pub attn: AttentionDims,
    /// Rows already in the cache: the new rows are positions past .. past + rows.
    pub past: usize,
    /// Rows the cache holds.
    pub capacity: usize,
}

impl DecodeDims {
    pub fn new(attn: AttentionDims, past: usize, capacity: usize) -> Self {
        DecodeDims { attn, past, capacity }
    }
    /// New rows (n).
    pub fn rows(&self) -> usize {
        self.attn.seq_len
    }
    /// Floats of one cache row (2 G D).
    pub fn cache_width(&self) -> usize {
        2 * self.attn.kv_width()
    }
    /// Floats of the whole cache (capacity x 2 G D).
    pub fn cache_len(&self) -> usize {
        self.capacity * self.cache_width()
    }

    /// Fails, with the numbers, unless the heads are consistent, there is one sequence and the new rows
    /// fit in the cache after the past ones.
    pub fn check(&self) -> Result<()> {
        self.attn.check()?;
        if self.attn.batch != 1 {
            bail!("decode attention runs one sequence, not a batch of {}", self.attn.batch);
        }
        if self.past + self.rows() > self.capacity {
            bail!("decode attention: {} cached + {} new rows do not fit a cache of {} rows", self.past, self.rows(), self.capacity);
        }
        Ok(())
    }

    /// [`Self::check`], then the limits of the WGSL kernel: the head dim, the workgroup memory, and one
    /// layer's cache within one storage binding of `max_binding_elems` floats (it is not split).
    pub fn check_kernel_limits(&self, max_binding_elems: usize, workgroup_bytes: usize) -> Result<()> {
        self.check()?;
        // The new rows are split across dispatches as needed; one row must fit a binding.
        AttentionDims { seq_len: 1, ..self.attn }.check_kernel_limits(max_binding_elems, workgroup_bytes)?;
        if self.cache_len() > max_binding_elems {
            bail!(
                "one layer's key/value cache ({} rows x {} floats = {} bytes) exceeds this adapter's largest storage binding ({} bytes): \
                 at most {} positions fit",
                self.capacity,
                self.cache_width(),
                4 * self.cache_len(),
                4 * max_binding_elems,
                max_binding_elems / self.cache_width()
            );
        }
        Ok(())
    }
}

/// Appends the new rows' k and v to `cache`, then out = softmax(q k^T * scale, causal) v over the cached
/// rows. Twin of `attention_decode.wgsl` (`append`, then `main`).
pub fn attention_decode(out: &mut [f32], cache: &mut [f32], qkv: &[f32], d: DecodeDims) {
    d.check().expect("decode attention dims");
    let a = d.attn;
    let (hd, n, width) = (a.head_dim, d.rows(), d.cache_width());
    for i in 0..n {
        let src = &qkv[i * a.qkv_width() + a.q_width()..][..width];
        cache[(d.past + i) * width..][..width].copy_from_slice(src);
    }
    let cache = &*cache;
    let rows: Vec<(usize, usize)> = (0..n).flat_map(|i| (0..a.heads).map(move |h| (i, h))).collect();
    let results: Vec<Vec<f32>> = rows
        .par_iter()
        .map(|&(i, h)| {
            let g = a.kv_head(h);
            let q = &qkv[i * a.qkv_width() + h * hd..][..hd];
            let key = |j: usize| &cache[j * width + g * hd..][..hd];
            let value = |j: usize| &cache[j * width + a.kv_width() + g * hd..][..hd];
            let last = d.past + i;
            let scores: Vec<f32> = (0..=last).map(|j| dot(q, key(j)) * a.scale).collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let row_lse = max + scores.iter().map(|s| (s - max).exp()).sum::<f32>().ln();
            let mut o = vec![0.0f32; hd];
            for (j, s) in scores.iter().enumerate() {
                axpy(&mut o, (s - row_lse).exp(), value(j));
            }
            o
        })
        .collect();
    for (&(i, h), o) in rows.iter().zip(results) {
        out[i * a.out_width() + h * hd..][..hd].copy_from_slice(&o);
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::ops::attention::attention_forward;

    fn random(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.5..1.5)).collect()
    }

    /// Feeding a sequence in pieces (a prompt, then one row at a time, then the rest) gives the full
    /// causal attention's rows bit for bit, and fills the cache with every row's k and v.
    #[test]
    fn pieces_against_the_cache_equal_full_attention() {
        for (seed, (t, heads, kv_heads, hd)) in
            [(9, 1, 1, 1), (17, 6, 2, 5), (33, 4, 4, 16), (70, 8, 1, 3), (5, 3, 3, 64)].into_iter().enumerate()
        {
            let full = AttentionDims::gqa(1, t, heads, kv_heads, hd).with_scale(0.37);
            let qkv = random(seed as u64, t * full.qkv_width());
            let (mut want, mut lse) = (vec![0.0; t * full.out_width()], vec![0.0; full.stat_len()]);
            attention_forward(&mut want, &mut lse, &qkv, full);
            let capacity = t + 3;
            let mut cache = vec![f32::NAN; capacity * 2 * full.kv_width()];
            let cuts = [0, t / 3, t / 3 + 1, t / 3 + 2, t];
            for w in cuts.windows(2) {
                let (past, n) = (w[0], w[1] - w[0]);
                if n == 0 {
                    continue;
                }
                let d = DecodeDims::new(AttentionDims { seq_len: n, ..full }, past, capacity);
                let mut out = vec![f32::NAN; n * full.out_width()];
                attention_decode(&mut out, &mut cache, &qkv[past * full.qkv_width()..][..n * full.qkv_width()], d);
                assert_eq!(out, want[past * full.out_width()..][..n * full.out_width()], "t {t}, rows {past}..{}", past + n);
            }
            for r in 0..t {
                assert_eq!(
                    cache[r * 2 * full.kv_width()..][..2 * full.kv_width()],
                    qkv[r * full.qkv_width() + full.q_width()..][..2 * full.kv_width()]
                );
            }
        }
    }

    #[test]
    fn rows_past_the_cache_and_batches_are_refused_with_the_numbers() {
        let attn = AttentionDims::gqa(1, 3, 4, 2, 8);
        assert!(DecodeDims::new(attn, 5, 8).check().is_ok());
        let err = DecodeDims::new(attn, 6, 8).check().unwrap_err().to_string();
        assert!(err.contains("6 cached + 3 new rows") && err.contains("8 rows"), "{err}");
        assert!(DecodeDims::new(AttentionDims { batch: 2, ..attn }, 0, 8).check().is_err());
        let err = DecodeDims::new(attn, 0, 100).check_kernel_limits(1000, 1 << 15).unwrap_err().to_string();
        assert!(err.contains("key/value cache") && err.contains("at most 31 positions"), "{err}");
    }
}
