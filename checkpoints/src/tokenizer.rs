//! Text to token ids and back: GPT-2's byte-pair encoding (through tiktoken-rs, whose `r50k_base` is
//! GPT-2's vocabulary), one token per byte (a 256-entry vocabulary for small character-level models),
//! or any Hugging Face `tokenizer.json` (Llama-3's, Mistral's, Qwen's: through the `tokenizers` crate).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

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

/// A Hugging Face `tokenizer.json`.
#[derive(Clone)]
pub struct HfTokenizer {
    pub path: PathBuf,
    pub(crate) inner: tokenizers::Tokenizer,
}

impl HfTokenizer {
    pub fn from_file(path: &Path) -> Result<Self> {
        let meta = std::fs::metadata(path).with_context(|| format!("tokenizer {}", path.display()))?;
        if !meta.is_file() {
            bail!("tokenizer {}: not a regular file (expected a Hugging Face tokenizer.json)", path.display());
        }
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            anyhow::anyhow!(
                "tokenizer {}: not a Hugging Face tokenizer.json ({})",
                path.display(),
                why_not_a_tokenizer(path, &e.to_string())
            )
        })?;
        Ok(HfTokenizer { path: path.to_path_buf(), inner })
    }

    /// The tokenizer of a model directory: its tokenizer.json, else its vocab.json + merges.txt (a
    /// byte-level BPE such as GPT-2's, as `--save` writes it); None when it has neither.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>> {
        let json = dir.join("tokenizer.json");
        if json.is_file() {
            return Self::from_file(&json).map(Some);
        }
        let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
        if vocab.is_file() && merges.is_file() {
            let inner = byte_level_bpe_from_files(&vocab, &merges)?;
            return Ok(Some(HfTokenizer { path: vocab, inner }));
        }
        Ok(None)
    }

    /// Ids up to the largest one the tokenizer knows, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids of `text`, without special tokens (a training corpus is plain text).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, false).map_err(|e| anyhow::anyhow!("tokenizer {}: {e}", self.path.display()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The token that stands for text the vocabulary lacks (`[UNK]`) and its id, where the model has
    /// one (word-level and word-piece models; a byte-level BPE never needs one).
    pub fn unknown_token(&self) -> Option<(String, u32)> {
        let json: serde_json::Value = serde_json::from_str(&self.inner.to_string(false).ok()?).ok()?;
        let model = &json["model"];
        match (model["unk_token"].as_str(), model["unk_id"].as_u64()) {
            (Some(token), _) => Some((token.to_string(), self.inner.token_to_id(token)?)),
            (None, Some(id)) => Some((self.inner.id_to_token(id as u32)?, id as u32)),
            (None, None) => None,
        }
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        let text = self.inner.decode(ids, false).unwrap_or_else(|e| format!("<undecodable tokens: {e}>"));
        if matches!(self.inner.get_model(), tokenizers::ModelWrapper::WordLevel(_)) {
            return tidy_words(&text);
        }
        text
    }

    /// A word-level tokenizer made from `text` by the tokenizers crate: every word (apostrophes
    /// inside or leading it, as in "Who's" and "'Tis"), punctuation mark and line break is a token,
    /// ids by descending frequency (ties alphabetical, so the same text always gives the same ids),
    /// `[UNK]` = 0 for words the text lacks; decoding joins words with spaces and tidies them
    /// around punctuation. `label` names it in messages.
    pub fn word_level(text: &str, label: &str) -> Result<Self> {
        use tokenizers::models::TrainerWrapper;
        use tokenizers::models::wordlevel::{WordLevel, WordLevelTrainer};
        use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
        let err = |e: tokenizers::Error| anyhow::anyhow!("making the word-level tokenizer {label}: {e}");
        let model = WordLevel::builder().unk_token("[UNK]".into()).build().map_err(err)?;
        let mut inner = tokenizers::Tokenizer::new(model);
        let words = Split::new(SplitPattern::Regex(r"'?\w+(?:'\w+)*|[^\w\s]|\n".into()), tokenizers::SplitDelimiterBehavior::Removed, true)
            .map_err(err)?;
        inner.with_pre_tokenizer(Some(words));
        inner.with_decoder(Some(tokenizers::decoders::wordpiece::WordPiece::new("##".into(), true)));
        let mut trainer: TrainerWrapper = WordLevelTrainer::builder()
            .show_progress(false)
            .vocab_size(usize::MAX)
            .special_tokens(vec![tokenizers::AddedToken::from("[UNK]", true)])
            .build()
            .map_err(|e| anyhow::anyhow!("making the word-level tokenizer {label}: {e}"))?
            .into();
        inner.train(&mut trainer, std::iter::once(text)).map_err(err)?;
        Ok(HfTokenizer { path: PathBuf::from(label), inner })
    }

    /// Writes the tokenizer as a Hugging Face `tokenizer.json` at `path`.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.inner.save(path, false).map_err(|e| anyhow::anyhow!("writing the tokenizer {}: {e}", path.display()))
    }

    /// The tokenizer as the text of a Hugging Face `tokenizer.json`.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        let text = self.inner.to_string(false).map_err(|e| anyhow::anyhow!("serialising the tokenizer {}: {e}", self.path.display()))?;
        Ok(text.into_bytes())
    }
}

