//! The `zerostream` binary's conveniences end to end: `--config-file` and the resolved copy beside the
//! metrics, the tokenizer files in saved models and checkpoints, a quiet graphics stack, progress off a
//! terminal and `--quiet`, and flags that would do nothing refused or said to be ignored.

mod common;

use std::path::Path;
use std::process::Command;

use common::cli::{one_step_train, stderr, zerostream};

/// Each step's loss (not the row of the validation after the last step).
fn losses(metrics: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|row| row["final_validation"] != true)
        .map(|row| row["loss"].clone())
        .collect()
}

#[test]
fn config_file_flags_apply_the_command_line_wins_and_the_resolved_copy_repeats_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.toml");
    let metrics = dir.path().join("m.jsonl");
    std::fs::write(
        &file,
        "steps = 5\nbatch_size = 2\nseq-len = 16\nsample-tokens = 0\ndevice = \"cpu\"\nlr = 3e-3\nlr-schedule = \"constant\"\nrecompute = true\n",
    )
    .unwrap();
    let out = zerostream(&["train", "--config-file", file.to_str().unwrap(), "--steps", "3", "--metrics", metrics.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let first = losses(&metrics);
    assert_eq!(first.len(), 3, "--steps on the command line wins over the file's 5");
    let resolved = dir.path().join("m.config.toml");
    let text = std::fs::read_to_string(&resolved).unwrap();
    for line in
        ["steps = 3", "batch-size = 2", "seq-len = 16", "lr = 0.003", "lr-schedule = \"constant\"", "recompute = true", "seed = 1337"]
    {
        assert!(text.lines().any(|l| l == line), "{line:?} not in the resolved configuration:\n{text}");
    }
    // The resolved file alone repeats the run: same metrics path, same losses, bit for bit.
    std::fs::remove_file(&metrics).unwrap();
    let out = zerostream(&["train", "--config-file", resolved.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(losses(&metrics), first);
    assert_eq!(std::fs::read_to_string(&resolved).unwrap(), text, "repeating the run leaves its configuration as it was");
    // A different run would overwrite the file it was started from: refused before any work.
    let out = zerostream(&["train", "--config-file", resolved.to_str().unwrap(), "--steps", "4"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("is the --config-file"), "{err}");
    assert_eq!(losses(&metrics), first, "nothing ran");
}

/// The resolved file holds its paths absolute and every directory of `--nvme-dir`, so it repeats the
/// run from another folder.
#[test]
fn the_resolved_configuration_repeats_the_run_from_any_folder() {
    let dir = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_zerostream"))
        .args(one_step_train(&["--metrics", "m.jsonl", "--nvme-dir", "a,b"]))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    let text = std::fs::read_to_string(dir.path().join("m.config.toml")).unwrap();
    let table: toml::Table = text.parse().unwrap();
    // An absolute path to `name` in the run's folder (however the OS spells the folder: a link, \\?\).
    let in_dir = |value: &str, name: &str| {
        let path = Path::new(value);
        path.is_absolute()
            && path.file_name() == Some(std::ffi::OsStr::new(name))
            && path.parent().unwrap().canonicalize().unwrap() == dir.path().canonicalize().unwrap()
    };
    assert!(in_dir(table["metrics"].as_str().unwrap(), "m.jsonl"), "{text}");
    let dirs: Vec<&str> = table["nvme-dir"].as_str().unwrap().split(',').collect();
    assert!(dirs.len() == 2 && in_dir(dirs[0], "a") && in_dir(dirs[1], "b"), "{text}");
    std::fs::remove_file(dir.path().join("m.jsonl")).unwrap();
    let again = zerostream(&["train", "--config-file", dir.path().join("m.config.toml").to_str().unwrap()]);
    assert!(again.status.success() && dir.path().join("m.jsonl").exists(), "{}", stderr(&again));
}

#[test]
fn config_files_with_unknown_keys_or_wrong_types_are_refused_by_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, &[&str]); 7] = [
        ("bogus = 1\n", "bogus", &["has no flag --bogus"]),
        ("steps = \"many\"\n", "steps", &["invalid value 'many'", "--steps"]),
        ("recompute = 1\n", "recompute", &["expected true or false"]),
        ("lr = [1, 2]\n", "lr", &["expected a string or a number", "array"]),
        ("precision = \"fp8\"\n", "precision", &["invalid value 'fp8'", "[possible values: fp32, bf16, fp16]"]),
        ("config-file = \"x.toml\"\n", "config-file", &["cannot name another"]),
        // Two spellings of one flag (TOML itself refuses the same key twice).
        ("batch-size = 2\nbatch_size = 3\n", "batch_size", &["--batch-size is given twice, also as `batch-size`"]),
    ];
    for (i, (body, key, expected)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&file, body).unwrap();
        for sub in ["train", "plan"] {
            let out = zerostream(&[sub, "--config-file", file.to_str().unwrap(), "--device", "cpu"]);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{sub} {body:?}: {err}");
            assert!(err.contains(&format!("bad{i}.toml")) && err.contains(&format!("key `{key}`")), "{body:?}: {err}");
            for e in *expected {
                assert!(err.contains(e), "{body:?}: expected {e:?} in {err}");
            }
        }
    }
    // The global --quiet is a key like the others.
    let file = dir.path().join("quiet.toml");
    std::fs::write(&file, "quiet = true\nsteps = 1\n").unwrap();
    let out = zerostream(&["train", "--config-file", file.to_str().unwrap(), "--device", "cpu", "--sample-tokens", "0"]);
    assert!(out.status.success() && !stderr(&out).contains("model:"), "{}", stderr(&out));
    let file = dir.path().join("broken.toml");
    std::fs::write(&file, "steps = = 3\n").unwrap();
    let err = stderr(&zerostream(&["train", "--config-file", file.to_str().unwrap()]));
    assert!(err.contains("broken.toml") && err.contains("not valid TOML"), "{err}");
    let err = stderr(&zerostream(&["train", "--config-file", dir.path().join("missing.toml").to_str().unwrap()]));
    assert!(err.contains("missing.toml") && err.contains("cannot read it"), "{err}");
}

