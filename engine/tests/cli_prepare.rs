//! `zerostream prepare` end to end and the token files it writes: GPT-2's tokenizer or a Hugging Face
//! `tokenizer.json` (uint32 ids above 65535), documents split with a held-out validation file, and raw
//! uint32 token files training like the uint16 original.

mod common;

use common::cli::{stderr, zerostream};

#[test]
fn prepare_writes_a_token_file_train_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "To be, or not to be, that is the question.").unwrap();
    let tokens = dir.path().join("t.bin");
    let out = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", tokens.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = zerostream_checkpoints::TokenFile::open(&tokens).unwrap();
    assert_eq!(file.get(0).unwrap(), 2514, "GPT-2's id for \"To\"");
    // `--text -` reads the same text from standard input, to the same bytes.
    let piped = dir.path().join("piped.bin");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_zerostream"))
        .args(["prepare", "--text", "-", "--out", piped.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &std::fs::read(&text).unwrap()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&piped).unwrap(), std::fs::read(&tokens).unwrap());
    // A byte-order mark an editor put first is not text: the same tokens.
    let marked = dir.path().join("marked.txt");
    std::fs::write(&marked, [&b"\xef\xbb\xbf"[..], &std::fs::read(&text).unwrap()].concat()).unwrap();
    let unmarked = dir.path().join("marked.bin");
    let out = zerostream(&["prepare", "--text", marked.to_str().unwrap(), "--out", unmarked.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&unmarked).unwrap(), std::fs::read(&tokens).unwrap());
}

/// From a terminal (util-linux's `script` gives the command one: Linux only, where bsdutils, an
/// essential package, has it), `--text -` is refused rather than waiting for typing, and nothing is
/// written.
#[cfg(target_os = "linux")]
#[test]
fn prepare_from_a_terminal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let typed = dir.path().join("typed.bin");
    let command = format!("{} prepare --text - --out {}", env!("CARGO_BIN_EXE_zerostream"), typed.display());
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running util-linux's `script` (bsdutils), which gives the command a terminal");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("standard input is a terminal") && !typed.exists(), "{said}");
}

