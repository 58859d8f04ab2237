//! The ops of training, mostly one file per op, holding the plain-Rust twin of the WGSL kernels of the
//! same name in `shaders/wgsl/` (`gelu.rs`: `gelu_forward` and `gelu_backward`): the `cpu` device runs
//! these twins, and the kernel tests compare every GPU kernel against its twin. Twins are written for
//! clarity first, parallelised with rayon where the op is large; shapes are named as in llm.c: B batch,
//! T sequence, C channels, V vocabulary, H heads. Files not named after a kernel: `elementwise.rs` (the
//! twins of the small kernels: residual add, fill, axpy, sum of squares, the casts; and the trainer's
//! host passes over whole gradients), `matmul_f16.rs` (the twin of `matmul_coop.wgsl`), `activation.rs`
//! (which activation a GPT-2 config names, each in its own twin file), `fast_math.rs` (below) and
//! `step_times.rs` (tests only: the cpu device's ops timed at one step's shapes). Also here, two numbers of
//! the kernels' geometry the twins and the gpu device share: [`MAX_GRID_DIM`] and [`COLUMN_BLOCK_ROWS`].
//!
//! The `*_fast` files are not twins: they are the `cpu` device's fast kernels for the ops that dominate a
//! training step (`matmul_fast` through the `gemm` crate's run-time dispatched SIMD kernels,
//! `attention_fast`, `gelu_fast`, `crossentropy_fast`, and `fast_math`, what the last three share;
//! `reduce_fast`, the sums over rows of bias_backward and layernorm_backward, equal to the twins' bits). Each
//! computes its twin's function, is tested against the twin on seeded random inputs, and gives the same
//! bits on any number of threads.

pub mod activation;
pub mod attention;
pub mod attention_decode;
pub mod attention_fast;
pub mod crossentropy;
pub mod crossentropy_fast;
pub mod dropout;
pub mod elementwise;
pub mod encoder;
pub mod fast_math;
pub mod gelu;
pub mod gelu_erf;
pub mod gelu_fast;
pub mod layernorm;
pub mod matmul;
pub mod matmul_f16;
pub mod matmul_fast;
pub mod reduce_fast;
pub mod relu;
#[cfg(test)]
mod step_times;

pub use matmul::{MatmulShape, Operand};

/// The most workgroups a dispatch may have along one dimension (WebGPU's
/// `maxComputeWorkgroupsPerDimension`, which every adapter wgpu opens allows): past it a grid folds
/// into a second dimension, or the kernel refuses the shape.
pub const MAX_GRID_DIM: usize = 65535;

/// Rows one workgroup of the GPU's column sums covers (`shaders/wgsl/common/column_lanes.wgsl`): the twin
/// that mirrors those kernels' order (rmsnorm's weight gradient) blocks its rows alike.
pub const COLUMN_BLOCK_ROWS: usize = 64;

// Llama's ops.
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;
