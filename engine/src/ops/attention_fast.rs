//! attention_fast: the `cpu` device's attention, the same function as the twins
//! [`super::attention::attention_forward`] and [`super::attention::attention_backward`] (causal,
//! grouped-query, dropout on the probabilities, the same layouts), computed a block of query rows at a time
//! with the `gemm` crate's run-time dispatched SIMD products for q k^T, p v and the four backward products.
//!
//! The twins recompute every probability from dot products, one query row at a time (the backward five
//! dot products per (query, key) pair); here a block of [`QUERY_BLOCK`] rows gets its scores from one
//! product, its softmax in place, and its output from a second product.
//!
//! Deterministic by construction: the tasks are fixed by the shape, never by the number of threads. The
//! forward runs one task per (batch, head, query block), each writing its own rows of its head's output.
//! The backward runs one task per (batch, key/value head): it owns that head's k and v gradients and
//! its group's q gradients, and adds the query heads of its group and their query blocks into the k and v
//! gradients in a fixed order (head order, then block order), as single-threaded `gemm` calls.

use std::cell::RefCell;

use rayon::prelude::*;

use super::attention::AttentionDims;
use super::fast_math;

/// Query rows per block: the scores of a block, (rows x keys), stay in a task's scratch (64 x T floats).
/// Softmax exps come from [`fast_math::exp`], within an ulp or two of the twins' library exp.
const QUERY_BLOCK: usize = 64;

/// A base pointer shared by tasks that each write their own disjoint elements of the slice behind it.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: every task writes elements no other task touches (see the two entry points), and the slice
// outlives the parallel loop.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// Through a method, so that closures capture the whole wrapper (Send), not its raw-pointer field.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// A strided matrix view for [`product`]: element (r, c) at `ptr + r * row_stride + c * col_stride`.
#[derive(Clone, Copy)]
struct View {
    ptr: *const f32,
    row_stride: usize,
    col_stride: usize,
}

/// dst (m, n; row stride `dst_row_stride`, unit column stride) = [dst +] scale * lhs (m, k) @ rhs (k, n),
/// one single-threaded `gemm` call (the same order of sums whichever thread runs it).
///
/// # Safety
/// Every element the product reads or writes must lie inside live allocations, and no other thread may
/// touch dst's elements meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn product(m: usize, n: usize, k: usize, dst: *mut f32, dst_row_stride: usize, accumulate: bool, lhs: View, rhs: View, scale: f32) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                unsafe { std::slice::from_raw_parts_mut(dst.add(r * dst_row_stride), n).fill(0.0) };
            }
        }
        return;
    }
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_row_stride as isize,
            accumulate,
            lhs.ptr,
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.ptr,
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            1.0,
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    };
}

thread_local! {
    /// Each rayon thread's scratch for the (query block x keys) score and gradient matrices, grown to the
    /// largest needed and then reused, so that a step allocates nothing here after its first call.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with at least `len` floats of this thread's scratch (contents unspecified).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        f(&mut buf[..len])
    })
}

/// The checks both entry points make before their unsafe loops, with the numbers in the message.
fn check_lengths(d: &AttentionDims, qkv: usize, out: usize, stats: usize) {
    d.check().expect("attention dims");
    let rows = d.batch * d.seq_len;
    assert!(qkv >= rows * d.qkv_width(), "attention: qkv has {qkv} floats, {rows} rows of {} need more", d.qkv_width());
    assert!(out >= rows * d.out_width(), "attention: out has {out} floats, {rows} rows of {} need more", d.out_width());
    assert!(stats >= d.stat_len(), "attention: lse/delta have {stats} floats of {}", d.stat_len());
}