#[test]
fn raw_uint32_token_files_train_like_the_uint16_original() {
    let dir = tempfile::tempdir().unwrap();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny");
    let original = zerostream_checkpoints::TokenFile::open(std::path::Path::new(&format!("{golden}/tokens.bin"))).unwrap();
    let raw = dir.path().join("tokens.u32");
    let words: Vec<u8> = (0..original.len).flat_map(|i| original.get(i).unwrap().to_le_bytes()).collect();
    std::fs::write(&raw, words).unwrap();
    let losses = |data: &str, dtype: &str| {
        let metrics = dir.path().join(format!("{dtype}.jsonl"));
        let model = format!("{golden}/model");
        let out = zerostream(&[
            "train",
            "--device",
            "cpu",
            "--model",
            &model,
            "--data",
            data,
            "--data-dtype",
            dtype,
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--seq-len",
            "8",
            "--sample-tokens",
            "0",
            "--metrics",
            metrics.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        std::fs::read_to_string(&metrics)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(losses(&format!("{golden}/tokens.bin"), "u16"), losses(raw.to_str().unwrap(), "u32"));
}

#[test]
fn prepare_tokenises_with_a_hugging_face_tokenizer_json() {
    let dir = tempfile::tempdir().unwrap();
    // A word-level tokenizer.json as transformers' tokenizers library writes one; "not" has an id above
    // 65535, so the file must be written in llm.c's uint32 (Llama-3) format.
    let tokenizer = dir.path().join("tokenizer.json");
    std::fs::write(
        &tokenizer,
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"to":1,"be":2,"or":3,"not":70000},"unk_token":"[UNK]"}}"#,
    )
    .unwrap();
    let text = dir.path().join("hamlet.txt");
    std::fs::write(&text, "to be or not to be that").unwrap();
    let out = dir.path().join("tokens.bin");
    let run = zerostream(&[
        "prepare",
        "--text",
        text.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--tokenizer",
        tokenizer.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let file = zerostream_checkpoints::TokenFile::open(&out).unwrap();
    assert_eq!(file.width, zerostream_checkpoints::TokenWidth::U32);
    assert_eq!((0..file.len).map(|i| file.get(i).unwrap()).collect::<Vec<_>>(), vec![1, 2, 3, 70000, 1, 2, 0]);
    // "that" is not in the vocabulary: said, not only counted among the tokens.
    assert!(stderr(&run).contains("warning: 1 of 7 tokens (14.3%) is [UNK] (id 0)"), "{}", stderr(&run));
    // The end-of-run sample is written with the data's tokenizer: its words, the prompt's first (ids
    // the tokenizer lacks, most of this model's vocabulary, decode to nothing). No built-in tokenizer
    // has 70001 ids, so without the data's there would be no sample.
    let config = dir.path().join("tiny.json");
    std::fs::write(&config, r#"{"model_type":"gpt2","n_layer":1,"n_head":2,"n_embd":16,"n_positions":8,"vocab_size":70001}"#).unwrap();
    let (c, o) = (config.to_str().unwrap(), out.to_str().unwrap());
    let args = ["train", "--device", "cpu", "--config", c, "--data", o, "--steps", "1", "--seq-len", "2", "--batch-size", "1"];
    let run = zerostream(&[&args[..], &["--prompt", "to be", "--sample-tokens", "4"]].concat());
    let sample = String::from_utf8(run.stdout.clone()).unwrap();
    let words: Vec<&str> = sample.split_whitespace().collect();
    assert!(run.status.success() && words.len() >= 2 && words[..2] == ["to", "be"], "{sample:?} {}", stderr(&run));
    assert!(words.iter().all(|w| ["[UNK]", "to", "be", "or", "not"].contains(w)), "{sample:?}");
    let bad = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", out.to_str().unwrap(), "--tokenizer", "nonesuch.json"]);
    assert!(!bad.status.success() && stderr(&bad).contains("nonesuch.json"), "{}", stderr(&bad));
}

/// Validation data prepared with another tokenizer than the training data is refused by both records.
#[test]
fn validation_data_of_another_tokenizer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "Something is rotten in the state of Denmark. ".repeat(40)).unwrap();
    let (bpe, bytes) = (dir.path().join("bpe.bin"), dir.path().join("bytes.bin"));
    for (out, tokenizer) in [(&bpe, "gpt2"), (&bytes, "bytes")] {
        let run = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", out.to_str().unwrap(), "--tokenizer", tokenizer]);
        assert!(run.status.success(), "{}", stderr(&run));
    }
    let (d, v) = (bpe.to_str().unwrap(), bytes.to_str().unwrap());
    let run = zerostream(&["train", "--device", "cpu", "--config", "gpt2", "--data", d, "--val-data", v, "--steps", "1", "--seq-len", "8"]);
    let err = stderr(&run);
    assert!(
        !run.status.success() && err.contains("prepared with another tokenizer") && err.contains("bytes (") && err.contains("gpt2 ("),
        "{err}"
    );
    // A model saved from the GPT-2 data carries GPT-2's vocab.json and merges.txt: eval and a run
    // from it take data of that tokenizer, and refuse the bytes' by both records.
    let config = dir.path().join("tiny.json");
    std::fs::write(&config, r#"{"model_type":"gpt2","n_layer":1,"n_head":2,"n_embd":32,"n_positions":16,"vocab_size":50257}"#).unwrap();
    let model = dir.path().join("model");
    let m = model.to_str().unwrap();
    let tiny = ["--device", "cpu", "--seq-len", "8", "--batch-size", "1"];
    let run = zerostream(
        &[&["train", "--config", config.to_str().unwrap(), "--data", d, "--steps", "1", "--save", m, "--sample-tokens", "0"][..], &tiny]
            .concat(),
    );
    assert!(run.status.success(), "{}", stderr(&run));
    // An empty prompt starts from GPT-2's end-of-text token, said.
    let out = zerostream(&["generate", "--model", m, "--device", "cpu", "--prompt", "", "--max-new-tokens", "2"]);
    let said = stderr(&out);
    assert!(out.status.success() && said.contains("start token \"<|endoftext|>\" (id 50256)"), "{said}");
    let eval = |data: &str| zerostream(&["eval", "--model", m, "--data", data, "--device", "cpu", "--seq-len", "8", "--batch-size", "1"]);
    assert!(eval(d).status.success(), "{}", stderr(&eval(d)));
    for run in [eval(v), zerostream(&[&["train", "--model", m, "--data", v, "--steps", "1", "--sample-tokens", "0"][..], &tiny].concat())] {
        let (err, hint) = (stderr(&run), format!("`zerostream prepare --tokenizer {m}`"));
        assert!(
            !run.status.success() && err.contains("the data's tokenizer is bytes, not the tokenizer of the model") && err.contains(&hint),
            "{err}"
        );
    }
    // The hint works: the model directory as --tokenizer gives data eval takes, GPT-2's ids either way.
    let again = dir.path().join("again.bin");
    let run = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", again.to_str().unwrap(), "--tokenizer", m]);
    assert!(run.status.success(), "{}", stderr(&run));
    let out = eval(again.to_str().unwrap());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&bpe).unwrap());
}

