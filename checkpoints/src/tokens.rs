//! Token files: llm.c's formats — a 256 x int32 little-endian header (magic 20240520, version 1, token
//! count; then uint16 tokens: GPT-2), or (magic 20240801, version 7; then uint32 tokens: Llama-3) — or
//! raw little-endian tokens (nanoGPT's `.bin`: uint16, or uint32 with `--data-dtype u32`). Read with
//! positioned reads, not memory-mapped: a file truncated or rewritten during a run then gives an error
//! naming it, where a map would have killed the process with SIGBUS.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::io::{StagedFiles, Stamp, open_regular, read_exact_at};

pub const LLMC_MAGIC: i32 = 20240520;
/// llm.c's Llama-3 token files: version 7, uint32 tokens.
pub const LLMC_MAGIC_U32: i32 = 20240801;
const HEADER_BYTES: usize = 256 * 4;
/// Tokens read at a time by [`TokenFile::check_vocab`] (4 MiB).
const SCAN_TOKENS: usize = 1 << 21;

/// How wide each token of a file is (`--data-dtype`, for raw files; llm.c's header says it itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenWidth {
    U16,
    U32,
}

impl TokenWidth {
    fn bytes(self) -> usize {
        match self {
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }
}

pub struct TokenFile {
    pub path: PathBuf,
    source: Source,
    /// Number of tokens.
    pub len: usize,
    pub width: TokenWidth,
}

enum Source {
    /// Tokens made in memory ([`TokenFile::from_tokens`]).
    Memory(Vec<u32>),
    /// An open file; `start` is the byte offset of the first token, `stamp` the file as opened.
    File { file: File, start: u64, stamp: Stamp },
}

impl TokenFile {
    /// Opens `path`: llm.c's formats when it starts with one of their magic numbers, raw uint16
    /// otherwise. Pipes, directories and devices are refused at once.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, TokenWidth::U16)
    }

    /// [`TokenFile::open`], reading a raw (headerless) file as tokens of `raw_width`.
    pub fn open_with(path: &Path, raw_width: TokenWidth) -> Result<Self> {
        let (file, meta) = open_regular(path, "token file")?;
        let stamp = Stamp::of(&meta);
        let mut head = vec![0u8; stamp.len.min(HEADER_BYTES as u64) as usize];
        read_exact_at(&file, &mut head, 0).with_context(|| format!("reading token file {}", path.display()))?;
        let (start, len, width) = layout(&head, stamp.len, raw_width).map_err(|e| anyhow::anyhow!("token file {}: {e}", path.display()))?;
        Ok(TokenFile { path: path.to_path_buf(), source: Source::File { file, start, stamp }, len, width })
    }

    /// Tokens already in memory (the embedded demo text); `label` names them in errors.
    pub fn from_tokens(label: &str, tokens: &[u16]) -> Self {
        let tokens: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        TokenFile { path: PathBuf::from(label), len: tokens.len(), source: Source::Memory(tokens), width: TokenWidth::U16 }
    }

    /// In-memory token ids of any width (the built-in run's).
    pub fn from_ids(label: &str, tokens: &[u32]) -> Self {
        let width = if tokens.iter().any(|&t| t > u16::MAX as u32) { TokenWidth::U32 } else { TokenWidth::U16 };
        TokenFile { path: PathBuf::from(label), len: tokens.len(), source: Source::Memory(tokens.to_vec()), width }
    }

    /// Token `i`, or an error naming the file when `i` is out of range or the file cannot be read (it
    /// changed during the run).
    pub fn get(&self, i: usize) -> Result<u32> {
        if i >= self.len {
            bail!("{}: token position {i} is past the end ({} tokens)", self.path.display(), self.len);
        }
        let mut t = [0u32];
        self.read(i, &mut t)?;
        Ok(t[0])
    }

