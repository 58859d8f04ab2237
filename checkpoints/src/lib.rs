//! Model and data files: Hugging Face model directories of the GPT-2 and Llama families (config.json +
//! safetensors, single or sharded), token files (llm.c's formats and raw tokens, uint16 or uint32),
//! tokenizers (GPT-2 BPE, bytes, Hugging Face tokenizer files), streamed safetensors writing, and the
//! crash-safe checkpoint directory. Formats only: no training logic, no GPU types. Bad input is an
//! error naming the file and what was expected, never a panic or a signal.

pub mod checkpoint;
pub mod config;
pub mod hf;
mod io;
pub use io::StagedFiles;
pub mod llama_config;
mod os;
pub mod safetensors_stream;
pub mod tokenizer;
pub mod tokenizer_files;
pub mod tokens;

pub use config::Gpt2Config;
pub use hf::{ArchConfig, HfModel};
pub use llama_config::LlamaConfig;
pub use tokenizer::{HfTokenizer, TextTokenizer, Tokenizer};
pub use tokenizer_files::DataTokenizer;
pub use tokens::{TokenFile, TokenWidth, stage_token_file_u32, write_token_file, write_token_file_u32};