/// Word-level decoding joins every token with a space: take the spaces back out before closing
/// punctuation, after opening brackets, and around line breaks; and show a run of blank lines (which a
/// small model emits often, the line break being the commonest token) as one.
fn tidy_words(text: &str) -> String {
    let lines = text.split('\n').map(|line| {
        let mut out = String::with_capacity(line.len());
        for c in line.trim().chars() {
            if matches!(c, ',' | '.' | ';' | ':' | '!' | '?' | ')' | ']') && out.ends_with(' ') {
                out.pop();
            }
            if c == ' ' && (out.ends_with('(') || out.ends_with('[')) {
                continue;
            }
            out.push(c);
        }
        out
    });
    let mut out = lines.collect::<Vec<_>>().join("\n");
    while out.contains("\n\n\n") {
        out = out.replace("\n\n\n", "\n\n");
    }
    out
}

/// What `prepare --tokenizer` names: a built-in tokenizer or a tokenizer.json.
#[allow(clippy::large_enum_variant, reason = "one per command; boxing would buy nothing")]
pub enum TextTokenizer {
    Builtin(Tokenizer),
    Hf(HfTokenizer),
}

impl TextTokenizer {
    /// `gpt2`, `bytes`, the path of a Hugging Face tokenizer.json, or a model directory, meaning the
    /// tokenizer it carries.
    pub fn parse(spec: &str) -> Result<Self> {
        match spec {
            "gpt2" => Ok(TextTokenizer::Builtin(Tokenizer::Gpt2)),
            "bytes" => Ok(TextTokenizer::Builtin(Tokenizer::Bytes)),
            dir if Path::new(dir).is_dir() => match HfTokenizer::from_model_dir(Path::new(dir))? {
                Some(t) => Ok(TextTokenizer::Hf(t)),
                None => bail!("--tokenizer {dir}: a directory without tokenizer.json, or vocab.json and merges.txt"),
            },
            path if Path::new(path).exists() => Ok(TextTokenizer::Hf(HfTokenizer::from_file(Path::new(path))?)),
            other => bail!(
                "--tokenizer {other:?}: expected gpt2, bytes, the path of a Hugging Face tokenizer.json or a model directory (no such file)"
            ),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            TextTokenizer::Builtin(t) => t.vocab_size(),
            TextTokenizer::Hf(t) => t.vocab_size(),
        }
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            TextTokenizer::Builtin(t) => Ok(t.encode(text)?.into_iter().map(u32::from).collect()),
            TextTokenizer::Hf(t) => t.encode(text),
        }
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            TextTokenizer::Builtin(t) => t.decode(ids),
            TextTokenizer::Hf(t) => t.decode(ids),
        }
    }

    /// [`HfTokenizer::unknown_token`]; the built-in tokenizers cover every text.
    pub fn unknown_token(&self) -> Option<(String, u32)> {
        match self {
            TextTokenizer::Builtin(_) => None,
            TextTokenizer::Hf(t) => t.unknown_token(),
        }
    }

    /// The token written between documents: GPT-2's <|endoftext|> (50256), a tokenizer.json's eos token
    /// when it names one; none for bytes.
    pub fn end_of_text(&self) -> Option<u32> {
        match self {
            TextTokenizer::Builtin(Tokenizer::Gpt2) => Some(50256),
            TextTokenizer::Builtin(Tokenizer::Bytes) => None,
            TextTokenizer::Hf(t) => {
                ["<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>", "<eos>"].iter().find_map(|w| t.inner.token_to_id(w))
            }
        }
    }

    /// The token an unconditional sample starts from, and its text: the begin-of-text token where the
    /// vocabulary has one (Llama's `<|begin_of_text|>`, `<s>`), else the end-of-text token (GPT-2's
    /// `<|endoftext|>`, which GPT-2 starts from).
    pub fn start_token(&self) -> Option<(u32, String)> {
        if let TextTokenizer::Hf(t) = self
            && let Some((w, id)) = ["<|begin_of_text|>", "<s>", "<bos>"].iter().find_map(|w| t.inner.token_to_id(w).map(|id| (w, id)))
        {
            return Some((id, w.to_string()));
        }
        self.end_of_text().map(|id| (id, self.decode(&[id])))
    }

    pub fn describe(&self) -> String {
        match self {
            TextTokenizer::Builtin(Tokenizer::Gpt2) => "gpt2".into(),
            TextTokenizer::Builtin(Tokenizer::Bytes) => "bytes".into(),
            TextTokenizer::Hf(t) => t.path.display().to_string(),
        }
    }
}

