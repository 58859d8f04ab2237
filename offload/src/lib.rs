//! Host-side training state: the CPU AdamW (and, as they land, the RAM and NVMe storage tiers and
//! their I/O engine). This crate knows nothing of GPUs: the engine hands it slices of host memory.

pub mod adam;
pub mod membw;

pub use adam::{AdamConfig, AdamW, Grads, Isa, ParamCopy};
