//! Text to token ids and back: GPT-2's byte-pair encoding (through tiktoken-rs, whose `r50k_base` is
//! GPT-2's vocabulary) or one token per byte (a 256-entry vocabulary for small character-level models).

use anyhow::{Result, bail};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Tokenizer {
    /// GPT-2's BPE: 50257 tokens.
    Gpt2,
    /// One token per byte of UTF-8: 256 tokens.
    Bytes,
}

impl Tokenizer {
    pub fn vocab_size(self) -> usize {
        match self {
            Tokenizer::Gpt2 => 50257,
            Tokenizer::Bytes => 256,
        }
    }

    /// The tokenizer a model of `vocab_size` was most likely trained with, if any.
    pub fn for_vocab(vocab_size: usize) -> Option<Self> {
        match vocab_size {
            256 => Some(Tokenizer::Bytes),
            50257..=50304 => Some(Tokenizer::Gpt2),
            _ => None,
        }
    }

    pub fn encode(self, text: &str) -> Result<Vec<u16>> {
        match self {
            Tokenizer::Bytes => Ok(text.bytes().map(u16::from).collect()),
            Tokenizer::Gpt2 => {
                let bpe = tiktoken_rs::r50k_base_singleton();
                let ids = bpe.encode_ordinary(text);
                if let Some(bad) = ids.iter().find(|&&t| t > u16::MAX as u32) {
                    bail!("token id {bad} does not fit 16 bits");
                }
                Ok(ids.into_iter().map(|t| t as u16).collect())
            }
        }
    }

    /// Decodes, replacing bytes that are not valid UTF-8 (a sample may stop mid-character).
    pub fn decode(self, ids: &[u32]) -> String {
        match self {
            Tokenizer::Bytes => String::from_utf8_lossy(&ids.iter().map(|&t| t as u8).collect::<Vec<u8>>()).into_owned(),
            Tokenizer::Gpt2 => {
                let bpe = tiktoken_rs::r50k_base_singleton();
                match bpe.decode_bytes(ids) {
                    Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    Err(e) => format!("<undecodable tokens: {e}>"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_bpe_and_bytes_round_trip() {
        let text = "Who's there? Nay, answer me: stand, and unfold yourself.";
        let ids = Tokenizer::Gpt2.encode(text).unwrap();
        assert_eq!(&ids[..3], &[8241, 338, 612], "GPT-2 ids of \"Who\", \"'s\", \" there\"");
        let wide: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
        assert_eq!(Tokenizer::Gpt2.decode(&wide), text);
        let bytes = Tokenizer::Bytes.encode(text).unwrap();
        assert_eq!(bytes.len(), text.len());
        assert_eq!(Tokenizer::Bytes.decode(&bytes.iter().map(|&t| t as u32).collect::<Vec<_>>()), text);
    }
}
