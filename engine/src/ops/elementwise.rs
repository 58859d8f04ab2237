//! Small elementwise utilities: residual add, fill, axpy, sum of squares, f32 <-> f16 casts, and the
//! host-side passes over whole gradients (parallel copy and add).

use rayon::prelude::*;

/// out = a + b. Twin of `residual_forward.wgsl`.
pub fn residual_forward(out: &mut [f32], a: &[f32], b: &[f32]) {
    out.par_iter_mut().zip(a.par_iter().zip(b.par_iter())).for_each(|(o, (x, y))| *o = x + y);
}

/// x = value. Twin of `fill.wgsl`.
pub fn fill(x: &mut [f32], value: f32) {
    x.par_iter_mut().for_each(|v| *v = value);
}

/// y = alpha * x + beta * y. Twin of `axpy.wgsl`.
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32], beta: f32) {
    y.par_iter_mut().zip(x.par_iter()).for_each(|(y, x)| *y = alpha * x + beta * *y);
}

/// Elements per partial sum, as in `sum_squares.wgsl`.
pub const SUM_SQUARES_GROUP: usize = 4096;

/// Sum of x^2: f32 partial sums over groups of 4096 elements, added in f64. Twin of `sum_squares.wgsl`.
pub fn sum_squares(x: &[f32]) -> f64 {
    x.par_chunks(SUM_SQUARES_GROUP).map(|g| g.iter().fold(0.0f32, |s, v| v.mul_add(*v, s)) as f64).collect::<Vec<_>>().iter().sum()
}

/// Elements per rayon task of the host-side passes below: large enough that a task's overhead is
/// nothing beside its memory traffic (256 KiB of f32).
pub const HOST_CHUNK: usize = 1 << 16;

/// dst = src, on rayon's threads (one core does not saturate the memory bus).
pub fn copy<T: Copy + Send + Sync>(dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "copy: lengths differ");
    dst.par_chunks_mut(HOST_CHUNK).zip(src.par_chunks(HOST_CHUNK)).for_each(|(d, s)| d.copy_from_slice(s));
}

/// acc += x, on rayon's threads.
pub fn add_into(acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len(), "add_into: lengths differ");
    acc.par_chunks_mut(HOST_CHUNK).zip(x.par_chunks(HOST_CHUNK)).for_each(|(a, x)| a.iter_mut().zip(x).for_each(|(a, x)| *a += x));
}

/// f32 -> f16 bits, round to nearest even. Twin of `cast_f32_to_f16.wgsl` (which packs two per word).
pub fn cast_f32_to_f16(out: &mut [u16], x: &[f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    assert_eq!(out.len(), x.len(), "cast_f32_to_f16: {} outputs for {} inputs", out.len(), x.len());
    // By slices: eight at a time where the CPU has F16C (checked once per slice), the same bits as
    // `f16::from_f32` element by element.
    out.par_chunks_mut(HOST_CHUNK)
        .zip(x.par_chunks(HOST_CHUNK))
        .for_each(|(o, v)| o.reinterpret_cast_mut::<half::f16>().convert_from_f32_slice(v));
}

/// bf16 bits -> f32 (exact). Twin of `cast_half_to_f32.wgsl` (format 1).
pub fn cast_bf16_to_f32(out: &mut [f32], x: &[u16]) {
    out.par_iter_mut().zip(x.par_iter()).for_each(|(o, v)| *o = half::bf16::from_bits(*v).to_f32());
}

/// f16 bits -> f32 (exact). Twin of `cast_half_to_f32.wgsl` (format 0).
pub fn cast_f16_to_f32(out: &mut [f32], x: &[u16]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    assert_eq!(out.len(), x.len(), "cast_f16_to_f32: {} outputs for {} inputs", out.len(), x.len());
    out.par_chunks_mut(HOST_CHUNK)
        .zip(x.par_chunks(HOST_CHUNK))
        .for_each(|(o, h)| h.reinterpret_cast::<half::f16>().convert_to_f32_slice(o));
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerostream_offload::square_sums::SquareSums;

    fn random(len: usize, seed: u64) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    /// The parallel host passes against a plain loop, at lengths that are multiples of no chunk, and the
    /// exact sum of squares' bits on pools of 1, 2 and 3 threads.
    #[test]
    fn host_passes_match_plain_loops() {
        for len in [0, 1, 7, HOST_CHUNK - 1, 3 * HOST_CHUNK + 5] {
            let (x, y) = (random(len, 1), random(len, 2));
            let mut dst = vec![0.0; len];
            copy(&mut dst, &x);
            assert_eq!(dst, x);
            add_into(&mut dst, &y);
            assert!(dst.iter().zip(x.iter().zip(&y)).all(|(d, (a, b))| *d == a + b), "add_into at {len}");
            let plain: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
            let got = SquareSums::of(&x).to_f64();
            assert!((got - plain).abs() <= 1e-12 * plain.max(1.0), "exact sum of squares at {len}: {got} vs {plain}");
            for threads in [1, 2, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                assert_eq!(pool.install(|| SquareSums::of(&x).to_f64()).to_bits(), got.to_bits(), "{threads} threads at {len}");
            }
        }
    }
}
