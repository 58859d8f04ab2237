//! matmul_fast: the `cpu` device's matmul, the same product as the twin [`super::matmul::matmul`]
//! (C (M, N) = A (M, K) @ B (K, N) [+ bias (N)] [+ C], every operand addressed by strides) computed by
//! the `gemm` crate, which picks AVX-512, AVX2+FMA or scalar micro-kernels at run time from the CPU it
//! runs on. The twin stays the simple reference that this one is tested against (see the tests below).
//!
//! Deterministic by construction: one `gemm` call per product, threaded by `gemm` itself on rayon's pool
//! (its threads share the packed panels of A and B). `gemm` cuts K into blocks whose size is a function of
//! K and the CPU's cache sizes alone (`gemm_common::cache::kernel_params`), walks them in order, and gives
//! each thread whole blocks of M and N: every element of C is summed over K in the same order on every call
//! and on every thread count (`fast_is_deterministic` checks pools of 1, 2 and 3 threads).

use rayon::prelude::*;

use super::matmul::MatmulShape;

/// Rows of C per rayon task when the bias is added after the product.
const BIAS_ROWS_PER_TASK: usize = 64;

/// C = A @ B (+ bias) (+ C if `accumulate`), the twin's semantics with `gemm`'s kernels.
pub fn matmul(c: &mut [f32], a: &[f32], b: &[f32], bias: Option<&[f32]>, s: &MatmulShape, accumulate: bool) {
    assert_eq!(s.c.col_stride, 1, "matmul: C must have unit column stride");
    if s.m == 0 || s.n == 0 {
        return;
    }
    if let Some(bias) = bias {
        assert!(bias.len() >= s.n, "matmul: bias has {} of {} columns", bias.len(), s.n);
    }
    let c_row = s.c.row_stride;
    assert!(s.m == 1 || c_row >= s.n, "matmul: C's row stride {c_row} is shorter than its {} columns", s.n);
    // Every element of A, B and C that the product touches lies inside the slices: the unsafe code
    // below relies on it.
    assert!(s.c.span(0..s.m, 0..s.n).end <= c.len(), "matmul: C is too short for its strides");
    // C from its first element to its last; a row of it every `row_step` elements.
    let row_step = if s.m == 1 { s.n } else { c_row };
    let c = &mut c[s.c.offset..s.c.offset + (s.m - 1) * row_step + s.n];
    if s.k == 0 {
        // An empty sum: C keeps its values when accumulating and is zero otherwise.
        if !accumulate {
            c.chunks_mut(row_step).for_each(|row| row[..s.n].fill(0.0));
        }
    } else {
        assert!(s.a.span(0..s.m, 0..s.k).end <= a.len(), "matmul: A is too short for its strides");
        assert!(s.b.span(0..s.k, 0..s.n).end <= b.len(), "matmul: B is too short for its strides");
        // SAFETY: every index the product touches is inside the slices (asserted above); C's unit column
        // stride and row stride >= n keep distinct (row, column) pairs at distinct elements.
        unsafe {
            gemm::gemm(
                s.m,
                s.n,
                s.k,
                c.as_mut_ptr(),
                1,
                row_step as isize,
                accumulate,
                a.as_ptr().add(s.a.offset),
                s.a.col_stride as isize,
                s.a.row_stride as isize,
                b.as_ptr().add(s.b.offset),
                s.b.col_stride as isize,
                s.b.row_stride as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(0),
            );
        }
    }
    // The bias is added after the product, as in the twin.
    if let Some(bias) = bias {
        let bias = &bias[..s.n];
        c.par_chunks_mut(row_step * BIAS_ROWS_PER_TASK).for_each(|rows| {
            for row in rows.chunks_mut(row_step) {
                row[..s.n].iter_mut().zip(bias).for_each(|(x, bv)| *x += bv);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matmul::Operand;
    use rand::{Rng, SeedableRng};

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    /// Runs the twin and the fast matmul on the same inputs (C pre-filled, so `accumulate` and the
    /// elements outside a window are checked too) and returns both C buffers.
    fn both(s: &MatmulShape, bias: bool, accumulate: bool, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let a = random(s.a.span(0..s.m, 0..s.k.max(1)).end + 3, seed);
        let b = random(s.b.span(0..s.k.max(1), 0..s.n).end + 5, seed + 1);
        let c0 = random(s.c.span(0..s.m, 0..s.n).end + 7, seed + 2);
        let bias = bias.then(|| random(s.n, seed + 3));
        let (mut want, mut got) = (c0.clone(), c0);
        crate::ops::matmul::matmul(&mut want, &a, &b, bias.as_deref(), s, accumulate);
        matmul(&mut got, &a, &b, bias.as_deref(), s, accumulate);
        (want, got)
    }

    fn assert_close(what: &str, got: &[f32], want: &[f32], k: usize) {
        // Both sides sum k products of numbers in [-1, 1) in different orders: allow a few ulps per term.
        let tol = 1e-5 * (k as f32).max(1.0).sqrt() * 4.0;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: element {i}: fast {g} vs twin {w}");
        }
    }

    /// Every layout the twin serves (row-major, transposed A, transposed B, both, and a window of a wider C
    /// at an offset), with and without bias and accumulation, at sizes that are multiples of no tile.
    #[test]
    fn fast_matches_twin() {
        let sizes = [1, 7, 63, 65, 257, 1000];
        let mut seed = 0;
        for &m in &sizes {
            for &n in &sizes {
                for &k in &sizes {
                    // The largest products are costly at opt-level 1: take every layout only up to 257.
                    if m * n * k > 257 * 257 * 1000 {
                        continue;
                    }
                    seed += 10;
                    let layouts = [
                        ("row-major", MatmulShape::row_major(m, n, k)),
                        ("A^T", MatmulShape { a: Operand::transposed(m), ..MatmulShape::row_major(m, n, k) }),
                        ("B^T", MatmulShape { b: Operand::transposed(k), ..MatmulShape::row_major(m, n, k) }),
                        (
                            "A^T B^T",
                            MatmulShape { a: Operand::transposed(m), b: Operand::transposed(k), ..MatmulShape::row_major(m, n, k) },
                        ),
                        (
                            "windows",
                            // Column windows of wider matrices at offsets, as the attention heads use them.
                            MatmulShape {
                                m,
                                n,
                                k,
                                a: Operand { offset: 3, row_stride: k + 5, col_stride: 1 },
                                b: Operand { offset: 2, row_stride: n + 9, col_stride: 1 },
                                c: Operand { offset: 11, row_stride: n + 13, col_stride: 1 },
                            },
                        ),
                    ];
                    for (name, s) in layouts {
                        for (bias, accumulate) in [(false, false), (true, false), (false, true), (true, true)] {
                            let (want, got) = both(&s, bias, accumulate, seed);
                            let what = format!("{name} m={m} n={n} k={k} bias={bias} accumulate={accumulate}");
                            assert_close(&what, &got, &want, k);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn k_zero_matches_twin() {
        for accumulate in [false, true] {
            let (want, got) = both(&MatmulShape::row_major(5, 7, 0), true, accumulate, 1);
            assert_eq!(got, want);
        }
    }

    /// Same inputs, same bits: on two calls, and with rayon pools of 1, 2 and 3 threads, for a split into
    /// blocks of rows and one into blocks of columns.
    #[test]
    fn fast_is_deterministic() {
        let by_rows = MatmulShape { b: Operand::transposed(300), ..MatmulShape::row_major(1000, 257, 300) };
        let by_columns = MatmulShape { a: Operand::transposed(65), ..MatmulShape::row_major(65, 1000, 300) };
        for s in [by_rows, by_columns] {
            let a = random(s.m * s.k, 7);
            let b = random(s.k * s.n, 8);
            let bias = random(s.n, 9);
            let run = || {
                let mut c = vec![0.0f32; s.m * s.n];
                matmul(&mut c, &a, &b, Some(&bias), &s, false);
                c.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
            };
            let first = run();
            assert_eq!(first, run(), "{s:?}: two calls on the global pool differ");
            for threads in [1, 2, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                assert_eq!(first, pool.install(run), "{s:?}: {threads} threads differ from the global pool");
            }
        }
    }

    /// GFLOP/s of the twin and the fast matmul at GPT-2 124M shapes (B*T = 1024, C = 768, V = 50257),
    /// timed alternately so that a change of the machine's load hits both; the best of the repetitions.
    /// Run: `cargo test --release -p zerostream --lib gflops -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn gflops_twin_vs_fast() {
        let (bt, c, v) = (1024, 768, 50257);
        let shapes = [
            ("fc fwd 1024x3072x768", MatmulShape::row_major(bt, 4 * c, c)),
            ("fc dW 768x3072x1024 (A^T)", MatmulShape { a: Operand::transposed(c), ..MatmulShape::row_major(c, 4 * c, bt) }),
            ("fc dX 1024x768x3072 (B^T)", MatmulShape { b: Operand::transposed(4 * c), ..MatmulShape::row_major(bt, c, 4 * c) }),
            ("head fwd 1024x50257x768 (B^T)", MatmulShape { b: Operand::transposed(c), ..MatmulShape::row_major(bt, v, c) }),
            ("head dX 1024x768x50257", MatmulShape::row_major(bt, c, v)),
        ];
        for (name, s) in shapes {
            let a = random(s.a.span(0..s.m, 0..s.k).end, 1);
            let b = random(s.b.span(0..s.k, 0..s.n).end, 2);
            let mut out = vec![0.0f32; s.m * s.n];
            let (mut twin, mut fast) = (f64::MAX, f64::MAX);
            for _ in 0..5 {
                let t = std::time::Instant::now();
                crate::ops::matmul::matmul(&mut out, &a, &b, None, &s, false);
                twin = twin.min(t.elapsed().as_secs_f64());
                let t = std::time::Instant::now();
                matmul(&mut out, &a, &b, None, &s, false);
                fast = fast.min(t.elapsed().as_secs_f64());
            }
            let gf = |secs: f64| s.flops() / secs / 1e9;
            println!("{name}: twin {:.1} GFLOP/s, fast {:.1} GFLOP/s ({:.2}x)", gf(twin), gf(fast), twin / fast);
        }
    }
}
