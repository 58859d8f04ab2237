//! rmsnorm: Llama's RMSNorm fused with its weight, per row of x (rows, C), and its backward.
//!
//! rstd (rows) = 1 / sqrt(mean(x^2) + eps) and out (rows, C) = weight (C) * (x * rstd), the products in
//! transformers' order (`weight * (x * rsqrt(var + eps))`). The kernels reduce a row with one 256-lane
//! workgroup; these twins add in the same order (lane partials, then the tree of `workgroup_sum.wgsl`)
//! and use `mul_add` where the kernels use `fma`, so the two round alike where the driver fuses fma
//! (lavapipe computes it as a multiply and an add: a few ulps apart there).

use rayon::prelude::*;

use super::COLUMN_BLOCK_ROWS;

/// Lanes of the kernels' row workgroup.
const LANES: usize = 256;
/// Lanes over rows in the weight-gradient kernel (`param_grad`: 32 columns x 8 row lanes a block).
const ROW_LANES: usize = 8;

/// The sum of `term(c)` over columns 0..channels in the kernels' order: lane l folds columns l, l + 256, ...
/// with `fold(term, partial)`, then the 256 partials are added pairwise at strides 128, 64, ..., 1.
fn workgroup_order_sum(channels: usize, fold: impl Fn(usize, f32) -> f32) -> f32 {
    let mut partial = [0.0f32; LANES];
    for (lane, p) in partial.iter_mut().enumerate() {
        *p = (lane..channels).step_by(LANES).fold(0.0, |acc, c| fold(c, acc));
    }
    let mut stride = LANES / 2;
    while stride > 0 {
        for lane in 0..stride {
            partial[lane] += partial[lane + stride];
        }
        stride /= 2;
    }
    partial[0]
}

/// out (rows, C) = weight * (x * rstd); saves rstd (rows). Twin of `rmsnorm_forward.wgsl`.
pub fn rmsnorm_forward(out: &mut [f32], rstd: &mut [f32], x: &[f32], weight: &[f32], rows: usize, channels: usize, eps: f32) {
    let c = channels;
    out[..rows * c].par_chunks_mut(c).zip(rstd[..rows].par_iter_mut()).enumerate().for_each(|(row, (o, r_out))| {
        let xr = &x[row * c..][..c];
        let sum_squares = workgroup_order_sum(c, |i, acc| xr[i].mul_add(xr[i], acc));
        let r = 1.0 / (sum_squares / c as f32 + eps).sqrt();
        for i in 0..c {
            o[i] = weight[i] * (xr[i] * r);
        }
        *r_out = r;
    });
}