#[test]
fn prepare_splits_documents_and_holds_out_a_validation_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("docs.txt");
    let docs: Vec<String> = (0..10).map(|i| format!("Document number {i} says hello.")).collect();
    std::fs::write(&text, docs.join("\n\n")).unwrap();
    let out = dir.path().join("docs.bin");
    let run = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", out.to_str().unwrap(), "--val-fraction", "0.2"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let read = |p: &std::path::Path| {
        let f = zerostream_checkpoints::TokenFile::open(p).unwrap();
        (0..f.len).map(|i| f.get(i).unwrap()).collect::<Vec<u32>>()
    };
    let (train, val) = (read(&out), read(&dir.path().join("docs.val.bin")));
    // GPT-2's <|endoftext|> between documents: 8 training documents, 2 held out.
    assert_eq!(train.iter().filter(|&&t| t == 50256).count(), 7);
    assert_eq!(val.iter().filter(|&&t| t == 50256).count(), 1);
    // Each part's own bytes: ten documents of 29 bytes (the separators are nobody's).
    assert!(stderr(&run).contains("8 documents, 232 bytes of text ->"), "{}", stderr(&run));
    assert!(stderr(&run).contains("held out 2 documents, 58 bytes of text ->"), "{}", stderr(&run));
    let bad = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", out.to_str().unwrap(), "--val-fraction", "1.5"]);
    assert!(!bad.status.success() && stderr(&bad).contains("--val-fraction 1.5"), "{}", stderr(&bad));
    // Blank text is refused, and the token file already there is kept.
    let blank = dir.path().join("blank.txt");
    std::fs::write(&blank, "\n\n  \n").unwrap();
    let before = std::fs::read(&out).unwrap();
    let bad = zerostream(&["prepare", "--text", blank.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(!bad.status.success() && stderr(&bad).contains("no text to tokenise"), "{}", stderr(&bad));
    assert_eq!(std::fs::read(&out).unwrap(), before);
    // A Windows text's blank lines (CRLF) separate its documents as well.
    let crlf = dir.path().join("crlf.txt");
    std::fs::write(&crlf, "hello\r\n\r\nworld\r\n").unwrap();
    let run = zerostream(&["prepare", "--text", crlf.to_str().unwrap(), "--out", out.to_str().unwrap(), "--val-fraction", "0.5"]);
    assert!(run.status.success() && stderr(&run).contains("held out 1 document,"), "{}", stderr(&run));
}

/// The token file, the held-out file and their tokenizer records are replaced together or not at all:
/// a held-out file that cannot be written (here a directory in its place) leaves the earlier
/// prepare's token file and record as they were, and no temporary file behind.
#[test]
fn a_failed_prepare_leaves_the_earlier_files_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("docs.txt");
    std::fs::write(&text, "One document.\n\nAnother document.\n").unwrap();
    let out = dir.path().join("docs.bin");
    let first = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(first.status.success(), "{}", stderr(&first));
    let record = dir.path().join("docs.bin.tokenizer");
    let (tokens_before, record_before) = (std::fs::read(&out).unwrap(), std::fs::read(&record).unwrap());
    std::fs::create_dir(dir.path().join("docs.val.bin")).unwrap();
    let args =
        ["prepare", "--text", text.to_str().unwrap(), "--out", out.to_str().unwrap(), "--tokenizer", "bytes", "--val-fraction", "0.5"];
    let bad = zerostream(&args);
    assert!(!bad.status.success() && stderr(&bad).contains("docs.val.bin"), "{}", stderr(&bad));
    assert_eq!(std::fs::read(&out).unwrap(), tokens_before, "the earlier token file is kept");
    assert_eq!(std::fs::read(&record).unwrap(), record_before, "and its record, which still describes it");
    let mut names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    names.sort();
    assert_eq!(names, ["docs.bin", "docs.bin.tokenizer", "docs.txt", "docs.val.bin"], "no temporary left behind");
}