/// A GPT-2 with GPT-2's vocabulary, small enough to train a step in a moment.
fn tiny_gpt2_vocab_config(dir: &Path) -> String {
    let path = dir.join("config.json");
    let config = serde_json::json!({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 50257, "n_positions": 32,
        "n_embd": 32, "n_layer": 1, "n_head": 2, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": true
    });
    std::fs::write(&path, config.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn saved_models_and_checkpoints_carry_the_tokenizer_the_data_was_prepared_with() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "To be, or not to be, that is the question.\n\nWhether 'tis nobler in the mind to suffer.\n".repeat(8)).unwrap();
    let tokens = dir.path().join("t.bin");
    let out = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", tokens.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(dir.path().join("t.bin.tokenizer")).unwrap(), "gpt2\n");
    let (save, ckpt) = (dir.path().join("saved"), dir.path().join("ckpt"));
    let config = tiny_gpt2_vocab_config(dir.path());
    let args = |save: &Path| {
        let mut a: Vec<String> = ["train", "--device", "cpu", "--config", &config, "--data", tokens.to_str().unwrap(), "--steps", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for s in ["--batch-size", "1", "--seq-len", "16", "--sample-tokens", "0", "--save", save.to_str().unwrap()] {
            a.push(s.into());
        }
        a
    };
    let mut first = args(&save);
    first.extend(["--checkpoint-dir".to_string(), ckpt.to_str().unwrap().to_string()]);
    let out = zerostream(&first.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));
    let files = ["vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"];
    let step = ckpt.join("step-00000001");
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(step.join("trainer_state.json")).unwrap()).unwrap();
    for f in files {
        assert!(save.join(f).is_file() && step.join(f).is_file(), "{f} missing");
        assert!(state["files"][f]["crc32"].is_number(), "{f} not in the checkpoint's manifest: {}", state["files"]);
    }
    // A resume whose data has no tokenizer record (a raw token file given --tokenizer) carries the
    // checkpoint's tokenizer files on into its checkpoints and its --save.
    let sidecar = dir.path().join("t.bin.tokenizer");
    std::fs::remove_file(&sidecar).unwrap();
    let out = zerostream(&["train", "--device", "cpu", "--resume", step.to_str().unwrap(), "--steps", "2"]);
    let err = stderr(&out);
    assert!(out.status.success() && err.contains("tokenizer: the checkpoint's (vocab.json, merges.txt"), "{err}");
    for f in files {
        let carried = std::fs::read(ckpt.join("step-00000002").join(f)).unwrap();
        assert_eq!(carried, std::fs::read(step.join(f)).unwrap(), "{f}");
        assert!(save.join(f).is_file(), "{f} missing from the resumed run's --save");
    }
    std::fs::write(&sidecar, "gpt2\n").unwrap();
    // The saved files tokenise as the built-in GPT-2 BPE does, and `generate` uses them.
    let tok = zerostream_checkpoints::HfTokenizer::from_model_dir(&save).unwrap().expect("a tokenizer");
    assert!(tok.path.ends_with("vocab.json"));
    let sample = "Whether 'tis nobler in the mind to suffer the slings and arrows";
    let builtin: Vec<u32> = zerostream_checkpoints::Tokenizer::Gpt2.encode(sample).unwrap().into_iter().map(u32::from).collect();
    assert_eq!(tok.encode(sample).unwrap(), builtin);
    let out = zerostream(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        save.to_str().unwrap(),
        "--prompt",
        "To be",
        "--max-new-tokens",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A bad sampling flag is refused before the model loads: nothing printed, the flag named.
    for (flag, value) in [("--temperature", "NaN"), ("--top-p", "0")] {
        let out = zerostream(&["generate", "--device", "cpu", "--model", save.to_str().unwrap(), "--prompt", "To be", flag, value]);
        let err = stderr(&out);
        assert!(!out.status.success() && err.contains(flag) && !err.contains("model:") && out.stdout.is_empty(), "{flag}: {err}");
    }
    // A damaged tokenizer file in a checkpoint is caught by its manifest.
    std::fs::write(step.join("merges.txt"), "#version: 0.2\n").unwrap();
    let out = zerostream(&["train", "--device", "cpu", "--resume", step.to_str().unwrap(), "--steps", "2", "--sample-tokens", "0"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("merges.txt"), "{err}");
    // --save over a directory holding a saved model with its tokenizer files replaces it; --tokenizer
    // overrides the record, and bytes have no files.
    let mut again = args(&save);
    again.extend(["--tokenizer".to_string(), "bytes".to_string()]);
    let out = zerostream(&again.iter().map(String::as_str).collect::<Vec<_>>());
    let err = stderr(&out);
    assert!(out.status.success() && err.contains("tokenizer: bytes (no Hugging Face tokenizer files"), "{err}");
    assert!(!save.join("vocab.json").exists() && save.join("model.safetensors").is_file());
}

#[test]
fn a_token_file_without_a_tokenizer_record_saves_a_model_without_tokenizer_files_and_says_so_and_keeps_the_sources_ids() {
    let dir = tempfile::tempdir().unwrap();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny");
    let save = dir.path().join("saved");
    let out = zerostream(&[
        "train",
        "--device",
        "cpu",
        "--model",
        &format!("{golden}/model"),
        "--data",
        &format!("{golden}/tokens.bin"),
        "--steps",
        "1",
        "--batch-size",
        "1",
        "--seq-len",
        "8",
        "--sample-tokens",
        "0",
        "--save",
        save.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert!(out.status.success() && err.contains("tokenizer: unknown") && err.contains("tokens.bin.tokenizer"), "{err}");
    let mut names: Vec<String> = std::fs::read_dir(&save).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["config.json", "generation_config.json", "model.safetensors"]);
    // The source's token ids and generation settings go with the model (transformers' generate reads them).
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(save.join("config.json")).unwrap()).unwrap();
    assert_eq!((&config["bos_token_id"], &config["eos_token_id"]), (&50256.into(), &50256.into()), "{config}");
    assert!(config.get("pad_token_id").is_none(), "a null id is left out: {config}");
    let generation = std::fs::read(format!("{golden}/model/generation_config.json")).unwrap();
    assert_eq!(std::fs::read(save.join("generation_config.json")).unwrap(), generation);
    let out = zerostream(&["train", "--device", "cpu", "--tokenizer", "sentencepiece", "--steps", "1"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--tokenizer \"sentencepiece\""), "{err}");
}

#[test]
fn no_graphics_stack_warning_without_a_desktop_session() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_zerostream")).arg("devices").env_remove("XDG_RUNTIME_DIR").output().expect("running zerostream");
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains("XDG_RUNTIME_DIR"), "a warning from the graphics stack: {err}");
}

