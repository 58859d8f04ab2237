//! The tokenizer a token file was prepared with, and the files that let a saved model directory carry
//! it, so `AutoTokenizer.from_pretrained(dir)` (and `zerostream generate`) tokenise as training did.
//!
//! `zerostream prepare --out book.bin` writes `book.bin.tokenizer` beside the token file: the word
//! `gpt2` or `bytes`, or a verbatim copy of the Hugging Face tokenizer.json it was given. `train` reads it
//! (or takes `--tokenizer`) and writes into every saved model directory and checkpoint:
//! - GPT-2's BPE: `vocab.json` and `merges.txt` as transformers' `GPT2Tokenizer` expects them, derived
//!   from tiktoken's ranks (token bytes shown through GPT-2's byte-to-unicode table; each merge recovered
//!   by re-running BPE on a token's bytes with only the merges of lower rank), plus
//!   `tokenizer_config.json` and `special_tokens_map.json` (`<|endoftext|>` as bos, eos and unk);
//! - a tokenizer.json: copied;
//! - bytes: nothing (no Hugging Face tokenizer is one token per byte of UTF-8 without a vocabulary file).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::tokenizer::{HfTokenizer, TextTokenizer, Tokenizer};

/// What a token file was tokenised with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataTokenizer {
    /// GPT-2's BPE (tiktoken's r50k_base).
    Gpt2,
    /// One token per byte.
    Bytes,
    /// A Hugging Face tokenizer.json: its bytes, as given.
    Json(Vec<u8>),
}

/// GPT-2's end-of-text token, its only special token.
const END_OF_TEXT: &str = "<|endoftext|>";
const END_OF_TEXT_ID: u32 = 50256;

impl DataTokenizer {
    /// `gpt2`, `bytes`, the path of a Hugging Face tokenizer.json (checked to load), or a model
    /// directory, meaning the tokenizer it carries; `flag` names the option in errors.
    pub fn parse(spec: &str, flag: &str) -> Result<Self> {
        match spec {
            "gpt2" => Ok(DataTokenizer::Gpt2),
            "bytes" => Ok(DataTokenizer::Bytes),
            dir if Path::new(dir).is_dir() => Self::of_model_dir(Path::new(dir))
                .with_context(|| format!("{flag} {dir}"))?
                .with_context(|| format!("{flag} {dir}: a directory without tokenizer.json, or vocab.json and merges.txt")),
            path if Path::new(path).exists() => {
                HfTokenizer::from_file(Path::new(path)).with_context(|| format!("{flag} {path}"))?;
                Ok(DataTokenizer::Json(std::fs::read(path).with_context(|| format!("{flag}: reading {path}"))?))
            }
            other => bail!(
                "{flag} {other:?}: expected gpt2, bytes, the path of a Hugging Face tokenizer.json or a model directory (no such file)"
            ),
        }
    }

    /// The tokenizer a model directory carries (its tokenizer.json, or GPT-2's vocab.json and
    /// merges.txt) as a record; None where it carries none.
    pub fn of_model_dir(dir: &Path) -> Result<Option<Self>> {
        let json = dir.join("tokenizer.json");
        if json.is_file() {
            return Ok(Some(DataTokenizer::Json(std::fs::read(&json).with_context(|| format!("reading {}", json.display()))?)));
        }
        let Some(tok) = HfTokenizer::from_model_dir(dir)? else { return Ok(None) };
        let json = tok.inner.to_string(false).map_err(|e| anyhow::anyhow!("{}: {e}", tok.path.display()))?;
        Ok(Some(DataTokenizer::Json(json.into_bytes())))
    }

