//! attention: causal self-attention over the fused qkv projection, with grouped-query heads, and its
//! backward.
//!
//! Layouts, with H query heads, G key/value heads (H a multiple of G) and head dim D:
//! qkv (B, T, (H + 2G) D) = [q (H D) | k (G D) | v (G D)], head h at columns h D of its part;
//! out (B, T, H D); lse and delta (B, H, T). Query head h attends with key/value head h / (H / G), so
//! each k and v head serves a group of H / G consecutive query heads (transformers' `repeat_kv` order)
//! and is read in place, never repeated. GPT-2's multi-head attention is G = H: qkv (B, T, 3C).
//!
//! Backward recomputes the probabilities from the saved log-sum-exp, so nothing of size (T, T) is ever
//! stored. The k and v gradients of a shared head are sums over its group's query heads, taken in head
//! order so the result is deterministic.

use anyhow::{Result, bail};
use rayon::prelude::*;

use super::MAX_GRID_DIM;
use super::dropout::DropoutMask;

/// The largest head dim the WGSL kernels take. The tiled kernels keep a row's head channels as eight
/// chunks of 32 (one `vec4` per lane and chunk, `common/attention_tiles.wgsl`); the decode kernel runs
/// one 256-lane workgroup per query row, one lane per channel.
pub const MAX_HEAD_DIM: usize = 256;
/// Query rows per workgroup of the tiled kernels' default variant, and keys per tile of every variant
/// (`ROWS` and `COLS` in `common/attention_tiles.wgsl`): the default's grids are ceil(T / BLOCK)
/// workgroups along x (a variant with fewer rows that would pass the grid limit runs the default).
pub const BLOCK: usize = 32;
/// Workgroup memory of the attention kernel that declares the most, whatever the head dim: the forward's
/// three staged 32 x 33 tiles and two 256-float arrays of per-lane maxima and sums (`attention/tests.rs`
/// reads the WGSL to keep this true). Under WebGPU's default limit of 16384 bytes.
pub const KERNEL_WORKGROUP_BYTES: usize = 14720;

/// The shape of one attention call; see the module docs for the layouts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDims {
    pub batch: usize,
    pub seq_len: usize,
    /// Query heads (H).
    pub heads: usize,
    /// Key/value heads (G); `heads` must be a multiple of it.
    pub kv_heads: usize,
    /// Channels per head (D), for queries, keys and values alike.
    pub head_dim: usize,
    /// What the scores q . k are multiplied by before the softmax: 1/sqrt(D) from the constructors; a
    /// model sets another with [`Self::with_scale`] (GPT-2's `scale_attn_weights: false` is 1). Both
    /// kernels and both twins read it from here and never recompute it.
    pub scale: f32,
    /// Dropout on the probabilities after the softmax (GPT-2's `attn_pdrop`), or none. The mask's row
    /// is (b H + h) T + t for query t of head h in batch b, its column the key.
    pub dropout: Option<DropoutMask>,
}

impl AttentionDims {
    /// GPT-2's multi-head attention: `heads` heads of `channels / heads`, each with its own k and v.
    pub fn mha(batch: usize, seq_len: usize, channels: usize, heads: usize) -> Self {
        assert!(heads > 0 && channels.is_multiple_of(heads), "attention: {channels} channels do not split into {heads} heads");
        let head_dim = channels / heads;
        AttentionDims { batch, seq_len, heads, kv_heads: heads, head_dim, scale: default_scale(head_dim), dropout: None }
    }

    /// Grouped-query attention (Llama): `heads` query heads share `kv_heads` key/value heads.
    pub fn gqa(batch: usize, seq_len: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        AttentionDims { batch, seq_len, heads, kv_heads, head_dim, scale: default_scale(head_dim), dropout: None }
    }

    /// The same shape with the scores multiplied by `scale` instead.
    pub fn with_scale(self, scale: f32) -> Self {
        AttentionDims { scale, ..self }
    }

    /// The same attention with `dropout` on its probabilities.
    pub fn with_dropout(self, dropout: Option<DropoutMask>) -> Self {
        AttentionDims { dropout, ..self }
    }

    /// What probability (query t, key j) of head h in batch b is multiplied by: the mask's 0 or
    /// 1/(1 - p), or exactly 1 without dropout. As `prob_dropout` in the WGSL kernels.
    pub fn prob_dropout(&self, b: usize, h: usize, t: usize, j: usize) -> f32 {
        match &self.dropout {
            None => 1.0,
            Some(mask) => mask.multiplier(((b * self.heads + h) * self.seq_len + t) as u32, j as u32),
        }
    }

    /// Fails, with the numbers, unless the heads split into groups and the head dim is positive.
    pub fn check(&self) -> Result<()> {
        if self.heads == 0 || self.kv_heads == 0 || self.head_dim == 0 {
            bail!("attention needs at least one head, one key/value head and one channel per head: {self:?}");
        }
        if !self.scale.is_finite() {
            bail!("attention: the score scale {} is not a finite number", self.scale);
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            bail!("attention: {} query heads do not split into groups over {} key/value heads", self.heads, self.kv_heads);
        }
        Ok(())
    }