/// Why `path` did not load as a tokenizer, in words: the tokenizers crate's parse error alone reads as
/// a syntax error even for well-formed JSON of another kind (a config.json given by mistake).
fn why_not_a_tokenizer(path: &Path, error: &str) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    match serde_json::from_slice::<serde_json::Value>(&text) {
        Err(e) => format!("not JSON: {e}"),
        Ok(serde_json::Value::Object(o)) if o.is_empty() => "an empty JSON object".to_string(),
        Ok(serde_json::Value::Object(o)) if !o.contains_key("model") => {
            let keys: Vec<&str> = o.keys().take(5).map(String::as_str).collect();
            format!("JSON without a tokenizer's \"model\" entry; its keys: {}", keys.join(", "))
        }
        Ok(serde_json::Value::Object(_)) => error.to_string(),
        Ok(_) => "JSON, but not an object".to_string(),
    }
}

/// A tokenizer for a model directory holding `vocab.json` and `merges.txt` (a byte-level BPE such as
/// GPT-2's), built the way transformers' GPT2TokenizerFast builds it.
pub fn byte_level_bpe_from_files(vocab: &Path, merges: &Path) -> Result<tokenizers::Tokenizer> {
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    let (v, m) = (vocab.to_str().context("vocab.json: a UTF-8 path")?, merges.to_str().context("merges.txt: a UTF-8 path")?);
    let model = BPE::from_file(v, m)
        .build()
        .map_err(|e| anyhow::anyhow!("{} and {}: not a byte-level BPE vocabulary and merges ({e})", vocab.display(), merges.display()))?;
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tok.with_decoder(Some(ByteLevel::default()));
    Ok(tok)
}

#[cfg(test)]
pub(crate) mod tests {
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

    /// A word-level tokenizer.json with one id above 65535, written by the tokenizers crate itself.
    pub(crate) fn word_level_tokenizer(dir: &Path) -> PathBuf {
        use tokenizers::models::wordlevel::WordLevel;
        use tokenizers::pre_tokenizers::whitespace::Whitespace;
        let vocab =
            [("[UNK]", 0u32), ("to", 1), ("be", 2), ("or", 3), ("not", 70_000)].into_iter().map(|(w, i)| (w.to_string(), i)).collect();
        let model = WordLevel::builder().vocab(vocab).unk_token("[UNK]".into()).build().unwrap();
        let mut tok = tokenizers::Tokenizer::new(model);
        tok.with_pre_tokenizer(Some(Whitespace {}));
        let path = dir.join("tokenizer.json");
        tok.save(&path, false).unwrap();
        path
    }

