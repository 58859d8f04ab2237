//! The ops of GPT-2 training, one file per op. Each file holds the plain-Rust twin of the WGSL kernel of
//! the same name in `shaders/wgsl/`: the `cpu` device runs these twins, and the kernel tests compare every
//! GPU kernel against its twin. Twins are written for clarity first, parallelised with rayon where the op
//! is large; shapes are named as in llm.c: B batch, T sequence, C channels, V vocabulary, NH heads.

pub mod activation;
pub mod attention;
pub mod crossentropy;
pub mod elementwise;
pub mod encoder;
pub mod gelu;
pub mod gelu_erf;
pub mod layernorm;
pub mod matmul;
pub mod relu;

pub use matmul::{MatmulShape, Operand};

// Llama's ops.
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;
