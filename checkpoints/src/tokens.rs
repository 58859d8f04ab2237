//! Token files: llm.c's format (a 256 x int32 little-endian header: magic 20240520, version 1, token
//! count; then uint16 tokens) or raw little-endian uint16 (nanoGPT's `.bin`). Memory-mapped.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memmap2::Mmap;

pub const LLMC_MAGIC: i32 = 20240520;
const HEADER_BYTES: usize = 256 * 4;

pub struct TokenFile {
    pub path: PathBuf,
    /// The file's bytes: a memory map, or tokens made in memory ([`TokenFile::from_tokens`]).
    mmap: Box<dyn AsRef<[u8]> + Send + Sync>,
    /// Byte offset of the first token.
    start: usize,
    /// Number of tokens.
    pub len: usize,
}

impl TokenFile {
    /// Opens `path`: llm.c's format when it starts with the magic number, raw uint16 otherwise.
    pub fn open(path: &Path) -> Result<Self> {
        // A pipe would block the open until a writer comes, and a directory cannot be mapped: refuse both at once.
        let meta = std::fs::metadata(path).with_context(|| format!("token file {}", path.display()))?;
        if !meta.is_file() {
            bail!(
                "token file {}: not a regular file (a directory, pipe or device); give a file written by `zerostream prepare`",
                path.display()
            );
        }
        let file = File::open(path).with_context(|| format!("opening token file {}", path.display()))?;
        // SAFETY: read-only mapping of a file zerostream does not modify while it is open.
        let mmap = unsafe { Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        let word = |i: usize| i32::from_le_bytes(mmap[4 * i..4 * i + 4].try_into().unwrap());
        let (start, len) = if mmap.len() >= HEADER_BYTES && word(0) == LLMC_MAGIC {
            if word(1) != 1 {
                bail!("{}: llm.c token file version {} is not supported (expected 1)", path.display(), word(1));
            }
            let count = word(2);
            let available = (mmap.len() - HEADER_BYTES) / 2;
            if count < 0 || count as usize > available || !(mmap.len() - HEADER_BYTES).is_multiple_of(2) {
                bail!(
                    "{}: header says {count} tokens but the file holds {} bytes after the header ({} tokens)",
                    path.display(),
                    mmap.len() - HEADER_BYTES,
                    available
                );
            }
            (HEADER_BYTES, count as usize)
        } else {
            if mmap.len() >= 4 && word(0) != LLMC_MAGIC && mmap.len() >= HEADER_BYTES && looks_like_header(&mmap) {
                bail!("{}: starts with a 256-word header whose magic {} is not llm.c's {LLMC_MAGIC}", path.display(), word(0));
            }
            if mmap.len() % 2 != 0 {
                bail!("{}: odd length ({} bytes); a raw token file holds little-endian uint16 tokens", path.display(), mmap.len());
            }
            (0, mmap.len() / 2)
        };
        Ok(TokenFile { path: path.to_path_buf(), mmap: Box::new(mmap), start, len })
    }

    /// Tokens already in memory (the embedded demo text); `label` names them in errors.
    pub fn from_tokens(label: &str, tokens: &[u16]) -> Self {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        TokenFile { path: PathBuf::from(label), mmap: Box::new(bytes), start: 0, len: tokens.len() }
    }

    pub fn get(&self, i: usize) -> u16 {
        let o = self.start + 2 * i;
        let bytes = (*self.mmap).as_ref();
        u16::from_le_bytes([bytes[o], bytes[o + 1]])
    }

    /// Fails naming the first token id at or above `vocab_size`.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<()> {
        if let Some(i) = (0..self.len).find(|&i| self.get(i) as usize >= vocab_size) {
            bail!("{}: token {} at position {i} is not below the model's vocab_size {vocab_size}", self.path.display(), self.get(i));
        }
        Ok(())
    }

    /// Micro-batch `g` of the training contract: window `g mod floor((n-1)/(B*T))` of B*T+1 tokens;
    /// returns (x, y), each B*T long.
    pub fn micro_batch(&self, g: usize, batch: usize, seq_len: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let span = batch * seq_len;
        if self.len < span + 1 {
            bail!("{}: {} tokens, fewer than one micro-batch of B*T+1 = {}", self.path.display(), self.len, span + 1);
        }
        let windows = (self.len - 1) / span;
        let start = (g % windows) * span;
        let x = (start..start + span).map(|i| self.get(i) as u32).collect();
        let y = (start + 1..start + span + 1).map(|i| self.get(i) as u32).collect();
        Ok((x, y))
    }
}

/// A file whose first words look like a small-integer header (version and count fields) rather than
/// uint16 token pairs: the magic is wrong but the layout says header.
fn looks_like_header(mmap: &[u8]) -> bool {
    let word = |i: usize| i32::from_le_bytes(mmap[4 * i..4 * i + 4].try_into().unwrap());
    // llm.c writes zeros after the third word; token data almost never has 253 zero words in a row.
    (3..256).all(|i| word(i) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    fn llmc(tokens: &[u16], magic: i32, count: i32) -> Vec<u8> {
        let mut header = [0i32; 256];
        header[0] = magic;
        header[1] = 1;
        header[2] = count;
        let mut bytes: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        bytes
    }

    #[test]
    fn reads_both_formats_and_windows_wrap() {
        let tokens: Vec<u16> = (0..11).collect();
        let a = write(&llmc(&tokens, LLMC_MAGIC, 11));
        let b = write(&tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<_>>());
        for f in [a.path(), b.path()] {
            let tf = TokenFile::open(f).unwrap();
            assert_eq!(tf.len, 11);
            // B*T = 4: windows = (11-1)/4 = 2; micro-batch 2 wraps to window 0.
            assert_eq!(tf.micro_batch(1, 2, 2).unwrap(), (vec![4, 5, 6, 7], vec![5, 6, 7, 8]));
            assert_eq!(tf.micro_batch(2, 2, 2).unwrap(), tf.micro_batch(0, 2, 2).unwrap());
        }
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let err = |bytes: &[u8]| TokenFile::open(write(bytes).path()).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(err(&llmc(&[1, 2], 12345, 2)).contains("magic 12345"));
        assert!(err(&llmc(&[1, 2], LLMC_MAGIC, 5)).contains("header says 5 tokens"));
        assert!(err(&[1, 2, 3]).contains("odd length"));
        let tf = TokenFile::open(write(&[1, 0, 200, 0]).path()).unwrap();
        assert!(tf.check_vocab(128).unwrap_err().to_string().contains("token 200 at position 1"));
        assert!(tf.micro_batch(0, 2, 2).unwrap_err().to_string().contains("fewer than one micro-batch"));
    }
}

/// Writes `tokens` in llm.c's format (header: magic, version 1, count; then uint16 tokens), through a
/// temporary file renamed into place.
pub fn write_token_file(path: &Path, tokens: &[u16]) -> Result<()> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + 2 * tokens.len());
    let mut header = [0i32; 256];
    header[0] = LLMC_MAGIC;
    header[1] = 1;
    header[2] = i32::try_from(tokens.len()).context("more than 2^31 tokens do not fit llm.c's header")?;
    bytes.extend(header.iter().flat_map(|w| w.to_le_bytes()));
    bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
