//! `zerostream prepare`: a text file to token files. The text is cut into documents at a separator
//! (default: blank lines), each document tokenised on its own and followed by the tokenizer's
//! end-of-text token where it has one, so no window of training silently runs one document into the
//! next; `--val-fraction` holds out the last documents as a validation file. Beside each token file,
//! `NAME.tokenizer` records the tokenizer (`gpt2`, `bytes`, or a copy of the tokenizer.json), which
//! `train` writes into the model directories it saves.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use zerostream_checkpoints::{DataTokenizer, StagedFiles, TextTokenizer, stage_token_file_u32};

#[derive(clap::Args)]
pub struct PrepareArgs {
    /// UTF-8 text to tokenise; `-` reads standard input (`cat *.txt | zerostream prepare --text - ...`).
    #[arg(long)]
    text: PathBuf,
    /// Token file to write (the training part, with --val-fraction).
    #[arg(long)]
    out: PathBuf,
    /// `gpt2`: GPT-2's BPE (50257 tokens); `bytes`: one token per byte (256); or the path of a Hugging
    /// Face tokenizer.json (Llama-3's, Mistral's, ...). Ids above 65535 are written as llm.c's uint32
    /// (Llama-3) format. Recorded beside --out as `NAME.tokenizer`, so that the models `train` saves
    /// carry the tokenizer.
    #[arg(long, default_value = "gpt2")]
    tokenizer: String,
    /// What separates documents in the text (`\n` for a newline): between documents the tokenizer's
    /// end-of-text token is written (GPT-2's <|endoftext|>; a tokenizer.json's eos token, when it names
    /// one); with `bytes` the separator itself is kept. Default: a blank line.
    #[arg(long, default_value = "\\n\\n")]
    doc_separator: String,
    /// Hold out this fraction of the documents (the last ones) as a validation file, written beside
    /// --out as `NAME.val.EXT` (for `train --val-data`). 0 = none.
    #[arg(long, default_value_t = 0.0)]
    val_fraction: f64,
}

/// The text of `--text PATH`, or of standard input for `-` (refused from a terminal, where it would
/// wait for typing), without a leading byte-order mark: an editor's marker, not text (it would start
/// the data with three tokens no one wrote).
fn read_text(path: &Path) -> Result<String> {
    let mut text = read_text_with_mark(path)?;
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8()); // in place: a large text is not copied
    }
    Ok(text)
}

fn read_text_with_mark(path: &Path) -> Result<String> {
    use std::io::{IsTerminal, Read};
    if path != Path::new("-") {
        return std::fs::read_to_string(path).with_context(|| format!("reading --text {}", path.display()));
    }
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        bail!("--text -: standard input is a terminal; pipe the text in (`cat book.txt | zerostream prepare --text - ...`)");
    }
    let mut text = String::new();
    stdin.read_to_string(&mut text).context("reading --text - (standard input): expected UTF-8 text")?;
    Ok(text)
}

/// `x.bin` -> `x.val.bin`.
fn val_path(out: &Path) -> PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = match out.extension() {
        Some(ext) => format!("{stem}.val.{}", ext.to_string_lossy()),
        None => format!("{stem}.val"),
    };
    out.with_file_name(name)
}