/// out = softmax(q k^T * scale, causal) v per query head; lse = log-sum-exp of each score row. The twin's
/// function ([`super::attention::attention_forward`]).
pub fn attention_forward(out: &mut [f32], lse: &mut [f32], qkv: &[f32], d: AttentionDims) {
    check_lengths(&d, qkv.len(), out.len(), lse.len());
    let (t_len, hd, width) = (d.seq_len, d.head_dim, d.qkv_width());
    let blocks = t_len.div_ceil(QUERY_BLOCK);
    let (out_base, lse_base) = (SharedMut(out.as_mut_ptr()), SharedMut(lse.as_mut_ptr()));
    (0..d.batch * d.heads * blocks).into_par_iter().for_each(|task| {
        let (bh, block) = (task / blocks, task % blocks);
        let (b, h) = (bh / d.heads, bh % d.heads);
        let g = d.kv_head(h);
        let i0 = block * QUERY_BLOCK;
        let rows = QUERY_BLOCK.min(t_len - i0);
        // Keys 0..keys: the causal mask leaves none past the block's last row.
        let keys = i0 + rows;
        let row0 = b * t_len;
        with_scratch(rows * keys, |scores| {
            // SAFETY: the views index rows row0..row0 + T of qkv (length checked above); the scores
            // are this thread's scratch.
            unsafe {
                let q = View { ptr: qkv.as_ptr().add((row0 + i0) * width + h * hd), row_stride: width, col_stride: 1 };
                let k = qkv.as_ptr().add(row0 * width + d.q_width() + g * hd);
                let k_t = View { ptr: k, row_stride: 1, col_stride: width };
                product(rows, keys, hd, scores.as_mut_ptr(), keys, false, q, k_t, 1.0);
            }
            for r in 0..rows {
                let t = i0 + r;
                let row = &mut scores[r * keys..][..keys];
                let row_lse = softmax_row(row, t, d.scale);
                if d.dropout.is_some() {
                    for (j, p) in row[..=t].iter_mut().enumerate() {
                        *p *= d.prob_dropout(b, h, t, j);
                    }
                }
                // SAFETY: lse element (b, h, t) belongs to this task alone.
                unsafe { *lse_base.get().add((b * d.heads + h) * t_len + t) = row_lse };
            }
            // SAFETY: out rows row0 + i0.. of head h's columns belong to this task alone; v lies in qkv.
            unsafe {
                let v =
                    View { ptr: qkv.as_ptr().add(row0 * width + d.q_width() + d.kv_width() + g * hd), row_stride: width, col_stride: 1 };
                let p = View { ptr: scores.as_ptr(), row_stride: keys, col_stride: 1 };
                let dst = out_base.get().add((row0 + i0) * d.out_width() + h * hd);
                product(rows, hd, keys, dst, d.out_width(), false, p, v, 1.0);
            }
        });
    });
}

/// Turns raw scores q . k of query `t` (keys 0..row.len(), of which 0..=t are visible) into
/// probabilities exp(s * scale - lse), zero past `t`, and returns lse, as the twin computes them.
fn softmax_row(row: &mut [f32], t: usize, scale: f32) -> f32 {
    let (visible, masked) = row.split_at_mut(t + 1);
    masked.fill(0.0);
    for s in visible.iter_mut() {
        *s *= scale;
    }
    let max = fast_math::max(visible);
    let lse = max + fast_math::sum_exp_shifted(visible, max).ln();
    fast_math::exp_affine(visible, 1.0, lse, 1.0);
    lse
}

/// dqkv (overwritten) from dout; delta (B, H, T) = rowsum(dout * out). The twin's function
/// ([`super::attention::attention_backward`]), the k and v gradients of a shared head summed over its
/// group's query heads in head order.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(dqkv: &mut [f32], delta: &mut [f32], dout: &[f32], qkv: &[f32], out: &[f32], lse: &[f32], d: AttentionDims) {
    check_lengths(&d, qkv.len(), out.len(), lse.len());
    assert!(dqkv.len() >= d.batch * d.seq_len * d.qkv_width(), "attention: dqkv is shorter than qkv");
    assert!(dout.len() >= d.batch * d.seq_len * d.out_width(), "attention: dout is shorter than out");
    assert!(delta.len() >= d.stat_len(), "attention: delta has {} floats of {}", delta.len(), d.stat_len());
    let (t_len, hd, ow) = (d.seq_len, d.head_dim, d.out_width());
    // delta first, one row of each head at a time: each task below reads its heads' rows.
    delta[..d.stat_len()].par_chunks_mut(t_len).enumerate().for_each(|(bh, delta_row)| {
        let (b, h) = (bh / d.heads, bh % d.heads);
        for (t, dl) in delta_row.iter_mut().enumerate() {
            let at = (b * t_len + t) * ow + h * hd;
            *dl = dout[at..][..hd].iter().zip(&out[at..][..hd]).map(|(g, o)| g * o).sum();
        }
    });
    let delta = &*delta;
    let dqkv_base = SharedMut(dqkv.as_mut_ptr());
    (0..d.batch * d.kv_heads).into_par_iter().for_each(|task| {
        let (b, g) = (task / d.kv_heads, task % d.kv_heads);
        // SAFETY: this task writes only the k and v columns of head g and the q columns of its group's
        // heads, in rows of batch b: disjoint from every other task's.
        unsafe { key_value_head_backward(dqkv_base.get(), delta, dout, qkv, lse, &d, b, g) };
    });
}

