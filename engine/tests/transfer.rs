//! Host<->device transfers of `bench h2d` / `bench d2h` move the right bytes (needs an adapter).

mod common;

use zerostream::bench::{Link, bench_transfer};

#[test]
fn device_to_host_transfers_return_the_uploaded_bytes() {
    let Some(gpu) = common::gpu_or_skip("device_to_host_transfers_return_the_uploaded_bytes") else { return };
    // bench_transfer checks every d2h result against the bytes it uploaded and fails on a difference;
    // 9 MiB + 4 bytes makes the staging ring wrap with a partial last chunk.
    let runs = bench_transfer(&gpu, Link::DeviceToHost, &[4, (9 << 20) + 4], 1, |_| {}).unwrap();
    assert_eq!(runs.len(), 4);
    assert!(runs.iter().all(|r| r.gbps > 0.0 && r.gbps.is_finite()));
    let runs = bench_transfer(&gpu, Link::HostToDevice, &[(9 << 20) + 4], 1, |_| {}).unwrap();
    assert!(runs.iter().all(|r| r.gbps > 0.0 && r.gbps.is_finite()));
    let err = bench_transfer(&gpu, Link::HostToDevice, &[6], 1, |_| {}).unwrap_err().to_string();
    assert!(err.contains("multiple of 4"), "{err}");
}