/// `devices --json` marks as `preferred` the one adapter `--device gpu` opens without `--adapter`, the
/// one whose table scripts read (gpu.sh's read-back choice). Skipped without an adapter (failed under
/// ZEROSTREAM_REQUIRE_GPU=1).
#[test]
fn devices_json_marks_the_adapter_opened_by_default() {
    let opened = match zerostream::device::GpuDevice::open(None, None) {
        Ok(dev) => dev.summary().index,
        Err(e) if std::env::var("ZEROSTREAM_REQUIRE_GPU").as_deref() == Ok("1") => panic!("ZEROSTREAM_REQUIRE_GPU=1 but no adapter: {e:#}"),
        Err(e) => return eprintln!("SKIPPED devices_json_marks_the_adapter_opened_by_default: no GPU adapter ({e:#})"),
    };
    let out = zerostream(&["devices", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let preferred: Vec<u64> = rows.iter().filter(|r| r["preferred"] == true).map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(preferred, vec![opened as u64], "{rows:?}");
    // The cpu device is listed last, as in the text, and exactly one row is the one `--device auto` opens.
    assert_eq!(rows.last().unwrap()["device"], "cpu", "{rows:?}");
    let auto: Vec<&serde_json::Value> = rows.iter().filter(|r| r["auto"] == true).collect();
    let expected = match zerostream::device::resolve_auto(None) {
        zerostream::device::DeviceChoice::Cpu => "cpu",
        _ => "gpu",
    };
    assert!(auto.len() == 1 && auto[0]["device"] == expected, "{rows:?}");
}

#[test]
fn a_tuning_directory_that_is_a_file_is_said_beside_the_untuned_table() {
    if let Err(e) = zerostream::device::GpuDevice::open(None, None) {
        assert!(std::env::var("ZEROSTREAM_REQUIRE_GPU").as_deref() != Ok("1"), "ZEROSTREAM_REQUIRE_GPU=1 but no adapter: {e:#}");
        return eprintln!("SKIPPED a_tuning_directory_that_is_a_file_is_said_beside_the_untuned_table: no GPU adapter ({e:#})");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tune");
    std::fs::write(&file, "not a directory").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_zerostream")).arg("devices").env("ZEROSTREAM_TUNE_DIR", &file).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("not tuned here"), "{said}");
    assert!(said.contains(&format!("warning: ZEROSTREAM_TUNE_DIR={} is not a directory", file.display())), "{said}");
}

/// A preemption loop re-runs one command; once the checkpoint is at `--steps`, the command ends at once
/// with success, writing `--save` from the checkpoint's model if it is missing, and leaving it otherwise.
#[test]
fn a_finished_run_resumed_is_done_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, save) = (dir.path().join("ckpt"), dir.path().join("final"));
    let (ckpt, save) = (ckpt.to_str().unwrap(), save.to_str().unwrap());
    let common = ["--device", "cpu", "--batch-size", "2", "--seq-len", "16", "--sample-tokens", "0"];
    let mut first = vec!["train", "--steps", "2", "--checkpoint-dir", ckpt, "--checkpoint-every", "2"];
    first.extend(common);
    let out = zerostream(&first);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut again = vec!["train", "--resume", ckpt, "--steps", "2", "--save", save];
    again.extend(["--device", "cpu"]);
    let out = zerostream(&again);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("nothing left to train"), "{}", stderr(&out));
    let saved: Vec<String> = std::fs::read_dir(save).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(saved.contains(&"model.safetensors".to_string()) && saved.contains(&"config.json".to_string()), "{saved:?}");
    assert!(!saved.iter().any(|f| f.starts_with("optimizer.") || f == "trainer_state.json"), "{saved:?}");
    let out = zerostream(&again);
    assert!(out.status.success() && stderr(&out).contains("exists already"), "{}", stderr(&out));
}