    /// Refuses data tokenised with this tokenizer (`what`: where the run learnt which, e.g. the record
    /// beside `--data`) where the model directory carries another: a loss over other ids would mean
    /// nothing. Nothing to check where the model carries none.
    pub fn check_fits_model(&self, model_dir: &Path, what: &str) -> Result<()> {
        if let Some(model) = Self::of_model_dir(model_dir)?
            && !model.same_as(self)
        {
            bail!(
                "{what}: the data's tokenizer is {}, not the tokenizer of the model {}: prepare the data with \
                 `zerostream prepare --tokenizer {}`",
                self.describe(),
                model_dir.display(),
                model_dir.display()
            );
        }
        Ok(())
    }

    /// The tokenizer itself, to encode and decode with; `label` names a tokenizer.json's source in errors.
    pub fn text_tokenizer(&self, label: &Path) -> Result<TextTokenizer> {
        Ok(match self {
            DataTokenizer::Gpt2 => TextTokenizer::Builtin(Tokenizer::Gpt2),
            DataTokenizer::Bytes => TextTokenizer::Builtin(Tokenizer::Bytes),
            DataTokenizer::Json(bytes) => {
                let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| anyhow::anyhow!("tokenizer {}: {e}", label.display()))?;
                TextTokenizer::Hf(HfTokenizer { path: label.to_path_buf(), inner })
            }
        })
    }

    /// `book.bin` -> `book.bin.tokenizer`: where `prepare` records the tokenizer of a token file.
    pub fn sidecar(token_file: &Path) -> PathBuf {
        let mut name = token_file.file_name().unwrap_or_default().to_os_string();
        name.push(".tokenizer");
        token_file.with_file_name(name)
    }

    /// The tokenizer recorded beside `token_file`, if there is a record; one that cannot be read or
    /// understood is an error naming it.
    pub fn read_beside(token_file: &Path) -> Result<Option<Self>> {
        let path = Self::sidecar(token_file);
        if !path.exists() {
            return Ok(None);
        }
        let bytes = crate::io::read_regular_text(&path, "tokenizer record")?.into_bytes();
        let tok = match String::from_utf8_lossy(&bytes).trim() {
            "gpt2" => DataTokenizer::Gpt2,
            "bytes" => DataTokenizer::Bytes,
            text if text.starts_with('{') => {
                tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
                    anyhow::anyhow!("{}: not a Hugging Face tokenizer.json ({e}); `zerostream prepare` writes this file", path.display())
                })?;
                DataTokenizer::Json(bytes)
            }
            _ => bail!(
                "{}: expected `gpt2`, `bytes` or a Hugging Face tokenizer.json (the record `zerostream prepare` writes of the \
                 tokenizer of {})",
                path.display(),
                token_file.display()
            ),
        };
        Ok(Some(tok))
    }

    /// Records this tokenizer beside `token_file` (written aside and renamed into place).
    pub fn write_beside(&self, token_file: &Path) -> Result<PathBuf> {
        let mut staged = crate::StagedFiles::default();
        let path = self.stage_beside(&mut staged, token_file)?;
        staged.commit()?;
        Ok(path)
    }

    /// [`Self::write_beside`] staged with other files (the token file it describes), to be renamed
    /// into place with them.
    pub fn stage_beside(&self, staged: &mut crate::StagedFiles, token_file: &Path) -> Result<PathBuf> {
        let path = Self::sidecar(token_file);
        let bytes: &[u8] = match self {
            DataTokenizer::Gpt2 => b"gpt2\n",
            DataTokenizer::Bytes => b"bytes\n",
            DataTokenizer::Json(bytes) => bytes,
        };
        staged.stage(&path, bytes)?;
        Ok(path)
    }

    /// Refuses a model whose vocabulary is smaller than this tokenizer's (its files would name ids the
    /// model does not have).
    pub fn check_vocab(&self, model_vocab: usize) -> Result<()> {
        let ours = match self {
            DataTokenizer::Gpt2 => Tokenizer::Gpt2.vocab_size(),
            DataTokenizer::Bytes => Tokenizer::Bytes.vocab_size(),
            DataTokenizer::Json(bytes) => tokenizers::Tokenizer::from_bytes(bytes)
                .map_err(|e| anyhow::anyhow!("the data's tokenizer.json: {e}"))?
                .get_vocab(true)
                .values()
                .max()
                .map_or(0, |&id| id as usize + 1),
        };
        if model_vocab < ours {
            bail!(
                "the data was tokenised with {} ({ours} tokens), but the model's vocab_size is {model_vocab}: pass --tokenizer to name the right one",
                self.describe()
            );
        }
        Ok(())
    }

    /// Whether two records give ids one meaning: the same record (for tokenizer.json the same JSON,
    /// however it is spaced), or the same vocabulary, id for id — GPT-2's tokenizer.json and the
    /// built-in `gpt2` agree so.
    pub fn same_as(&self, other: &DataTokenizer) -> bool {
        if self == other {
            return true;
        }
        let same_json = match (self, other) {
            (DataTokenizer::Json(a), DataTokenizer::Json(b)) => {
                matches!((serde_json::from_slice::<serde_json::Value>(a), serde_json::from_slice::<serde_json::Value>(b)), (Ok(x), Ok(y)) if x == y)
            }
            _ => false,
        };
        same_json || matches!((self.vocab(), other.vocab()), (Some(x), Some(y)) if x == y)
    }

    /// Each token's text (byte-level BPE's printable form for GPT-2) and id; None for bytes, whose ids
    /// are the bytes themselves, and for a JSON the tokenizers crate cannot read.
    fn vocab(&self) -> Option<HashMap<String, u32>> {
        match self {
            DataTokenizer::Gpt2 => {
                let table = bytes_to_unicode();
                let mut vocab: HashMap<String, u32> = gpt2_tokens().ok()?.iter().zip(0..).map(|(t, id)| (shown(&table, t), id)).collect();
                vocab.insert(END_OF_TEXT.into(), END_OF_TEXT_ID);
                Some(vocab)
            }
            DataTokenizer::Json(bytes) => tokenizers::Tokenizer::from_bytes(bytes).ok().map(|t| t.get_vocab(true)),
            DataTokenizer::Bytes => None,
        }
    }

    /// `gpt2`, `bytes` or `tokenizer.json`.
    pub fn describe(&self) -> &'static str {
        match self {
            DataTokenizer::Gpt2 => "gpt2",
            DataTokenizer::Bytes => "bytes",
            DataTokenizer::Json(_) => "tokenizer.json",
        }
    }

    /// Every name [`Self::model_files`] gives (a model directory's tokenizer files).
    pub const FILE_NAMES: &'static [&'static str] =
        &["vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"];

    /// The files (name, contents) a model directory gets for this tokenizer; `model_max_length` is the
    /// model's context length. Empty for bytes.
    pub fn model_files(&self, model_max_length: usize) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(match self {
            DataTokenizer::Bytes => Vec::new(),
            DataTokenizer::Json(bytes) => vec![("tokenizer.json".into(), bytes.clone())],
            DataTokenizer::Gpt2 => {
                let (vocab, merges) = gpt2_vocab_and_merges()?;
                let special = serde_json::json!({ "bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT });
                let mut config = special.clone();
                config["tokenizer_class"] = "GPT2Tokenizer".into();
                config["model_max_length"] = model_max_length.into();
                config["add_prefix_space"] = false.into();
                config["errors"] = "replace".into();
                vec![
                    ("vocab.json".into(), vocab.into_bytes()),
                    ("merges.txt".into(), merges.into_bytes()),
                    ("tokenizer_config.json".into(), serde_json::to_vec_pretty(&config)?),
                    ("special_tokens_map.json".into(), serde_json::to_vec_pretty(&special)?),
                ]
            }
        })
    }
}

