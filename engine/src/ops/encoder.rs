//! encoder: token + position embedding, and its backward into wte and wpe.

use rayon::prelude::*;

/// out (B*T, C) = `wte[tokens]` (V, C) + `wpe[t]` (P, C). Twin of `encoder_forward.wgsl`.
pub fn encoder_forward(out: &mut [f32], tokens: &[u32], wte: &[f32], wpe: &[f32], seq_len: usize, channels: usize) {
    let c = channels;
    out[..tokens.len() * c].par_chunks_mut(c).zip(tokens.par_iter()).enumerate().for_each(|(row, (o, &tok))| {
        let t = row % seq_len;
        let we = &wte[tok as usize * c..][..c];
        let pe = &wpe[t * c..][..c];
        for i in 0..c {
            o[i] = we[i] + pe[i];
        }
    });
}

/// Positions grouped by token, so that each gradient row has one writer (see `encoder_backward.wgsl`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenBuckets {
    /// The distinct tokens, ascending.
    pub token: Vec<u32>,
    /// `start[i]..start[i + 1]` indexes `positions` for `token[i]`; `len = token.len() + 1`.
    pub start: Vec<u32>,
    /// Every position (b * T + t), grouped by token, ascending within a group.
    pub positions: Vec<u32>,
}

impl TokenBuckets {
    pub fn new(tokens: &[u32]) -> Self {
        let mut order: Vec<u32> = (0..tokens.len() as u32).collect();
        order.sort_by_key(|&i| (tokens[i as usize], i));
        let mut buckets = TokenBuckets { positions: order, ..Default::default() };
        for (i, &pos) in buckets.positions.iter().enumerate() {
            let tok = tokens[pos as usize];
            if buckets.token.last() != Some(&tok) {
                buckets.token.push(tok);
                buckets.start.push(i as u32);
            }
        }
        buckets.start.push(tokens.len() as u32);
        buckets
    }
}

/// `dwte[token]` += sum of dout rows holding that token; `dwpe[t]` += sum over b of `dout[b, t]`.
/// Twin of `encoder_backward.wgsl` (same summation order).
pub fn encoder_backward(
    dwte: &mut [f32],
    dwpe: &mut [f32],
    dout: &[f32],
    buckets: &TokenBuckets,
    batch: usize,
    seq_len: usize,
    channels: usize,
) {
    let c = channels;
    for (i, &tok) in buckets.token.iter().enumerate() {
        let row = &mut dwte[tok as usize * c..][..c];
        for ch in 0..c {
            let mut sum = 0.0f32;
            for &pos in &buckets.positions[buckets.start[i] as usize..buckets.start[i + 1] as usize] {
                sum += dout[pos as usize * c + ch];
            }
            row[ch] += sum;
        }
    }
    dwpe[..seq_len * c].par_iter_mut().enumerate().for_each(|(i, d)| {
        let mut sum = 0.0f32;
        for b in 0..batch {
            sum += dout[b * seq_len * c + i];
        }
        *d += sum;
    });
}