/// `--save` of a finished run asked for another `--save-dtype` writes the weights in it from the
/// checkpoint's f32 master weights: a bf16 run saved as f32 gives values that round to the
/// checkpoint's bf16 ones but are not all bf16 values themselves; the tokenizer's files come along.
#[test]
fn a_finished_run_saved_in_another_dtype_is_written_from_its_master_weights() {
    use safetensors::{Dtype, SafeTensors};
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, save) = (dir.path().join("ckpt"), dir.path().join("final"));
    let (ckpt_s, save_s) = (ckpt.to_str().unwrap(), save.to_str().unwrap());
    let common = ["--device", "cpu", "--batch-size", "2", "--seq-len", "16", "--sample-tokens", "0", "--precision", "bf16"];
    let out = zerostream(&[&["train", "--steps", "2", "--checkpoint-dir", ckpt_s, "--checkpoint-every", "2"][..], &common].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let out = zerostream(&["train", "--resume", ckpt_s, "--steps", "2", "--save", save_s, "--save-dtype", "f32", "--device", "cpu"]);
    assert!(
        out.status.success() && stderr(&out).contains("in f32 (from its f32 master weights; the checkpoint saved bf16)"),
        "{}",
        stderr(&out)
    );
    let step = ckpt.join("step-00000002");
    let names = |d: &Path| {
        let mut n: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        n.retain(|f| !f.starts_with("optimizer.") && f != "trainer_state.json");
        n.sort();
        n
    };
    assert_eq!(names(&save), names(&step), "the same files as the checkpoint's model");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(save.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "float32");
    let (theirs, ours) = (std::fs::read(step.join("model.safetensors")).unwrap(), std::fs::read(save.join("model.safetensors")).unwrap());
    let (theirs, ours) = (SafeTensors::deserialize(&theirs).unwrap(), SafeTensors::deserialize(&ours).unwrap());
    assert_eq!(theirs.len(), ours.len());
    let mut off_the_bf16_grid = 0;
    for (name, t) in theirs.tensors() {
        let o = ours.tensor(&name).unwrap();
        assert_eq!((t.dtype(), o.dtype(), t.shape()), (Dtype::BF16, Dtype::F32, o.shape()), "{name}");
        let bf16: Vec<u16> = t.data().chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        let f32s: Vec<f32> = o.data().chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        for (&h, &x) in bf16.iter().zip(&f32s) {
            assert_eq!(half::bf16::from_f32(x).to_bits(), h, "{name}: {x} does not round to the checkpoint's bf16");
            off_the_bf16_grid += usize::from(half::bf16::from_f32(x).to_f32() != x);
        }
    }
    assert!(off_the_bf16_grid > 0, "every f32 weight is a bf16 value: read from the model file, not the master weights");
}