    /// [`Self::check`], then the limits of the WGSL kernels: the head dim, the adapter's workgroup memory
    /// (`workgroup_bytes`), and one sequence's qkv within one storage binding of `max_binding_elems`
    /// floats (the gpu device splits attention by batch only).
    pub fn check_kernel_limits(&self, max_binding_elems: usize, workgroup_bytes: usize) -> Result<()> {
        self.check()?;
        // One workgroup per (block of BLOCK positions, head): both are grid dimensions, which WebGPU caps.
        if self.seq_len.div_ceil(BLOCK) > MAX_GRID_DIM || self.heads > MAX_GRID_DIM {
            bail!(
                "attention over {} positions and {} heads: the gpu kernels run one workgroup per {BLOCK} positions and \
                 head, at most {MAX_GRID_DIM} of each (lower --seq-len)",
                self.seq_len,
                self.heads
            );
        }
        if self.head_dim > MAX_HEAD_DIM {
            bail!(
                "attention head dim {} is above the {MAX_HEAD_DIM} the gpu kernels support (eight chunks of 32 channels per row)",
                self.head_dim
            );
        }
        if KERNEL_WORKGROUP_BYTES > workgroup_bytes {
            bail!(
                "the attention kernels need {KERNEL_WORKGROUP_BYTES} bytes of workgroup memory (head dims up to {MAX_HEAD_DIM}), \
                 this adapter allows {workgroup_bytes}: head dim {} cannot run on it",
                self.head_dim
            );
        }
        let sequence_elems = self.seq_len * self.qkv_width();
        if sequence_elems > max_binding_elems {
            bail!(
                "one sequence's q, k and v ({} x {} floats = {} bytes) exceed this adapter's largest storage binding ({} bytes): lower --seq-len to at most {}",
                self.seq_len,
                self.qkv_width(),
                4 * sequence_elems,
                4 * max_binding_elems,
                max_binding_elems / self.qkv_width()
            );
        }
        Ok(())
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
    /// The key/value head that query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group()
    }
    /// Floats of q in one qkv row (H D); also where k starts.
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }
    /// Floats of k, and of v, in one qkv row (G D).
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    /// Floats of one qkv row ((H + 2G) D).
    pub fn qkv_width(&self) -> usize {
        self.q_width() + 2 * self.kv_width()
    }
    /// Floats of one out row (H D).
    pub fn out_width(&self) -> usize {
        self.q_width()
    }
    /// Elements of lse, and of delta (B H T).
    pub fn stat_len(&self) -> usize {
        self.batch * self.heads * self.seq_len
    }
    fn q(&self, b: usize, t: usize, h: usize) -> usize {
        (b * self.seq_len + t) * self.qkv_width() + h * self.head_dim
    }
    /// `g` is a key/value head, as in `v`.
    fn k(&self, b: usize, t: usize, g: usize) -> usize {
        (b * self.seq_len + t) * self.qkv_width() + self.q_width() + g * self.head_dim
    }
    fn v(&self, b: usize, t: usize, g: usize) -> usize {
        self.k(b, t, g) + self.kv_width()
    }
    fn o(&self, b: usize, t: usize, h: usize) -> usize {
        (b * self.seq_len + t) * self.out_width() + h * self.head_dim
    }
    fn stat(&self, b: usize, h: usize, t: usize) -> usize {
        (b * self.heads + h) * self.seq_len + t
    }
}

/// Scaled dot-product attention's 1/sqrt(D) (Vaswani et al. 2017).
fn default_scale(head_dim: usize) -> f32 {
    1.0 / (head_dim as f32).sqrt()
}

// The kernels use fma(); so do the twins, to give the same roundings. Without the CPU's FMA
// instructions enabled at compile time `mul_add` is a slow library call, so the two inner loops are
// compiled twice and the FMA version is chosen at run time (no native builds).

/// a . b, accumulated with fused multiply-adds in index order.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked just above).
        return unsafe { dot_fma(a, b) };
    }
    dot_portable(a, b)
}

#[inline(always)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut s = 0.0f32;
    for i in 0..n {
        s = a[i].mul_add(b[i], s);
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    dot_portable(a, b)
}

/// acc += s * x elementwise, with fused multiply-adds.
pub(crate) fn axpy(acc: &mut [f32], s: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked just above).
        return unsafe { axpy_fma(acc, s, x) };
    }
    axpy_portable(acc, s, x)
}

