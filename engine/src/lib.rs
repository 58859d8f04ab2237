//! zerostream's engine: the devices and their kernels, the GPT-2 model, and the `zerostream` binary.
//!
//! Start at [`device::Backend`] (the ops every device implements), then [`model::gpt2`] (GPT-2's forward
//! and backward written against that trait). `docs/ARCHITECTURE.md` has the map of the whole project.

pub mod bench;
pub mod bench_comm;
pub mod bench_io;
pub mod bench_kernels;
pub mod comm;
pub mod device;
pub mod eval;
pub mod generate;
pub mod model;
pub mod ops;
pub mod plot;
pub mod train;
