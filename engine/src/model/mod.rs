//! Models, written against [`crate::device::Backend`]. GPT-2 first.

pub mod gpt2;
