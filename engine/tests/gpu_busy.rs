//! The kernels' busy time by GPU timestamps (`device/gpu/busy.rs`): it grows by what a product's own
//! timestamps say it took, and the cpu device has no such clock.

mod common;

use common::kernel_check::tensor;
use common::{gpu_or_skip, random};
use zerostream::device::timing::Timer;
use zerostream::device::{Backend, CpuDevice, MatmulShape};

#[test]
fn kernel_seconds_follow_the_device_clock() {
    assert_eq!(CpuDevice::new(None).kernel_seconds(), None);
    let Some(gpu) = gpu_or_skip("kernel_seconds_follow_the_device_clock") else { return };
    if gpu.best_timer() != Timer::GpuTimestamps {
        assert_eq!(gpu.kernel_seconds(), None, "no timestamp queries, no busy clock");
        return;
    }
    let (m, n, k) = (256, 256, 512);
    let (a, b, c) = (tensor(&gpu, &random(1, m * k, 1.0)), tensor(&gpu, &random(2, k * n, 1.0)), tensor(&gpu, &vec![0.0; m * n]));
    let product = || gpu.matmul(&c, &a, &b, None, &MatmulShape::row_major(m, n, k), false);
    product(); // pipeline creation
    let before = gpu.kernel_seconds().unwrap();
    let reps = 5;
    for _ in 0..reps {
        product();
    }
    let busy = gpu.kernel_seconds().unwrap() - before;
    let timed = gpu.time_reps(reps, Timer::GpuTimestamps, product).unwrap();
    let each = timed.median_s();
    assert!(busy > 0.0, "the busy clock did not move");
    // The same work by the same clock: the busy time is the passes' own spans, the marks' spans include
    // the gaps between passes, so busy <= marks (with slack for the spread between repetitions).
    assert!(busy < 3.0 * reps as f64 * each && busy > 0.2 * reps as f64 * each, "busy {busy} s for {reps} x {each} s");
    // Nothing recorded, nothing added.
    let idle = gpu.kernel_seconds().unwrap();
    assert_eq!(gpu.kernel_seconds().unwrap(), idle);
}