/// `quiet`: no progress bar, no summary lines.
pub fn prepare(a: PrepareArgs, quiet: bool) -> Result<()> {
    if !(0.0..1.0).contains(&a.val_fraction) {
        bail!("--val-fraction {}: must be in [0, 1)", a.val_fraction);
    }
    let separator = a.doc_separator.replace("\\n", "\n").replace("\\t", "\t");
    if separator.is_empty() {
        bail!("--doc-separator: must not be empty");
    }
    let tokenizer = TextTokenizer::parse(&a.tokenizer)?;
    let content = read_text(&a.text)?;
    let val_out = val_path(&a.out);
    let records = [DataTokenizer::sidecar(&a.out), DataTokenizer::sidecar(&val_out)];
    for out in [&a.out, &val_out, &records[0], &records[1]] {
        if zerostream::train::outputs::same_file(out, &a.text) {
            bail!("{} is the --text file: it would be overwritten", out.display());
        }
    }
    let documents = split_documents(&content, &separator);
    if documents.is_empty() {
        bail!("--text {}: no text to tokenise ({} bytes, all blank)", a.text.display(), content.len());
    }
    let between: Vec<u32> = match tokenizer.end_of_text() {
        Some(eot) => vec![eot],
        None => tokenizer.encode(&separator)?,
    };
    let bar = if content.len() > 8 << 20 && !quiet { ProgressBar::new(documents.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("tokenising {bar:30} {pos}/{len} documents [{elapsed_precise}<{eta_precise}]").expect("a template"),
    );
    let held_out = ((documents.len() as f64) * a.val_fraction).round() as usize;
    if a.val_fraction > 0.0 && (held_out == 0 || held_out == documents.len()) {
        bail!(
            "--val-fraction {} of {} documents leaves {} for validation and {} for training: both need at least one (split at --doc-separator)",
            a.val_fraction,
            documents.len(),
            held_out,
            documents.len() - held_out
        );
    }
    let split = documents.len() - held_out;
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (i, doc) in documents.iter().enumerate() {
        let part = if i < split { &mut train } else { &mut val };
        if !part.is_empty() {
            part.extend_from_slice(&between);
        }
        part.extend(tokenizer.encode(doc)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let record = DataTokenizer::parse(&a.tokenizer, "--tokenizer")?;
    // Every file written aside first, then all renamed into place: a failure (a full disk) leaves an
    // earlier prepare's files as they were, never a token file beside another text's record.
    let mut staged = StagedFiles::default();
    stage_token_file_u32(&mut staged, &a.out, &train)?;
    record.stage_beside(&mut staged, &a.out)?;
    if held_out > 0 {
        stage_token_file_u32(&mut staged, &val_out, &val)?;
        record.stage_beside(&mut staged, &val_out)?;
    }
    staged.commit()?;
    warn_unknown(&tokenizer, &a.tokenizer, &[&train, &val]);
    if held_out == 0 && val_out.exists() {
        // Not removed (it may be wanted), but not left to be taken for this text's either.
        eprintln!("note: {} is an earlier prepare's: this one holds nothing out (--val-fraction 0)", val_out.display());
    }
    if !quiet {
        let (training, held) = documents.split_at(split);
        let tokenizer = format!("{}, vocab {}", tokenizer.describe(), tokenizer.vocab_size());
        let tokens = |n: usize| zerostream::words::counted(n as u64, "token");
        eprintln!("{}: {} -> {} ({tokenizer})", a.out.display(), part_words(training), tokens(train.len()));
        if held_out > 0 {
            eprintln!(
                "{}: held out {} -> {} (train --val-data {})",
                val_out.display(),
                part_words(held),
                tokens(val.len()),
                val_out.display()
            );
        }
    }
    Ok(())
}

/// The documents of `content` between `separator`s, blank ones left out. A separator with line breaks
/// matches them written as CRLF too (a Windows text's blank lines).
fn split_documents<'a>(content: &'a str, separator: &str) -> Vec<&'a str> {
    let crlf = separator.replace('\n', "\r\n");
    let pieces: Vec<&str> = if crlf != separator && content.contains(crlf.as_str()) {
        content.split(crlf.as_str()).flat_map(|piece| piece.split(separator)).collect()
    } else {
        content.split(separator).collect()
    };
    pieces.into_iter().filter(|d| !d.trim().is_empty()).collect()
}

/// Says (under --quiet too) how much of the text became the tokenizer's unknown token: words its
/// vocabulary lacks, which a model can learn nothing about.
fn warn_unknown(tokenizer: &TextTokenizer, spec: &str, parts: &[&[u32]]) {
    let Some((token, id)) = tokenizer.unknown_token() else { return };
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let unknown = parts.iter().flat_map(|p| p.iter()).filter(|&&t| t == id).count();
    if unknown > 0 {
        eprintln!(
            "warning: {unknown} of {total} tokens ({:.1}%) {} {token} (id {id}): text the vocabulary of --tokenizer {spec} lacks",
            100.0 * unknown as f64 / total.max(1) as f64,
            if unknown == 1 { "is" } else { "are" }
        );
    }
}

/// "2 documents, 29 bytes of text": a part of the split, by its own documents' bytes.
fn part_words(documents: &[&str]) -> String {
    let bytes: usize = documents.iter().map(|d| d.len()).sum();
    format!(
        "{}, {} of text",
        zerostream::words::counted(documents.len() as u64, "document"),
        zerostream::words::counted(bytes as u64, "byte")
    )
}
