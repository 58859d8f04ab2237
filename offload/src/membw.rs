//! Host memory bandwidth, measured the way STREAM's triad does: `a[i] = b[i] + s * c[i]` over arrays far
//! larger than the caches, counting 12 bytes per element (two f32 reads, one write). It is the ceiling
//! the CPU AdamW is judged against.

use std::time::Instant;

use rayon::prelude::*;

/// Elements per rayon task: large enough that scheduling is noise, small enough to balance.
const TASK_ELEMS: usize = 1 << 16;

/// Best triad bandwidth in GB/s (1e9 bytes) over `reps` runs on `pool`, with arrays of `n` f32.
pub fn triad_gbps(pool: &rayon::ThreadPool, n: usize, reps: usize) -> f64 {
    pool.install(|| {
        // First touch in parallel, so pages land near the threads that use them.
        let mut a = vec![0.0f32; n];
        let mut b = vec![0.0f32; n];
        let mut c = vec![0.0f32; n];
        a.par_chunks_mut(TASK_ELEMS).for_each(|x| x.fill(0.0));
        b.par_chunks_mut(TASK_ELEMS).for_each(|x| x.fill(1.0));
        c.par_chunks_mut(TASK_ELEMS).for_each(|x| x.fill(2.0));
        let s = 3.0f32;
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let start = Instant::now();
            a.par_chunks_mut(TASK_ELEMS).zip(b.par_chunks(TASK_ELEMS).zip(c.par_chunks(TASK_ELEMS))).for_each(|(a, (b, c))| {
                for i in 0..a.len() {
                    a[i] = b[i] + s * c[i];
                }
            });
            best = best.min(start.elapsed().as_secs_f64());
        }
        assert!(a[n / 2] == 7.0, "triad result checked so the loop is not optimised away");
        12.0 * n as f64 / best / 1e9
    })
}
