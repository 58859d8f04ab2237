//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

pub mod cli;
pub mod kernel_check;
pub mod trajectory;

use zerostream::device::GpuDevice;
/// Seeded inputs, the same the self-test draws (`zerostream::selftest`).
#[allow(unused_imports)]
pub use zerostream::selftest::{random, random_tokens};

/// The GPU device, or `None` after printing that the test skipped. With ZEROSTREAM_REQUIRE_GPU=1 (CI
/// sets it) a missing adapter fails the test instead.
pub fn gpu_or_skip(test: &str) -> Option<GpuDevice> {
    match GpuDevice::open(None, None) {
        Ok(dev) => Some(dev),
        Err(e) => {
            if std::env::var("ZEROSTREAM_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("{test}: ZEROSTREAM_REQUIRE_GPU=1 but no GPU adapter: {e:#}");
            }
            eprintln!("SKIPPED {test}: no GPU adapter ({e:#})");
            None
        }
    }
}

/// Says that `test` skipped its cooperative-matrix part on `gpu` (which lacks them), or fails it under
/// ZEROSTREAM_REQUIRE_COOP=1 (`.ci/coop-lavapipe` sets it, in a root whose lavapipe has them).
pub fn coop_skipped(test: &str, gpu: &GpuDevice) {
    let why = zerostream::device::gpu::coop_unavailable(gpu.summary()).unwrap_or_default();
    if std::env::var("ZEROSTREAM_REQUIRE_COOP").as_deref() == Ok("1") {
        panic!("{test}: ZEROSTREAM_REQUIRE_COOP=1 but adapter {:?} cannot run the cooperative-matrix matmul: {why}", gpu.summary().name);
    }
    eprintln!(
        "SKIPPED {test}: adapter {:?} cannot run the cooperative-matrix matmul ({why}); `zerostream devices` lists what it has",
        gpu.summary().name
    );
}

/// Asserts |got - want| <= atol + rtol * |want| elementwise, naming the first offender.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(err.is_finite() || g == w, "{what}[{i}]: got {g}, want {w}");
        let excess = err - (atol + rtol * w.abs());
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    let i = worst.0;
    assert!(worst.1 <= 0.0, "{what}[{i}]: got {}, want {} (atol {atol}, rtol {rtol})", got[i], want[i]);
}