    #[test]
    fn word_level_tokenizers_are_deterministic_and_round_trip_words() {
        let text = "BERNARDO\nWho's there?\n\nFRANCISCO\nNay, answer me: stand, and unfold yourself.\n'Tis there, there.\n";
        let tok = HfTokenizer::word_level(text, "test").unwrap();
        let again = HfTokenizer::word_level(text, "test").unwrap();
        let ids = tok.encode(text).unwrap();
        assert_eq!(ids, again.encode(text).unwrap(), "the same text gives the same ids");
        // [UNK] is 0, then by frequency: the line break (7), then "," and "there" (3 each, alphabetical).
        assert_eq!(tok.encode(", there").unwrap(), vec![2, 3]);
        assert_eq!(tok.encode("Hamlet").unwrap(), vec![0]);
        assert_eq!(tok.unknown_token(), Some(("[UNK]".to_string(), 0)));
        assert_eq!(TextTokenizer::parse("gpt2").unwrap().unknown_token(), None, "a byte-level BPE covers every text");
        let words: Vec<String> = ids.iter().map(|&i| tok.inner.id_to_token(i).unwrap()).collect();
        assert!(words.contains(&"Who's".to_string()) && words.contains(&"'Tis".to_string()), "{words:?}");
        assert_eq!(tok.decode(&ids), text, "words, punctuation and lines come back");
        let breaks = tok.encode("\n").unwrap();
        assert_eq!(
            tok.decode(&[ids.clone(), breaks.repeat(5), ids.clone()].concat()),
            format!("{text}\n{text}"),
            "blank lines shown as one"
        );
        let dir = tempfile::tempdir().unwrap();
        tok.save(&dir.path().join("tokenizer.json")).unwrap();
        let loaded = HfTokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
        assert_eq!(loaded.encode(text).unwrap(), ids);
    }

    #[test]
    fn hugging_face_tokenizer_files_encode_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = word_level_tokenizer(dir.path());
        let tok = TextTokenizer::parse(path.to_str().unwrap()).unwrap();
        assert_eq!(tok.encode("to be or not to be").unwrap(), vec![1, 2, 3, 70_000, 1, 2]);
        assert_eq!(tok.encode("question").unwrap(), vec![0]);
        let TextTokenizer::Hf(hf) = &tok else { panic!() };
        assert_eq!(hf.decode(&[1, 2]), "to be");
        std::fs::write(dir.path().join("bad.json"), "{ not a tokenizer").unwrap();
        let err = TextTokenizer::parse(dir.path().join("bad.json").to_str().unwrap()).err().unwrap().to_string();
        assert!(err.contains("bad.json") && err.contains("not a Hugging Face tokenizer.json (not JSON:"), "{err}");
        // Well-formed JSON of another kind: said so, with its keys, not as a syntax error.
        std::fs::write(dir.path().join("config.json"), r#"{"n_embd": 768, "n_layer": 12}"#).unwrap();
        let err = TextTokenizer::parse(dir.path().join("config.json").to_str().unwrap()).err().unwrap().to_string();
        assert!(err.contains("JSON without a tokenizer's \"model\" entry; its keys: n_embd, n_layer"), "{err}");
        std::fs::write(dir.path().join("empty.json"), "{}").unwrap();
        let err = TextTokenizer::parse(dir.path().join("empty.json").to_str().unwrap()).err().unwrap().to_string();
        assert!(err.contains("not a Hugging Face tokenizer.json (an empty JSON object)"), "{err}");
        let err = TextTokenizer::parse("llama").err().unwrap().to_string();
        assert!(err.contains("--tokenizer \"llama\""), "{err}");
        assert!(matches!(TextTokenizer::parse("gpt2").unwrap(), TextTokenizer::Builtin(Tokenizer::Gpt2)));
    }
}