/// GPT-2's table from bytes to printable characters (`bytes_to_unicode` in its encoder.py): printable
/// Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order.
fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("a valid char")
        };
    }
    table
}

/// `bytes` in byte-level BPE's printable form (`table` from [`bytes_to_unicode`]).
fn shown(table: &[char; 256], bytes: &[u8]) -> String {
    bytes.iter().map(|&b| table[b as usize]).collect()
}

/// GPT-2's tokens but the end-of-text one, as bytes, in id order.
fn gpt2_tokens() -> Result<Vec<Vec<u8>>> {
    let bpe = tiktoken_rs::r50k_base_singleton();
    (0..END_OF_TEXT_ID).map(|id| bpe.decode_bytes(&[id]).map_err(|e| anyhow::anyhow!("GPT-2 token {id}: {e}"))).collect()
}

/// The parts BPE leaves `token` in when only merges of rank below `max_rank` may apply (tiktoken's
/// merge rule: always the adjacent pair whose concatenation has the lowest rank).
fn bpe_parts<'a>(token: &'a [u8], ranks: &HashMap<&[u8], u32>, max_rank: u32) -> Vec<&'a [u8]> {
    let mut bounds: Vec<usize> = (0..=token.len()).collect();
    loop {
        let best = (0..bounds.len().saturating_sub(2))
            .filter_map(|i| ranks.get(&token[bounds[i]..bounds[i + 2]]).map(|&r| (r, i)))
            .filter(|&(r, _)| r < max_rank)
            .min();
        let Some((_, i)) = best else { break };
        bounds.remove(i + 1);
    }
    bounds.windows(2).map(|w| &token[w[0]..w[1]]).collect()
}

