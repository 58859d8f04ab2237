//! The harness of the kernel tests: run one generic case on the cpu device (the twins), the GPU, and
//! the GPU with 64 KiB bindings, and compare every output with the cpu's.

use zerostream::device::Backend;

use super::assert_close;

/// A case's named outputs.
pub type Outputs = Vec<(String, Vec<f32>)>;

/// Runs the generic case `$case::<D>(&dev)` on the cpu device, the GPU, and the GPU with 64 KiB
/// bindings (so the paths that split large tensors into windows run at sizes a test can afford), and
/// compares every output with the cpu's within `atol + rtol * |ref|`.
#[macro_export]
macro_rules! check {
    ($name:literal, $case:ident, $atol:expr, $rtol:expr) => {{
        let want: common::kernel_check::Outputs = $case(&zerostream::device::CpuDevice::new(None));
        if let Some(gpu) = common::gpu_or_skip($name) {
            let got = $case(&gpu);
            common::kernel_check::compare($name, "gpu", &got, &want, $atol, $rtol);
            let mut small = common::gpu_or_skip($name).unwrap();
            small.limit_binding_bytes_for_tests(64 << 10);
            let got = $case(&small);
            common::kernel_check::compare($name, "gpu with 64 KiB bindings", &got, &want, $atol, $rtol);
        }
    }};
}

pub fn compare(name: &str, label: &str, got: &Outputs, want: &Outputs, atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len());
    for ((n, g), (_, w)) in got.iter().zip(want) {
        assert_close(&format!("{name}: {n} on {label}"), g, w, atol, rtol);
    }
}

/// A device tensor holding `data`.
pub fn tensor<D: Backend>(dev: &D, data: &[f32]) -> D::Tensor {
    let t = dev.alloc(data.len(), "test").unwrap();
    dev.write(&t, data);
    t
}
