//! Bad input to the readers and writers: each refusal by name, and bounded property tests that the
//! parsers of token files, safetensors headers and configs never panic and name the file on error.

mod common;
mod fuzz_config;
mod fuzz_safetensors;
mod fuzz_tokens;
mod refusals;