    /// Fails naming the first token id at or above `vocab_size`. Reads the whole file, in large chunks.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<()> {
        let mut buf = vec![0u32; SCAN_TOKENS.min(self.len)];
        let mut first = 0;
        while first < self.len {
            let chunk = &mut buf[..SCAN_TOKENS.min(self.len - first)];
            self.read(first, chunk)?;
            if let Some(j) = chunk.iter().position(|&t| t as usize >= vocab_size) {
                bail!(
                    "{}: token {} at position {} is not below the model's vocab_size {vocab_size}",
                    self.path.display(),
                    chunk[j],
                    first + j
                );
            }
            first += chunk.len();
        }
        Ok(())
    }

    /// How many distinct micro-batches of B*T+1 tokens the file holds (0 when not one): micro-batch `g`
    /// is the same as micro-batch `g` mod this.
    pub fn micro_batches(&self, batch: usize, seq_len: usize) -> usize {
        match batch.checked_mul(seq_len) {
            Some(span) if span > 0 && span < usize::MAX => self.len.saturating_sub(1) / span,
            _ => 0,
        }
    }

    /// Micro-batch `g` of the training contract: window `g mod floor((n-1)/(B*T))` of B*T+1 tokens;
    /// returns (x, y), each B*T long.
    pub fn micro_batch(&self, g: usize, batch: usize, seq_len: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let span = batch.checked_mul(seq_len).filter(|&s| s > 0 && s < usize::MAX);
        let Some(span) = span else {
            bail!("{}: a micro-batch of B = {batch} by T = {seq_len} tokens is empty or too large", self.path.display());
        };
        if self.len < span + 1 {
            bail!("{}: {} tokens, fewer than one micro-batch of B*T+1 = {}", self.path.display(), self.len, span + 1);
        }
        let windows = (self.len - 1) / span;
        let start = (g % windows) * span;
        let mut tokens = vec![0u32; span + 1];
        self.read(start, &mut tokens)?;
        Ok((tokens[..span].to_vec(), tokens[1..].to_vec()))
    }

    /// Fills `out` with tokens `first..first + out.len()` (within `0..len`). A file that changed since
    /// it was opened is an error, whether its size and time show it or the read comes up short.
    fn read(&self, first: usize, out: &mut [u32]) -> Result<()> {
        let (file, start, stamp) = match &self.source {
            Source::Memory(tokens) => {
                out.copy_from_slice(&tokens[first..first + out.len()]);
                return Ok(());
            }
            Source::File { file, start, stamp } => (file, *start, stamp),
        };
        let changed = |what: &str| {
            anyhow::anyhow!(
                "token file {} changed during the run: {what}; expected {} tokens ({} bytes) as when it was opened",
                self.path.display(),
                self.len,
                stamp.len
            )
        };
        if let Some(change) = stamp.change(file).with_context(|| format!("token file {}", self.path.display()))? {
            return Err(changed(&change));
        }
        let w = self.width.bytes();
        let offset = start + (w * first) as u64;
        let mut bytes = vec![0u8; w * out.len()];
        if let Err(e) = read_exact_at(file, &mut bytes, offset) {
            let place = format!("tokens {first}..{} (bytes {offset}..{})", first + out.len(), offset + bytes.len() as u64);
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                return Err(changed(&format!("reading {place} reached the end of the file")));
            }
            return Err(e).with_context(|| format!("token file {}: reading {place}", self.path.display()));
        }
        match self.width {
            TokenWidth::U16 => out.iter_mut().zip(bytes.chunks_exact(2)).for_each(|(t, b)| *t = u16::from_le_bytes([b[0], b[1]]) as u32),
            TokenWidth::U32 => {
                out.iter_mut().zip(bytes.chunks_exact(4)).for_each(|(t, b)| *t = u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
        }
        Ok(())
    }
}

