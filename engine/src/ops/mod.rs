//! The ops of training, one file per op. Each file holds the plain-Rust twin of the WGSL kernel of
//! the same name in `shaders/wgsl/`: the `cpu` device runs these twins, and the kernel tests compare every
//! GPU kernel against its twin. Twins are written for clarity first, parallelised with rayon where the op
//! is large; shapes are named as in llm.c: B batch, T sequence, C channels, V vocabulary, H heads.
//!
//! One file is not a twin: `matmul_fast` computes the matmul twin's product with the `gemm` crate's
//! run-time dispatched SIMD kernels for the `cpu` device, and its tests compare it with the twin.

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
pub mod gelu_fast;
pub mod gelu_erf;
pub mod layernorm;
pub mod matmul;
pub mod matmul_fast;
pub mod relu;

pub use matmul::{MatmulShape, Operand};

// Llama's ops.
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;
