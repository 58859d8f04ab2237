//! attention: causal multi-head self-attention over the fused qkv projection, and its backward.
//!
//! Layouts: qkv (B, T, 3C) with q, k, v side by side and head h at columns h*hd of each third;
//! out (B, T, C); lse and delta (B, NH, T). Backward recomputes the probabilities from the saved
//! log-sum-exp, so nothing of size (T, T) is ever stored.

use rayon::prelude::*;

#[derive(Clone, Copy, Debug)]
pub struct AttentionDims {
    pub batch: usize,
    pub seq_len: usize,
    pub channels: usize,
    pub heads: usize,
}

impl AttentionDims {
    pub fn head_dim(&self) -> usize {
        self.channels / self.heads
    }
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim() as f32).sqrt()
    }
    fn q(&self, b: usize, t: usize, h: usize) -> usize {
        (b * self.seq_len + t) * 3 * self.channels + h * self.head_dim()
    }
    fn k(&self, b: usize, t: usize, h: usize) -> usize {
        self.q(b, t, h) + self.channels
    }
    fn v(&self, b: usize, t: usize, h: usize) -> usize {
        self.q(b, t, h) + 2 * self.channels
    }
    fn o(&self, b: usize, t: usize, h: usize) -> usize {
        (b * self.seq_len + t) * self.channels + h * self.head_dim()
    }
    fn stat(&self, b: usize, h: usize, t: usize) -> usize {
        (b * self.heads + h) * self.seq_len + t
    }
}

// The kernels use fma(); so do the twins, to give the same roundings. Without the CPU's FMA
// instructions enabled at compile time `mul_add` is a slow library call, so the two inner loops are
// compiled twice and the FMA version is chosen at run time (no native builds).

/// a . b, accumulated with fused multiply-adds in index order.
fn dot(a: &[f32], b: &[f32]) -> f32 {
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
fn axpy(acc: &mut [f32], s: f32, x: &[f32]) {
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

/// out = softmax(q k^T * scale, causal) v per head; lse = log-sum-exp of each score row.
/// Twin of `attention_forward.wgsl`.
pub fn attention_forward(out: &mut [f32], lse: &mut [f32], qkv: &[f32], d: AttentionDims) {
    let hd = d.head_dim();
    let rows: Vec<(usize, usize, usize)> =
        (0..d.batch).flat_map(|b| (0..d.heads).flat_map(move |h| (0..d.seq_len).map(move |t| (b, h, t)))).collect();
    let results: Vec<(f32, Vec<f32>)> = rows
        .par_iter()
        .map(|&(b, h, t)| {
            let q = &qkv[d.q(b, t, h)..][..hd];
            let scores: Vec<f32> = (0..=t).map(|j| dot(q, &qkv[d.k(b, j, h)..][..hd]) * d.scale()).collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let row_lse = max + scores.iter().map(|s| (s - max).exp()).sum::<f32>().ln();
            let mut o = vec![0.0f32; hd];
            for (j, s) in scores.iter().enumerate() {
                axpy(&mut o, (s - row_lse).exp(), &qkv[d.v(b, j, h)..][..hd]);
            }
            (row_lse, o)
        })
        .collect();
    for (&(b, h, t), (row_lse, o)) in rows.iter().zip(results) {
        lse[d.stat(b, h, t)] = row_lse;
        out[d.o(b, t, h)..][..hd].copy_from_slice(&o);
    }
}

/// dqkv (overwritten) from dout; delta (B, NH, T) = rowsum(dout * out) is scratch that the GPU version
/// passes between its two entry points. Twin of `attention_backward.wgsl`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(dqkv: &mut [f32], delta: &mut [f32], dout: &[f32], qkv: &[f32], out: &[f32], lse: &[f32], d: AttentionDims) {
    let hd = d.head_dim();
    let scale = d.scale();
    for b in 0..d.batch {
        for h in 0..d.heads {
            for t in 0..d.seq_len {
                delta[d.stat(b, h, t)] = dot(&dout[d.o(b, t, h)..][..hd], &out[d.o(b, t, h)..][..hd]);
            }
        }
    }
    let prob = |b: usize, h: usize, i: usize, j: usize| {
        (dot(&qkv[d.q(b, i, h)..][..hd], &qkv[d.k(b, j, h)..][..hd]) * scale - lse[d.stat(b, h, i)]).exp()
    };
    // ds_ij = p_ij (dout_i . v_j - delta_i), the gradient of the score (before scaling).
    let ds = |b: usize, h: usize, i: usize, j: usize| {
        prob(b, h, i, j) * (dot(&dout[d.o(b, i, h)..][..hd], &qkv[d.v(b, j, h)..][..hd]) - delta[d.stat(b, h, i)])
    };
    // One task per (b, t): each writes the q, k and v gradients of its own row only.
    let row_len = 3 * d.channels;
    dqkv[..d.batch * d.seq_len * row_len].par_chunks_mut(row_len).enumerate().for_each(|(row, drow)| {
        let (b, t) = (row / d.seq_len, row % d.seq_len);
        for h in 0..d.heads {
            let base = h * hd;
            let (mut dq, mut dk, mut dv) = (vec![0.0f32; hd], vec![0.0f32; hd], vec![0.0f32; hd]);
            for j in 0..=t {
                axpy(&mut dq, ds(b, h, t, j), &qkv[d.k(b, j, h)..][..hd]);
            }
            for i in t..d.seq_len {
                axpy(&mut dv, prob(b, h, i, t), &dout[d.o(b, i, h)..][..hd]);
                axpy(&mut dk, ds(b, h, i, t), &qkv[d.q(b, i, h)..][..hd]);
            }
            for e in 0..hd {
                drow[base + e] = dq[e] * scale;
                drow[d.channels + base + e] = dk[e] * scale;
                drow[2 * d.channels + base + e] = dv[e];
            }
        }
    });
}