/// Where the tokens of a file of `size` bytes starting with `head` (its first 1024 bytes, or all of
/// a shorter file) lie: (byte offset of the first token, number of tokens, token width); a file without
/// llm.c's header holds tokens of `raw_width`.
fn layout(head: &[u8], size: u64, raw_width: TokenWidth) -> std::result::Result<(u64, usize, TokenWidth), String> {
    let word = |i: usize| i32::from_le_bytes(head[4 * i..4 * i + 4].try_into().unwrap());
    let count_of = |bytes: u64, w: TokenWidth| {
        usize::try_from(bytes / w.bytes() as u64).map_err(|_| format!("{size} bytes is more tokens than this machine can index"))
    };
    let header = match head.len() >= 4 && word(0) == LLMC_MAGIC {
        true => Some((LLMC_MAGIC, 1, TokenWidth::U16)),
        false if head.len() >= 4 && word(0) == LLMC_MAGIC_U32 => Some((LLMC_MAGIC_U32, 7, TokenWidth::U32)),
        false => None,
    };
    if let Some((magic, version, width)) = header {
        if head.len() < HEADER_BYTES {
            return Err(format!("starts with llm.c's magic {magic} but holds {size} bytes, less than the {HEADER_BYTES}-byte header"));
        }
        if word(1) != version {
            return Err(format!("llm.c token file (magic {magic}) version {} is not supported (expected {version})", word(1)));
        }
        let count = word(2);
        let after = size - HEADER_BYTES as u64;
        let available = count_of(after, width)?;
        if count < 0 || count as usize > available || !after.is_multiple_of(width.bytes() as u64) {
            return Err(format!(
                "header says {count} tokens but the file holds {after} bytes after the header ({available} tokens of {} bytes)",
                width.bytes()
            ));
        }
        return Ok((HEADER_BYTES as u64, count as usize, width));
    }
    if head.len() == HEADER_BYTES && looks_like_header(head) {
        return Err(format!("starts with a 256-word header whose magic {} is not llm.c's {LLMC_MAGIC} or {LLMC_MAGIC_U32}", word(0)));
    }
    if !size.is_multiple_of(raw_width.bytes() as u64) {
        return Err(format!(
            "length {size} bytes is not a multiple of {}: a raw token file holds little-endian {} tokens (--data-dtype)",
            raw_width.bytes(),
            if raw_width == TokenWidth::U16 { "uint16" } else { "uint32" }
        ));
    }
    Ok((0, count_of(size, raw_width)?, raw_width))
}

/// A file whose first words look like a small-integer header (version and count fields) rather than
/// uint16 token pairs: the magic is wrong but the layout says header.
fn looks_like_header(head: &[u8]) -> bool {
    // llm.c writes zeros after the third word; token data almost never has 253 zero words in a row.
    head[12..HEADER_BYTES].iter().all(|&b| b == 0)
}

/// Writes `tokens` in llm.c's format (header: magic, version 1, count; then uint16 tokens) to a new
/// temporary file beside `path`, synced, then renamed onto `path`. No other file is touched: the
/// temporary name is one that did not exist, and an existing `path` that is not a regular file (a
/// directory, pipe or device) is refused rather than replaced.
pub fn write_token_file(path: &Path, tokens: &[u16]) -> Result<()> {
    let wide: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    write_tokens(path, &wide, TokenWidth::U16)
}

/// [`write_token_file`] for ids of any size: llm.c's uint16 format when every id fits 16 bits, its
/// Llama-3 format (magic 20240801, version 7, uint32) otherwise.
pub fn write_token_file_u32(path: &Path, tokens: &[u32]) -> Result<()> {
    let mut staged = StagedFiles::default();
    stage_token_file_u32(&mut staged, path, tokens)?;
    staged.commit()
}

fn write_tokens(path: &Path, tokens: &[u32], width: TokenWidth) -> Result<()> {
    let mut staged = StagedFiles::default();
    stage_tokens(&mut staged, path, tokens, width)?;
    staged.commit()
}

/// [`write_token_file_u32`] staged with other files, to be renamed into place with them.
pub fn stage_token_file_u32(staged: &mut StagedFiles, path: &Path, tokens: &[u32]) -> Result<()> {
    let width = if tokens.iter().all(|&t| t <= u16::MAX as u32) { TokenWidth::U16 } else { TokenWidth::U32 };
    stage_tokens(staged, path, tokens, width)
}

