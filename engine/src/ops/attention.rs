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

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |s, (x, y)| x.mul_add(*y, s))
}

/// out = softmax(q k^T * scale, causal) v per head; lse = log-sum-exp of each score row.
/// Twin of `attention_forward.wgsl`.
pub fn attention_forward(out: &mut [f32], lse: &mut [f32], qkv: &[f32], d: AttentionDims) {
    let hd = d.head_dim();
    let rows: Vec<(usize, usize, usize)> = (0..d.batch)
        .flat_map(|b| (0..d.heads).flat_map(move |h| (0..d.seq_len).map(move |t| (b, h, t))))
        .collect();
    let results: Vec<(f32, Vec<f32>)> = rows
        .par_iter()
        .map(|&(b, h, t)| {
            let q = &qkv[d.q(b, t, h)..][..hd];
            let scores: Vec<f32> = (0..=t).map(|j| dot(q, &qkv[d.k(b, j, h)..][..hd]) * d.scale()).collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let row_lse = max + scores.iter().map(|s| (s - max).exp()).sum::<f32>().ln();
            let mut o = vec![0.0f32; hd];
            for (j, s) in scores.iter().enumerate() {
                let p = (s - row_lse).exp();
                for (x, v) in o.iter_mut().zip(&qkv[d.v(b, j, h)..][..hd]) {
                    *x = p.mul_add(*v, *x);
                }
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
pub fn attention_backward(
    dqkv: &mut [f32],
    delta: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    out: &[f32],
    lse: &[f32],
    d: AttentionDims,
) {
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
                let s = ds(b, h, t, j);
                for (x, k) in dq.iter_mut().zip(&qkv[d.k(b, j, h)..][..hd]) {
                    *x = s.mul_add(*k, *x);
                }
            }
            for i in t..d.seq_len {
                let (p, s) = (prob(b, h, i, t), ds(b, h, i, t));
                for e in 0..hd {
                    dv[e] = p.mul_add(dout[d.o(b, i, h) + e], dv[e]);
                    dk[e] = s.mul_add(qkv[d.q(b, i, h) + e], dk[e]);
                }
            }
            for e in 0..hd {
                drow[base + e] = dq[e] * scale;
                drow[d.channels + base + e] = dk[e] * scale;
                drow[2 * d.channels + base + e] = dv[e];
            }
        }
    });
}
