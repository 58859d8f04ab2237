//! reduce_fast: the `cpu` device's sums over rows (bias_backward's column sums and layernorm_backward's
//! weight and bias gradients), the twins' functions with the same bits. The twins give each column its
//! own task, which walks down the column at a stride of a whole row (a cache miss per element); here a
//! task owns a fixed block of [`COLUMNS`] adjacent columns and walks down the rows, adding each row's
//! piece into the block's sums: every column is still summed from 0 in row order, as in the twins, so
//! the results are equal to the bit, for any thread count.

use rayon::prelude::*;

/// Columns per task: 64 floats, one AVX-512 register's worth four times over.
const COLUMNS: usize = 64;

/// dbias (N) += sum over the M rows of dout (M, N), as [`super::matmul::bias_backward`].
pub fn bias_backward(dbias: &mut [f32], dout: &[f32], m: usize, n: usize) {
    assert!(dout.len() >= m * n, "bias_backward: dout has {} floats, {m} x {n} need more", dout.len());
    dbias[..n].par_chunks_mut(COLUMNS).enumerate().for_each(|(block, db)| {
        let c0 = block * COLUMNS;
        let mut sums = [0.0f32; COLUMNS];
        let sums = &mut sums[..db.len()];
        for r in 0..m {
            for (s, d) in sums.iter_mut().zip(&dout[r * n + c0..][..db.len()]) {
                *s += d;
            }
        }
        for (d, s) in db.iter_mut().zip(sums.iter()) {
            *d += s;
        }
    });
}

/// The layer norm's parameter gradients: dweight += sum over rows of dout * xhat, dbias += sum of dout,
/// with xhat = (x - mean) * rstd, as the second half of [`super::layernorm::layernorm_backward`].
#[allow(clippy::too_many_arguments)]
pub fn layernorm_param_grads(
    dweight: &mut [f32],
    dbias: &mut [f32],
    dout: &[f32],
    x: &[f32],
    mean: &[f32],
    rstd: &[f32],
    rows: usize,
    c: usize,
) {
    dweight[..c].par_chunks_mut(COLUMNS).zip(dbias[..c].par_chunks_mut(COLUMNS)).enumerate().for_each(|(block, (dw, db))| {
        let (c0, width) = (block * COLUMNS, dw.len());
        let (mut sw, mut sb) = ([0.0f32; COLUMNS], [0.0f32; COLUMNS]);
        for row in 0..rows {
            let (mu, r) = (mean[row], rstd[row]);
            let (d_row, x_row) = (&dout[row * c + c0..][..width], &x[row * c + c0..][..width]);
            for j in 0..width {
                sw[j] += d_row[j] * (x_row[j] - mu) * r;
                sb[j] += d_row[j];
            }
        }
        for j in 0..width {
            dw[j] += sw[j];
            db[j] += sb[j];
        }
    });
}

/// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight, and the parameter gradients
/// of [`layernorm_param_grads`]: [`super::layernorm::layernorm_backward`] with the same bits.
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
    assert!(dout.len() >= rows * c && x.len() >= rows * c, "layernorm_backward: dout or x is shorter than {rows} x {c}");
    super::layernorm::layernorm_backward_dx(dx, dout, x, weight, mean, rstd, rows, c);
    layernorm_param_grads(dweight, dbias, dout, x, mean, rstd, rows, c);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Equal to the twins to the bit, at widths that are multiples of no block, on 1 and 3 threads.
    #[test]
    fn fast_reductions_equal_the_twins() {
        for (m, n) in [(1, 1), (7, 63), (33, 65), (130, 200), (1024, 768)] {
            let dout = random(m * n, (m * n) as u64);
            let start = random(n, 1);
            let mut want = start.clone();
            crate::ops::matmul::bias_backward(&mut want, &dout, m, n);
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
                let mut got = start.clone();
                pool.install(|| bias_backward(&mut got, &dout, m, n));
                assert_eq!(bits(&got), bits(&want), "bias_backward {m}x{n} on {threads} threads");
            }

            let (x, w, b) = (random(m * n, 2), random(n, 3), random(n, 4));
            let (mut out, mut mean, mut rstd) = (vec![0.0; m * n], vec![0.0; m], vec![0.0; m]);
            crate::ops::layernorm::layernorm_forward(&mut out, &mut mean, &mut rstd, &x, &w, &b, m, n, 1e-5);
            let (dx0, dw0, db0) = (random(m * n, 5), random(n, 6), random(n, 7));
            let (mut dx_want, mut dw_want, mut db_want) = (dx0.clone(), dw0.clone(), db0.clone());
            crate::ops::layernorm::layernorm_backward(&mut dx_want, &mut dw_want, &mut db_want, &dout, &x, &w, &mean, &rstd, m, n);
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
                let (mut dx, mut dw, mut db) = (dx0.clone(), dw0.clone(), db0.clone());
                pool.install(|| layernorm_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &mean, &rstd, m, n));
                assert_eq!(bits(&dx), bits(&dx_want), "layernorm dx {m}x{n} on {threads} threads");
                assert_eq!(bits(&dw), bits(&dw_want), "layernorm dweight {m}x{n} on {threads} threads");
                assert_eq!(bits(&db), bits(&db_want), "layernorm dbias {m}x{n} on {threads} threads");
            }
        }
    }
}