#[inline(always)]
fn axpy_portable(acc: &mut [f32], s: f32, x: &[f32]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a = s.mul_add(*v, *a);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn axpy_fma(acc: &mut [f32], s: f32, x: &[f32]) {
    axpy_portable(acc, s, x)
}

/// out = softmax(q k^T * scale, causal) v per query head, k and v from its key/value head; lse =
/// log-sum-exp of each score row. Twin of `attention_forward.wgsl`.
pub fn attention_forward(out: &mut [f32], lse: &mut [f32], qkv: &[f32], d: AttentionDims) {
    d.check().expect("attention dims");
    let hd = d.head_dim;
    let rows: Vec<(usize, usize, usize)> =
        (0..d.batch).flat_map(|b| (0..d.heads).flat_map(move |h| (0..d.seq_len).map(move |t| (b, h, t)))).collect();
    let results: Vec<(f32, Vec<f32>)> = rows
        .par_iter()
        .map(|&(b, h, t)| {
            let g = d.kv_head(h);
            let q = &qkv[d.q(b, t, h)..][..hd];
            let scores: Vec<f32> = (0..=t).map(|j| dot(q, &qkv[d.k(b, j, g)..][..hd]) * d.scale).collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let row_lse = max + scores.iter().map(|s| (s - max).exp()).sum::<f32>().ln();
            let mut o = vec![0.0f32; hd];
            for (j, s) in scores.iter().enumerate() {
                axpy(&mut o, (s - row_lse).exp() * d.prob_dropout(b, h, t, j), &qkv[d.v(b, j, g)..][..hd]);
            }
            (row_lse, o)
        })
        .collect();
    for (&(b, h, t), (row_lse, o)) in rows.iter().zip(results) {
        lse[d.stat(b, h, t)] = row_lse;
        out[d.o(b, t, h)..][..hd].copy_from_slice(&o);
    }
}

/// dqkv (overwritten) from dout; delta (B, H, T) = rowsum(dout * out) is scratch that the GPU version
/// passes between its two entry points. The k and v gradients of a key/value head sum its group's query
/// heads in head order, as `key_value_grad` does. Twin of `attention_backward.wgsl`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(dqkv: &mut [f32], delta: &mut [f32], dout: &[f32], qkv: &[f32], out: &[f32], lse: &[f32], d: AttentionDims) {
    d.check().expect("attention dims");
    let hd = d.head_dim;
    let scale = d.scale;
    for b in 0..d.batch {
        for h in 0..d.heads {
            for t in 0..d.seq_len {
                delta[d.stat(b, h, t)] = dot(&dout[d.o(b, t, h)..][..hd], &out[d.o(b, t, h)..][..hd]);
            }
        }
    }
    let prob = |b: usize, h: usize, i: usize, j: usize| {
        (dot(&qkv[d.q(b, i, h)..][..hd], &qkv[d.k(b, j, d.kv_head(h))..][..hd]) * scale - lse[d.stat(b, h, i)]).exp()
    };
    // ds_ij = p_ij (m_ij dout_i . v_j - delta_i), the gradient of the score (before scaling), with m the
    // dropout mask (1 without dropout); delta = dout . out already holds the masked sum.
    let ds = |b: usize, h: usize, i: usize, j: usize| {
        let dov = dot(&dout[d.o(b, i, h)..][..hd], &qkv[d.v(b, j, d.kv_head(h))..][..hd]);
        prob(b, h, i, j) * (dov * d.prob_dropout(b, h, i, j) - delta[d.stat(b, h, i)])
    };
    // One task per (b, t): each writes the q, k and v gradients of its own row only.
    let (row_len, k_start, v_start) = (d.qkv_width(), d.q_width(), d.q_width() + d.kv_width());
    dqkv[..d.batch * d.seq_len * row_len].par_chunks_mut(row_len).enumerate().for_each(|(row, drow)| {
        let (b, t) = (row / d.seq_len, row % d.seq_len);
        for h in 0..d.heads {
            let mut dq = vec![0.0f32; hd];
            for j in 0..=t {
                axpy(&mut dq, ds(b, h, t, j), &qkv[d.k(b, j, d.kv_head(h))..][..hd]);
            }
            for (dst, q) in drow[h * hd..][..hd].iter_mut().zip(&dq) {
                *dst = q * scale;
            }
        }
        for g in 0..d.kv_heads {
            let (mut dk, mut dv) = (vec![0.0f32; hd], vec![0.0f32; hd]);
            for h in g * d.group()..(g + 1) * d.group() {
                for i in t..d.seq_len {
                    axpy(&mut dv, prob(b, h, i, t) * d.prob_dropout(b, h, i, t), &dout[d.o(b, i, h)..][..hd]);
                    axpy(&mut dk, ds(b, h, i, t), &qkv[d.q(b, i, h)..][..hd]);
                }
            }
            for e in 0..hd {
                drow[k_start + g * hd + e] = dk[e] * scale;
                drow[v_start + g * hd + e] = dv[e];
            }
        }
    });
}

#[cfg(test)]
mod tests;