/// dx (rows, C) += rstd * (g - xhat * mean(g * xhat)) with g = dout * weight, xhat = x * rstd;
/// dweight (C) += sum over rows of dout * xhat. Twin of both entry points of `rmsnorm_backward.wgsl`.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward(
    dx: &mut [f32],
    dweight: &mut [f32],
    dout: &[f32],
    x: &[f32],
    weight: &[f32],
    rstd: &[f32],
    rows: usize,
    channels: usize,
) {
    let c = channels;
    dx[..rows * c].par_chunks_mut(c).enumerate().for_each(|(row, dxr)| {
        let r = rstd[row];
        let xr = &x[row * c..][..c];
        let dr = &dout[row * c..][..c];
        let gx_sum = workgroup_order_sum(c, |i, acc| (dr[i] * weight[i]).mul_add(xr[i] * r, acc));
        let gx_mean = gx_sum / c as f32;
        for i in 0..c {
            let (g, xhat) = (dr[i] * weight[i], xr[i] * r);
            dxr[i] = r.mul_add((-xhat).mul_add(gx_mean, g), dxr[i]);
        }
    });
    // As `param_grad` where the GPU sums every row in one piece (one binding and its 1 MiB scratch hold
    // them: up to 4032 rows at C = 4096): block b of COLUMN_BLOCK_ROWS rows, lane l of it summing the
    // block's rows l, l + 8, ...; the 8 lane sums added in order, then the blocks' sums.
    let blocks = rows.div_ceil(COLUMN_BLOCK_ROWS).max(1);
    dweight[..c].par_iter_mut().enumerate().for_each(|(col, dw)| {
        let block_sum = |block: usize| {
            let rows = block * COLUMN_BLOCK_ROWS..((block + 1) * COLUMN_BLOCK_ROWS).min(rows);
            let mut total = 0.0f32;
            for lane in 0..ROW_LANES {
                total += rows.clone().skip(lane).step_by(ROW_LANES).fold(0.0f32, |acc, row| {
                    let xhat = x[row * c + col] * rstd[row];
                    dout[row * c + col].mul_add(xhat, acc)
                });
            }
            total
        };
        if blocks == 1 {
            *dw += block_sum(0);
        } else {
            *dw += (0..blocks).fold(0.0f32, |total, block| total + block_sum(block));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forward in f64, straight from the definition.
    fn forward_f64(x: &[f64], weight: &[f64], rows: usize, c: usize, eps: f64) -> Vec<f64> {
        let mut out = vec![0.0; rows * c];
        for row in 0..rows {
            let xr = &x[row * c..][..c];
            let r = 1.0 / (xr.iter().map(|v| v * v).sum::<f64>() / c as f64 + eps).sqrt();
            for i in 0..c {
                out[row * c + i] = weight[i] * xr[i] * r;
            }
        }
        out
    }

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        // A small deterministic spread of values in about [-2, 2], no zero rows.
        (0..n).map(|i| (((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1 << 24) as f32) * 4.0 - 2.0).collect()
    }

    #[test]
    fn forward_matches_the_f64_definition() {
        let (rows, c, eps) = (5, 300, 1e-5);
        let (x, w) = (sample(rows * c, 1), sample(c, 2));
        let (mut out, mut rstd) = (vec![0.0; rows * c], vec![0.0; rows]);
        rmsnorm_forward(&mut out, &mut rstd, &x, &w, rows, c, eps);
        let to64 = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let want = forward_f64(&to64(&x), &to64(&w), rows, c, eps as f64);
        for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
            assert!((g as f64 - w).abs() <= 1e-6 * (1.0 + w.abs()), "out[{i}]: {g} vs {w}");
        }
    }

    #[test]
    fn backward_matches_finite_differences_of_the_f64_forward_and_accumulates() {
        let (rows, c, eps) = (3, 7, 1e-5);
        let (x, w, dout) = (sample(rows * c, 3), sample(c, 4), sample(rows * c, 5));
        let (mut out, mut rstd) = (vec![0.0; rows * c], vec![0.0; rows]);
        rmsnorm_forward(&mut out, &mut rstd, &x, &w, rows, c, eps);
        // Start from ones: the op adds into its gradients.
        let (mut dx, mut dw) = (vec![1.0; rows * c], vec![1.0; c]);
        rmsnorm_backward(&mut dx, &mut dw, &dout, &x, &w, &rstd, rows, c);

        // Loss = sum(dout * out); central differences in f64.
        let (x64, w64): (Vec<f64>, Vec<f64>) = (x.iter().map(|&v| v as f64).collect(), w.iter().map(|&v| v as f64).collect());
        let loss =
            |x: &[f64], w: &[f64]| -> f64 { forward_f64(x, w, rows, c, eps as f64).iter().zip(&dout).map(|(o, &d)| o * d as f64).sum() };
        let h = 1e-6;
        for i in 0..rows * c {
            let (mut plus, mut minus) = (x64.clone(), x64.clone());
            plus[i] += h;
            minus[i] -= h;
            let want = 1.0 + (loss(&plus, &w64) - loss(&minus, &w64)) / (2.0 * h);
            assert!((dx[i] as f64 - want).abs() < 1e-4, "dx[{i}]: {} vs {want}", dx[i]);
        }
        for i in 0..c {
            let (mut plus, mut minus) = (w64.clone(), w64.clone());
            plus[i] += h;
            minus[i] -= h;
            let want = 1.0 + (loss(&x64, &plus) - loss(&x64, &minus)) / (2.0 * h);
            assert!((dw[i] as f64 - want).abs() < 1e-4, "dweight[{i}]: {} vs {want}", dw[i]);
        }
    }
}