#[test]
fn progress_is_one_plain_line_per_step_off_a_terminal_and_quiet_prints_none() {
    // The test's stderr is a pipe, not a terminal: no bar, so every step gets its own line.
    let common = ["--device", "cpu", "--batch-size", "2", "--seq-len", "16", "--sample-tokens", "0", "--steps", "3"];
    let out = zerostream(&[&["train"][..], &common].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stderr(&out);
    let steps: Vec<&str> = text.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(steps.len(), 3, "one line per step:\n{text}");
    assert!(!text.contains('\r') && !text.contains("\u{1b}["), "no carriage returns or escapes off a terminal:\n{text:?}");
    assert!(text.contains("what it did"), "{text}");
    // --quiet, before or after the command: nothing but warnings and errors.
    for args in [[&["--quiet", "train"][..], &common].concat(), [&["train", "--quiet"][..], &common].concat()] {
        let out = zerostream(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stderr(&out).trim(), "", "--quiet printed: {}", stderr(&out));
    }
    // A bad flag still says why under --quiet.
    let out = zerostream(&[&["--quiet", "train", "--lr=-1"][..], &common].concat());
    assert!(!out.status.success() && stderr(&out).contains("--lr -1: must be"), "{}", stderr(&out));
}

#[test]
fn a_closed_standard_output_ends_the_command_quietly() {
    use std::process::Stdio;
    // `plan` prints a page into a pipe whose reader is gone before it starts, as after `zerostream
    // plan | head -0`.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_zerostream"))
        .args(["plan", "--config", "gpt2", "--device", "cpu"])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("running zerostream");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(141), "exit code of a closed pipe; stderr: {err}");
    assert!(!err.contains("panicked"), "no panic report: {err}");
}

