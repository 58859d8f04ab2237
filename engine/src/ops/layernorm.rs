//! layernorm: per-row normalisation with learned scale and shift, and its backward.

use rayon::prelude::*;

/// out (rows, C) = (x - mean) * rstd * weight + bias; saves mean, rstd (rows). Twin of `layernorm_forward.wgsl`.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_forward(
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    rows: usize,
    channels: usize,
    eps: f32,
) {
    let c = channels;
    out[..rows * c].par_chunks_mut(c).zip(mean[..rows].par_iter_mut().zip(rstd[..rows].par_iter_mut())).enumerate().for_each(
        |(row, (o, (mu_out, r_out)))| {
            let xr = &x[row * c..][..c];
            let mu = xr.iter().sum::<f32>() / c as f32;
            let var = xr.iter().map(|v| (v - mu) * (v - mu)).sum::<f32>() / c as f32;
            let r = 1.0 / (var + eps).sqrt();
            for i in 0..c {
                o[i] = (xr[i] - mu) * r * weight[i] + bias[i];
            }
            *mu_out = mu;
            *r_out = r;
        },
    );
}

/// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight; dweight += sum dout * xhat;
/// dbias += sum dout. Twin of both entry points of `layernorm_backward.wgsl`.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward(
    dx: &mut [f32],
    dweight: &mut [f32],
    dbias: &mut [f32],
    dout: &[f32],
    x: &[f32],
    weight: &[f32],
    mean: &[f32],
    rstd: &[f32],
    rows: usize,
    channels: usize,
) {
    let c = channels;
    layernorm_backward_dx(dx, dout, x, weight, mean, rstd, rows, c);
    dweight[..c].par_iter_mut().zip(dbias[..c].par_iter_mut()).enumerate().for_each(|(col, (dw, db))| {
        let (mut sw, mut sb) = (0.0f32, 0.0f32);
        for row in 0..rows {
            let d = dout[row * c + col];
            sw += d * (x[row * c + col] - mean[row]) * rstd[row];
            sb += d;
        }
        *dw += sw;
        *db += sb;
    });
}

/// The dx part of [`layernorm_backward`], row by row (rows in parallel): shared with the cpu device's
/// fast version, whose parameter-gradient sums differ only in schedule.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layernorm_backward_dx(
    dx: &mut [f32],
    dout: &[f32],
    x: &[f32],
    weight: &[f32],
    mean: &[f32],
    rstd: &[f32],
    rows: usize,
    c: usize,
) {
    dx[..rows * c].par_chunks_mut(c).enumerate().for_each(|(row, dxr)| {
        let (mu, r) = (mean[row], rstd[row]);
        let xr = &x[row * c..][..c];
        let dr = &dout[row * c..][..c];
        let mut g_sum = 0.0f32;
        let mut gx_sum = 0.0f32;
        for i in 0..c {
            let g = dr[i] * weight[i];
            g_sum += g;
            gx_sum += g * (xr[i] - mu) * r;
        }
        let (g_mean, gx_mean) = (g_sum / c as f32, gx_sum / c as f32);
        for i in 0..c {
            let xhat = (xr[i] - mu) * r;
            dxr[i] += r * (dr[i] * weight[i] - g_mean - xhat * gx_mean);
        }
    });
}