/// GPT-2's `vocab.json` and `merges.txt`, from tiktoken's r50k_base ranks.
pub fn gpt2_vocab_and_merges() -> Result<(String, String)> {
    let tokens = gpt2_tokens()?;
    let ranks: HashMap<&[u8], u32> = tokens.iter().enumerate().map(|(id, t)| (t.as_slice(), id as u32)).collect();
    let table = bytes_to_unicode();
    let shown = |bytes: &[u8]| shown(&table, bytes);
    let mut vocab = serde_json::Map::new();
    let mut merges = String::from("#version: 0.2\n");
    for (id, token) in tokens.iter().enumerate() {
        vocab.insert(shown(token), (id as u32).into());
        if token.len() > 1 {
            let parts = bpe_parts(token, &ranks, id as u32);
            let [a, b] = parts.as_slice() else {
                bail!("GPT-2 token {id} is not the merge of two lower-ranked tokens ({} parts)", parts.len());
            };
            merges.push_str(&format!("{} {}\n", shown(a), shown(b)));
        }
    }
    vocab.insert(END_OF_TEXT.into(), END_OF_TEXT_ID.into());
    Ok((serde_json::to_string(&vocab)?, merges))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_vocab_and_merges_encode_like_the_builtin_gpt2() {
        let dir = tempfile::tempdir().unwrap();
        let files = DataTokenizer::Gpt2.model_files(1024).unwrap();
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"]);
        let json = DataTokenizer::Json(b"{}".to_vec()).model_files(1024).unwrap();
        assert!(names.iter().all(|n| DataTokenizer::FILE_NAMES.contains(n)));
        assert!(json.iter().all(|(n, _)| DataTokenizer::FILE_NAMES.contains(&n.as_str())));
        for (name, bytes) in &files {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let merges = std::fs::read_to_string(dir.path().join("merges.txt")).unwrap();
        assert_eq!(merges.lines().count(), 1 + 50000, "GPT-2 has 50000 merges");
        assert!(merges.lines().nth(1) == Some("Ġ t"), "GPT-2's first merge is \"Ġ t\": {:?}", merges.lines().nth(1));
        let tok = crate::tokenizer::byte_level_bpe_from_files(&dir.path().join("vocab.json"), &dir.path().join("merges.txt")).unwrap();
        assert_eq!(tok.get_vocab_size(true), 50257);
        for text in [
            "Who's there? Nay, answer me: stand, and unfold yourself.",
            "  leading spaces,\ttabs\nand newlines\n\n",
            "naïve café — 東京 🦀 1234567 don't I'll we've",
            "indivisibility antidisestablishmentarianism",
        ] {
            let ours: Vec<u32> = tok.encode(text, false).unwrap().get_ids().to_vec();
            let builtin: Vec<u32> = Tokenizer::Gpt2.encode(text).unwrap().into_iter().map(u32::from).collect();
            assert_eq!(ours, builtin, "{text:?}");
            assert_eq!(tok.decode(&ours, false).unwrap(), text);
        }
    }

    #[test]
    fn sidecars_round_trip_and_bad_ones_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("book.bin");
        assert_eq!(DataTokenizer::read_beside(&data).unwrap(), None);
        for tok in [DataTokenizer::Gpt2, DataTokenizer::Bytes] {
            tok.write_beside(&data).unwrap();
            assert_eq!(DataTokenizer::read_beside(&data).unwrap(), Some(tok));
        }
        assert_eq!(DataTokenizer::sidecar(&data), dir.path().join("book.bin.tokenizer"));
        let json = crate::tokenizer::tests::word_level_tokenizer(dir.path());
        let tok = DataTokenizer::parse(json.to_str().unwrap(), "--tokenizer").unwrap();
        tok.write_beside(&data).unwrap();
        assert_eq!(DataTokenizer::read_beside(&data).unwrap(), Some(tok.clone()));
        assert_eq!(tok.model_files(8).unwrap(), vec![("tokenizer.json".to_string(), std::fs::read(&json).unwrap())]);
        assert!(DataTokenizer::Bytes.model_files(8).unwrap().is_empty());
        assert!(DataTokenizer::Gpt2.check_vocab(50304).is_ok() && tok.check_vocab(70_001).is_ok());
        let err = DataTokenizer::Gpt2.check_vocab(256).unwrap_err().to_string();
        assert!(err.contains("gpt2 (50257 tokens)") && err.contains("vocab_size is 256"), "{err}");
        assert!(tok.check_vocab(70_000).is_err(), "the word-level tokenizer's largest id is 70000");
        std::fs::write(DataTokenizer::sidecar(&data), "sentencepiece\n").unwrap();
        let err = DataTokenizer::read_beside(&data).unwrap_err().to_string();
        assert!(err.contains("book.bin.tokenizer") && err.contains("expected `gpt2`"), "{err}");
        std::fs::write(DataTokenizer::sidecar(&data), "{ broken").unwrap();
        let err = DataTokenizer::read_beside(&data).unwrap_err().to_string();
        assert!(err.contains("book.bin.tokenizer") && err.contains("not a Hugging Face tokenizer.json"), "{err}");
        let err = DataTokenizer::parse("sentencepiece", "--tokenizer").unwrap_err().to_string();
        assert!(err.contains("--tokenizer \"sentencepiece\""), "{err}");
    }

    #[test]
    fn gpt2s_tokenizer_json_and_the_builtin_gpt2_are_one_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in DataTokenizer::Gpt2.model_files(1024).unwrap() {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let tok = crate::tokenizer::byte_level_bpe_from_files(&dir.path().join("vocab.json"), &dir.path().join("merges.txt")).unwrap();
        let json = DataTokenizer::Json(tok.to_string(false).unwrap().into_bytes());
        assert!(json.same_as(&DataTokenizer::Gpt2) && DataTokenizer::Gpt2.same_as(&json));
        let words = DataTokenizer::Json(std::fs::read(crate::tokenizer::tests::word_level_tokenizer(dir.path())).unwrap());
        assert!(!words.same_as(&DataTokenizer::Gpt2) && !words.same_as(&json) && !DataTokenizer::Bytes.same_as(&DataTokenizer::Gpt2));
        assert!(words.same_as(&words.clone()));
    }
}