/// `plan --device auto` plans the device `auto` will open, here as `train` does (the cpu device where
/// wgpu finds no real GPU: its memory then counts in the RAM the run needs).
#[test]
fn plan_with_device_auto_plans_the_device_it_opens() {
    let opened = match zerostream::device::resolve_auto(None) {
        zerostream::device::DeviceChoice::Cpu => "cpu",
        _ => "gpu",
    };
    // The RAM available here moves between the two runs: the verdict after the RAM needed is cut.
    let plan = |device: &str| {
        let out = zerostream(&["plan", "--config", "gpt2", "--device", device]);
        assert!(out.status.success(), "plan --device {device}: {}", stderr(&out));
        let text = String::from_utf8(out.stdout).unwrap();
        text.lines().map(|l| l.split(" GiB of RAM, ").next().unwrap_or(l).to_string()).collect::<Vec<_>>().join("\n")
    };
    let auto = plan("auto");
    assert_eq!(auto, plan(opened), "--device auto plans as --device {opened}");
    assert!(auto.contains("the device's") && auto.contains("host state per rank"), "the device's share of RAM is named: {auto}");
}

/// A plan that does not fit this machine's RAM exits 3, apart from errors (1): Llama-3-8B's fp32 state
/// on the cpu device, 190 GiB, against the RAM of any machine this test runs on (checked, not assumed).
#[test]
fn a_plan_that_exceeds_this_machines_ram_exits_3() {
    let out = zerostream(&["plan", "--config", "llama-3-8b", "--device", "cpu"]);
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    if zerostream::device::alloc::available_ram_bytes().is_some_and(|avail| avail < 150 << 30) {
        assert!(text.contains("does NOT fit in the") && text.contains("put more state on NVMe: --offload-optimizer nvme,"), "{text}");
    }
    let exceeds = text.contains("does NOT fit in the");
    assert_eq!(out.status.code(), Some(if exceeds { 3 } else { 0 }), "{text}{}", stderr(&out));
    let out = zerostream(&["plan", "--config", "gpt2", "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// The help of every flag that takes a preset lists each one (the list is written out in each doc
/// comment, which clap cannot build from a constant).
#[test]
fn every_preset_is_in_the_help_of_every_flag_that_takes_one() {
    for command in [&["train", "--help"][..], &["tune", "--help"], &["bench", "kernels", "--help"]] {
        let help = String::from_utf8(zerostream(command).stdout).unwrap();
        for preset in zerostream::model::Model::PRESETS.split(", ") {
            assert!(help.contains(preset), "{command:?} does not name {preset}:\n{help}");
        }
    }
}

#[test]
fn flags_that_would_do_nothing_are_refused_or_said_to_be_ignored() {
    let out = zerostream(&["plan", "--device", "cpu", "--adapter", "0"]);
    assert!(!out.status.success(), "{}", stderr(&out));
    let out = zerostream(&["eval", "--device", "cpu", "--adapter", "0", "--model", "m", "--data", "d"]);
    assert!(!out.status.success() && stderr(&out).contains("--adapter 0 picks a GPU, but --device cpu"), "{}", stderr(&out));
    for cache in ["1GiB", "auto"] {
        let out = zerostream(&["plan", "--device", "cpu", "--params-ram-cache", cache]);
        assert!(!out.status.success() && stderr(&out).contains("add --offload-params nvme"), "{cache}: {}", stderr(&out));
    }
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    let out = zerostream(&["plan", "--device", "cpu", "--metrics", metrics.to_str().unwrap()]);
    assert!(out.status.success() && stderr(&out).contains("writes no files: --metrics ignored"), "{}", stderr(&out));
    assert!(!metrics.exists());
    // train: a flag the resolved run leaves idle is named, once, with why.
    let out = zerostream(&one_step_train(&["--momentum", "0.5"]));
    let said = stderr(&out);
    assert!(out.status.success() && said.matches("--momentum does nothing here").count() == 1, "{said}");
    // A run repeated from its resolved configuration (every flag, defaults too) gets no such note.
    let metrics = dir.path().join("r.jsonl");
    let m = metrics.to_str().unwrap();
    let out = zerostream(&one_step_train(&["--metrics", m]));
    assert!(out.status.success(), "{}", stderr(&out));
    let resolved = dir.path().join("r.config.toml");
    let again =
        zerostream(&["train", "--config-file", resolved.to_str().unwrap(), "--metrics", dir.path().join("r2.jsonl").to_str().unwrap()]);
    assert!(again.status.success() && !stderr(&again).contains("does nothing here"), "{}", stderr(&again));
    let help = zerostream(&["train", "--help"]);
    assert!(!String::from_utf8_lossy(&help.stdout).contains("--measure"), "train refuses --measure, so its help leaves it out");
    assert!(String::from_utf8_lossy(&zerostream(&["plan", "--help"]).stdout).contains("--measure"));
}