/// The backward of key/value head `g` in batch `b`: its k and v gradients, summed over its group's
/// query heads and their query blocks in order, and those heads' q gradients.
///
/// # Safety
/// `dqkv` points to B T rows of the qkv width, and no other thread touches this head's elements.
#[allow(clippy::too_many_arguments)]
unsafe fn key_value_head_backward(
    dqkv: *mut f32,
    delta: &[f32],
    dout: &[f32],
    qkv: &[f32],
    lse: &[f32],
    d: &AttentionDims,
    b: usize,
    g: usize,
) {
    let (t_len, hd, width, ow) = (d.seq_len, d.head_dim, d.qkv_width(), d.out_width());
    let row0 = b * t_len;
    let k_col = d.q_width() + g * hd;
    let v_col = k_col + d.kv_width();
    let at = |row: usize, col: usize| (row0 + row) * width + col;
    let k_ptr = unsafe { qkv.as_ptr().add(at(0, k_col)) };
    let v_ptr = unsafe { qkv.as_ptr().add(at(0, v_col)) };
    let (dk, dv) = unsafe { (dqkv.add(at(0, k_col)), dqkv.add(at(0, v_col))) };
    let rows_max = QUERY_BLOCK.min(t_len);
    with_scratch(2 * rows_max * t_len, |scratch| {
        let (probs, grads) = scratch.split_at_mut(rows_max * t_len);
        let mut first = true;
        for h in g * d.group()..(g + 1) * d.group() {
            let stat0 = (b * d.heads + h) * t_len;
            for i0 in (0..t_len).step_by(QUERY_BLOCK) {
                let rows = QUERY_BLOCK.min(t_len - i0);
                let keys = i0 + rows;
                let q = View { ptr: unsafe { qkv.as_ptr().add(at(i0, h * hd)) }, row_stride: width, col_stride: 1 };
                let dout_block = View { ptr: unsafe { dout.as_ptr().add((row0 + i0) * ow + h * hd) }, row_stride: ow, col_stride: 1 };
                let k_t = View { ptr: k_ptr, row_stride: 1, col_stride: width };
                let v_t = View { ptr: v_ptr, row_stride: 1, col_stride: width };
                // probs = q k^T (raw scores), grads = dout v^T.
                unsafe {
                    product(rows, keys, hd, probs.as_mut_ptr(), keys, false, q, k_t, 1.0);
                    product(rows, keys, hd, grads.as_mut_ptr(), keys, false, dout_block, v_t, 1.0);
                }
                let block = ScoreBlock { b, h, i0, rows, keys, stats: stat0 };
                softmax_backward_rows(&mut probs[..rows * keys], &mut grads[..rows * keys], &block, lse, delta, d);
                let pm_t = View { ptr: probs.as_ptr(), row_stride: 1, col_stride: keys };
                let ds_t = View { ptr: grads.as_ptr(), row_stride: 1, col_stride: keys };
                let ds = View { ptr: grads.as_ptr(), row_stride: keys, col_stride: 1 };
                let k = View { ptr: k_ptr, row_stride: width, col_stride: 1 };
                unsafe {
                    // dv[0..keys] (+)= (p m)^T dout; dk[0..keys] (+)= ds^T q scale. The first block of
                    // the first head overwrites rows 0..keys; the rows past it are zeroed below.
                    product(keys, hd, rows, dv, width, !first, pm_t, dout_block, 1.0);
                    product(keys, hd, rows, dk, width, !first, ds_t, q, d.scale);
                    if first {
                        for row in keys..t_len {
                            std::slice::from_raw_parts_mut(dv.add(row * width), hd).fill(0.0);
                            std::slice::from_raw_parts_mut(dk.add(row * width), hd).fill(0.0);
                        }
                    }
                    // dq = ds k scale.
                    product(rows, hd, keys, dqkv.add(at(i0, h * hd)), width, false, ds, k, d.scale);
                }
                first = false;
            }
        }
    });
}

/// Where a block of scores sits: batch `b`, head `h`, query rows `i0..i0 + rows` against keys
/// `0..keys`, the head's softmax statistics from `stats`.
struct ScoreBlock {
    b: usize,
    h: usize,
    i0: usize,
    rows: usize,
    keys: usize,
    stats: usize,
}

/// Row by row over a block of raw scores `probs` (q k^T) and `grads` (dout v^T), both (rows, keys):
/// probs <- p m, what dv needs; grads <- ds = p (m dout . v - delta); the causally masked keys zeroed.
fn softmax_backward_rows(probs: &mut [f32], grads: &mut [f32], s: &ScoreBlock, lse: &[f32], delta: &[f32], d: &AttentionDims) {
    let keys = s.keys;
    for r in 0..s.rows {
        let t = s.i0 + r;
        let (row_lse, row_delta) = (lse[s.stats + t], delta[s.stats + t]);
        let (p_row, p_masked) = probs[r * keys..][..keys].split_at_mut(t + 1);
        let (g_row, g_masked) = grads[r * keys..][..keys].split_at_mut(t + 1);
        p_masked.fill(0.0);
        g_masked.fill(0.0);
        fast_math::exp_affine(p_row, d.scale, row_lse, 1.0);
        if d.dropout.is_some() {
            for (j, (p, g)) in p_row.iter_mut().zip(g_row.iter_mut()).enumerate() {
                let m = d.prob_dropout(s.b, s.h, t, j);
                *g = *p * (*g * m - row_delta);
                *p *= m;
            }
        } else {
            for (p, g) in p_row.iter().zip(g_row.iter_mut()) {
                *g = p * (*g - row_delta);
            }
        }
    }
}

#[cfg(test)]
mod tests;