fn stage_tokens(staged: &mut StagedFiles, path: &Path, tokens: &[u32], width: TokenWidth) -> Result<()> {
    if let Ok(meta) = std::fs::metadata(path)
        && !meta.is_file()
    {
        bail!("token file {} exists and is not a regular file (a directory, pipe or device); give a file path", path.display());
    }
    let mut bytes = Vec::with_capacity(HEADER_BYTES + width.bytes() * tokens.len());
    let mut header = [0i32; 256];
    (header[0], header[1]) = match width {
        TokenWidth::U16 => (LLMC_MAGIC, 1),
        TokenWidth::U32 => (LLMC_MAGIC_U32, 7),
    };
    header[2] = i32::try_from(tokens.len()).context("more than 2^31 tokens do not fit llm.c's header")?;
    bytes.extend(header.iter().flat_map(|w| w.to_le_bytes()));
    match width {
        TokenWidth::U16 => bytes.extend(tokens.iter().flat_map(|&t| (t as u16).to_le_bytes())),
        TokenWidth::U32 => bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes())),
    }
    staged.stage(path, &bytes)
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
        let files = [TokenFile::open(a.path()).unwrap(), TokenFile::open(b.path()).unwrap(), TokenFile::from_tokens("mem", &tokens)];
        for tf in files {
            assert_eq!(tf.len, 11);
            assert_eq!(tf.get(10).unwrap(), 10);
            // B*T = 4: windows = (11-1)/4 = 2; micro-batch 2 wraps to window 0.
            assert_eq!(tf.micro_batch(1, 2, 2).unwrap(), (vec![4, 5, 6, 7], vec![5, 6, 7, 8]));
            assert_eq!(tf.micro_batch(2, 2, 2).unwrap(), tf.micro_batch(0, 2, 2).unwrap());
            assert!(tf.get(11).is_err());
            tf.check_vocab(11).unwrap();
            assert!(tf.check_vocab(10).unwrap_err().to_string().contains("token 10 at position 10"));
        }
    }

    #[test]
    fn wide_ids_are_written_in_llama3_format_and_narrow_ones_in_gpt2s() {
        let dir = tempfile::tempdir().unwrap();
        let (wide, narrow) = (dir.path().join("wide.bin"), dir.path().join("narrow.bin"));
        write_token_file_u32(&wide, &[1, 70_000, 3]).unwrap();
        write_token_file_u32(&narrow, &[1, 65_535, 3]).unwrap();
        let (w, n) = (TokenFile::open(&wide).unwrap(), TokenFile::open(&narrow).unwrap());
        assert_eq!((w.width, w.get(1).unwrap()), (TokenWidth::U32, 70_000));
        assert_eq!((n.width, n.get(1).unwrap()), (TokenWidth::U16, 65_535));
    }

    #[test]
    fn llama3_files_and_raw_uint32_read_as_u32() {
        let tokens: Vec<u32> = vec![0, 70_000, 128_255, 5];
        let mut header = [0i32; 256];
        header[0] = LLMC_MAGIC_U32;
        header[1] = 7;
        header[2] = 4;
        let mut bytes: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        let llama = TokenFile::open(write(&bytes).path()).unwrap();
        let raw = TokenFile::open_with(write(&bytes[HEADER_BYTES..]).path(), TokenWidth::U32).unwrap();
        for tf in [llama, raw] {
            assert_eq!((tf.len, tf.width, tf.get(2).unwrap()), (4, TokenWidth::U32, 128_255));
            assert_eq!(tf.micro_batch(0, 1, 3).unwrap(), (vec![0, 70_000, 128_255], vec![70_000, 128_255, 5]));
            assert!(tf.check_vocab(128_000).unwrap_err().to_string().contains("token 128255 at position 2"));
        }
        header[1] = 1;
        let mut wrong: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
        wrong.extend(&bytes[HEADER_BYTES..]);
        let err = TokenFile::open(write(&wrong).path()).err().unwrap().to_string();
        assert!(err.contains("version 1 is not supported (expected 7)"), "{err}");
        let err = TokenFile::open_with(write(&[1, 2, 3, 4, 5, 6]).path(), TokenWidth::U32).err().unwrap().to_string();
        assert!(err.contains("not a multiple of 4") && err.contains("--data-dtype"), "{err}");
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let err = |bytes: &[u8]| TokenFile::open(write(bytes).path()).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(err(&llmc(&[1, 2], 12345, 2)).contains("magic 12345"));
        assert!(err(&llmc(&[1, 2], LLMC_MAGIC, 5)).contains("header says 5 tokens"));
        assert!(err(&llmc(&[], LLMC_MAGIC, 0)[..100]).contains("less than the 1024-byte header"));
        assert!(err(&[1, 2, 3]).contains("not a multiple of 2"));
        let tf = TokenFile::open(write(&[1, 0, 200, 0]).path()).unwrap();
        assert!(tf.check_vocab(128).unwrap_err().to_string().contains("token 200 at position 1"));
        assert!(tf.micro_batch(0, 2, 2).unwrap_err().to_string().contains("fewer than one micro-batch"));
        assert!(tf.micro_batch(0, 0, 2).unwrap_err().to_string().contains("empty or too large"));
        assert!(tf.micro_batch(0, usize::MAX, 2).unwrap_err().to_string().contains("empty or too large"));
    }
}
