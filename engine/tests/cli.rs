//! The `zerostream` binary end to end: a short training run with its metrics file, `prepare`, and the
//! clear refusals of bad input.

use std::process::Command;

fn zerostream(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_zerostream")).args(args).output().expect("running zerostream")
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_short_run_writes_one_metrics_line_per_step_and_saves_a_loadable_model() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let save = dir.path().join("model");
    let out = zerostream(&[
        "train",
        "--device",
        "cpu",
        "--steps",
        "6",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--grad-accum",
        "2",
        "--metrics",
        metrics.to_str().unwrap(),
        "--save",
        save.to_str().unwrap(),
        "--sample-tokens",
        "20",
        "--offload-optimizer",
        "nvme",
        "--nvme-dir",
        dir.path().to_str().unwrap(),
        "--recompute",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 6);
    for (s, line) in lines.iter().enumerate() {
        assert_eq!(line["step"], s as u64);
        for key in ["loss", "grad_norm", "lr", "loss_scale", "tokens_per_s", "device_busy_fraction", "peak_device_bytes"] {
            assert!(line[key].is_number(), "metrics line {s} lacks {key}: {line}");
        }
        for key in ["device_compute_s", "upload_s", "download_s", "adam_s", "io_wait_s"] {
            assert!(line["time"][key].is_number(), "metrics line {s} lacks time.{key}: {line}");
        }
    }
    assert!(lines[5]["loss"].as_f64().unwrap() < lines[0]["loss"].as_f64().unwrap(), "the loss should fall: {lines:?}");
    let err = stderr(&out);
    assert!(err.contains("placement:") && err.contains("sample ("), "{err}");
    // The saved directory loads back for evaluation.
    let hf = zerostream_checkpoints::HfModel::open(&save).unwrap();
    let demo = zerostream::train::demo::Demo::get().unwrap();
    assert_eq!(zerostream::model::Model::of_hf(&hf).unwrap().vocab_size(), demo.vocab_size());
    // The built-in run's word tokenizer goes with the model, so its words come back from `generate`.
    let saved = zerostream_checkpoints::HfTokenizer::from_file(&save.join("tokenizer.json")).unwrap();
    assert_eq!(saved.encode("HAMLET\nWho's there?").unwrap(), demo.tokenizer.encode("HAMLET\nWho's there?").unwrap());
    assert!(err.contains("what it did:") && err.contains("state:") && err.contains("traffic:"), "{err}");
}

#[test]
fn prepare_writes_a_token_file_train_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "To be, or not to be, that is the question.").unwrap();
    let tokens = dir.path().join("t.bin");
    let out = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", tokens.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = zerostream_checkpoints::TokenFile::open(&tokens).unwrap();
    assert_eq!(file.get(0), 2514, "GPT-2's id for \"To\"");
}

#[test]
fn bad_input_is_refused_with_the_flag_and_the_numbers() {
    let out = zerostream(&["train", "--device", "cpu", "--gpu-mem-budget", "1MiB"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--gpu-mem-budget") && err.contains("cannot hold the minimum"), "{err}");
    let out = zerostream(&["train", "--device", "cpu", "--offload-optimizer", "nvme"]);
    assert!(!out.status.success() && stderr(&out).contains("--nvme-dir"), "{}", stderr(&out));
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/tokens.bin");
    let out = zerostream(&["train", "--device", "cpu", "--config", "gpt3", "--data", data]);
    assert!(!out.status.success() && stderr(&out).contains("gpt3"), "{}", stderr(&out));
    let out = zerostream(&["train", "--device", "cpu", "--offload-params", "nvme", "--nvme-dir", "/proc/nonexistent/dir"]);
    assert!(!out.status.success() && stderr(&out).contains("/proc/nonexistent/dir"), "{}", stderr(&out));
}

#[test]
fn hyperparameters_out_of_range_and_metrics_over_an_input_are_refused_before_any_work() {
    for (flag, value) in [
        ("--lr", "nan"),
        ("--lr", "-1"),
        ("--beta1", "1"),
        ("--beta2", "2"),
        ("--eps", "0"),
        ("--weight-decay", "-100"),
        ("--grad-clip", "inf"),
    ] {
        let out = zerostream(&["train", "--device", "cpu", "--steps", "1", &format!("{flag}={value}")]);
        let err = stderr(&out);
        assert!(!out.status.success() && err.contains(flag) && err.contains("must be"), "{flag} {value}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("tokens.bin");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/tokens.bin"), &data).unwrap();
    let before = std::fs::read(&data).unwrap();
    let d = data.to_str().unwrap();
    let out = zerostream(&["train", "--device", "cpu", "--config", "gpt2", "--data", d, "--metrics", d]);
    assert!(!out.status.success() && stderr(&out).contains("is the input"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&data).unwrap(), before, "the data file is untouched");
    // A pipe or a directory as --data is refused at once (a pipe would block the open).
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for path in [fifo.to_str().unwrap(), dir.path().to_str().unwrap()] {
        let out = zerostream(&["train", "--device", "cpu", "--config", "gpt2", "--data", path, "--steps", "1"]);
        assert!(!out.status.success() && stderr(&out).contains("not a regular file"), "{path}: {}", stderr(&out));
    }
}

#[test]
fn a_diverged_run_stops_with_an_error_after_a_few_skipped_steps() {
    // lr 1e30 sends the weights to infinity in one update; every later step's gradients are non-finite.
    let out = zerostream(&[
        "train",
        "--device",
        "cpu",
        "--steps",
        "20",
        "--batch-size",
        "1",
        "--seq-len",
        "16",
        "--lr",
        "1e30",
        "--warmup-steps",
        "0",
        "--lr-schedule",
        "constant",
        "--grad-clip",
        "0",
        "--sample-tokens",
        "0",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("were all skipped") && err.contains("diverged"), "{err}");
}

#[test]
fn a_run_too_big_for_this_machines_ram_is_refused_before_any_work() {
    // 64 in-process ranks of GPT-2 1.5B at stage 1 would need about 800 GB of RAM.
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/tokens.bin");
    let out = zerostream(&[
        "train",
        "--device",
        "cpu",
        "--config",
        "gpt2-xl",
        "--data",
        data,
        "--world-size",
        "64",
        "--zero-stage",
        "1",
        "--steps",
        "1",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("host RAM") && err.contains("GiB is available"), "{err}");
}

#[test]
fn a_run_too_big_for_its_nvme_disk_is_refused_before_any_work() {
    // A GPT-2 of 15000 blocks of width 2048 (755B parameters): ~12.7 TiB of state on NVMe, more than any
    // disk a test runs on; its RAM need (the groups paged in) is small.
    let dir = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/scale/gpt2-3b.json")).unwrap())
            .unwrap();
    config["n_layer"] = 15000.into();
    let config_path = dir.path().join("huge.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let nvme = dir.path().join("nvme");
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/tokens.bin");
    let out = zerostream(&[
        "train",
        "--device",
        "cpu",
        "--config",
        config_path.to_str().unwrap(),
        "--data",
        data,
        "--precision",
        "bf16",
        "--offload-optimizer",
        "nvme",
        "--offload-params",
        "nvme",
        "--nvme-dir",
        nvme.to_str().unwrap(),
        "--steps",
        "1",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--nvme-dir") && err.contains("GiB free"), "{err}");
    assert!(!nvme.exists(), "nothing was written before the refusal");
}

#[test]
fn raw_uint32_token_files_train_like_the_uint16_original() {
    let dir = tempfile::tempdir().unwrap();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny");
    let original = zerostream_checkpoints::TokenFile::open(std::path::Path::new(&format!("{golden}/tokens.bin"))).unwrap();
    let raw = dir.path().join("tokens.u32");
    let words: Vec<u8> = (0..original.len).flat_map(|i| original.get(i).to_le_bytes()).collect();
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
    assert_eq!((0..file.len).map(|i| file.get(i)).collect::<Vec<_>>(), vec![1, 2, 3, 70000, 1, 2, 0]);
    let bad = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", out.to_str().unwrap(), "--tokenizer", "nonesuch.json"]);
    assert!(!bad.status.success() && stderr(&bad).contains("nonesuch.json"), "{}", stderr(&bad));
}

#[test]
fn a_full_disk_under_the_metrics_file_does_not_stop_training() {
    // /dev/full fails every write with ENOSPC.
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let out = zerostream(&[
        "train",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--batch-size",
        "1",
        "--seq-len",
        "16",
        "--sample-tokens",
        "0",
        "--metrics",
        "/dev/full",
        "--checkpoint-dir",
        ck.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert!(out.status.success() && err.contains("writing --metrics failed at step 0"), "{err}");
    assert_eq!(std::fs::read_to_string(ck.join("latest")).unwrap().trim(), "step-00000002", "the training finished: {err}");
}

#[test]
fn plot_overlays_runs_and_never_overwrites_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (name, lr) in [("a", "2e-3"), ("b", "1e-3")] {
        let metrics = dir.path().join(format!("{name}.jsonl"));
        let out = zerostream(&[
            "train",
            "--device",
            "cpu",
            "--steps",
            "3",
            "--batch-size",
            "1",
            "--seq-len",
            "16",
            "--lr",
            lr,
            "--sample-tokens",
            "0",
            "--metrics",
            metrics.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        files.push(metrics.to_str().unwrap().to_string());
    }
    assert!(dir.path().join("loss.svg").exists(), "a run writes loss.svg beside its metrics");
    let svg = dir.path().join("cmp.svg");
    let out = zerostream(&["plot", &files[0], &files[1], "-o", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let before = std::fs::read(&files[0]).unwrap();
    let out = zerostream(&["plot", &files[0], "-o", &files[0]]);
    assert!(!out.status.success() && stderr(&out).contains("would be overwritten"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&files[0]).unwrap(), before);
}

#[test]
fn validation_loss_is_the_number_eval_gives_for_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny");
    let (model, data) = (format!("{golden}/model"), format!("{golden}/tokens.bin"));
    let metrics = dir.path().join("m.jsonl");
    let out = zerostream(&[
        "train",
        "--device",
        "cpu",
        "--model",
        &model,
        "--data",
        &data,
        "--val-data",
        &data,
        "--eval-every",
        "2",
        "--eval-batches",
        "3",
        "--steps",
        "4",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--sample-tokens",
        "0",
        "--metrics",
        metrics.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert!(out.status.success() && err.contains("validation: loss"), "{err}");
    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let has_val: Vec<bool> = rows.iter().map(|r| r["val_loss"].is_number()).collect();
    assert_eq!(has_val, [true, false, true, false], "steps 0 and 2 are validated");
    // Step 0's validation is the initial model's: `eval` of the same model on the same micro-batches.
    let eval = zerostream(&[
        "eval",
        "--device",
        "cpu",
        "--model",
        &model,
        "--data",
        &data,
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--batches",
        "3",
    ]);
    assert!(eval.status.success(), "{}", stderr(&eval));
    let eval: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    assert_eq!(rows[0]["val_loss"].as_f64(), eval["loss"].as_f64());
    assert!((rows[0]["val_perplexity"].as_f64().unwrap() - rows[0]["val_loss"].as_f64().unwrap().exp()).abs() < 1e-9);
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
        (0..f.len).map(|i| f.get(i)).collect::<Vec<u32>>()
    };
    let (train, val) = (read(&out), read(&dir.path().join("docs.val.bin")));
    // GPT-2's <|endoftext|> between documents: 8 training documents, 2 held out.
    assert_eq!(train.iter().filter(|&&t| t == 50256).count(), 7);
    assert_eq!(val.iter().filter(|&&t| t == 50256).count(), 1);
    assert!(stderr(&run).contains("2 held-out documents"), "{}", stderr(&run));
    let bad = zerostream(&["prepare", "--text", text.to_str().unwrap(), "--out", out.to_str().unwrap(), "--val-fraction", "1.5"]);
    assert!(!bad.status.success() && stderr(&bad).contains("--val-fraction 1.5"), "{}", stderr(&bad));
}

/// Greedy decoding gives the tokens transformers' greedy `generate` gives (recorded from it: see
/// tests/golden/gpt2-tiny-trained/README.md), on the cpu device and the GPU.
#[test]
fn greedy_generation_matches_transformers_on_both_devices() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny-trained");
    let want: Vec<u64> = vec![32, 116, 104, 101, 32, 110, 101, 32, 97, 110, 32, 110, 32, 98, 101, 32, 116, 101, 32, 97];
    let mut devices = vec!["cpu"];
    if common_gpu_available() {
        devices.push("gpu");
    }
    for device in devices {
        // Everything resident (134 KiB); then 100 KiB, which holds the head, the cache and one block slot
        // (84 KiB: both blocks are uploaded for every token).
        for budget in [None, Some("100KiB")] {
            let mut args = vec![
                "generate",
                "--model",
                model,
                "--prompt-tokens",
                "84,104,101",
                "--max-new-tokens",
                "20",
                "--temperature",
                "0",
                "--json",
                "--device",
                device,
            ];
            args.extend(budget.iter().flat_map(|b| ["--gpu-mem-budget", b]));
            let out = zerostream(&args);
            assert!(out.status.success(), "{device} {budget:?}: {}", stderr(&out));
            let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let ids: Vec<u64> = line["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            assert_eq!(ids, want, "{device} {budget:?}");
            assert_eq!(line["new_tokens"], 20);
            let plan = if budget.is_some() { "0 of 2 blocks resident, the rest streamed" } else { "2 of 2 blocks resident;" };
            assert!(stderr(&out).contains(plan), "{device} {budget:?}: {}", stderr(&out));
        }
        let small = zerostream(&["generate", "--model", model, "--prompt-tokens", "84", "--device", device, "--gpu-mem-budget", "50KiB"]);
        let err = stderr(&small);
        assert!(!small.status.success() && err.contains("one token needs") && err.contains("--gpu-mem-budget"), "{device}: {err}");
    }
    // Sampling is seeded: the same seed, the same tokens.
    let sampled = |seed: &str| {
        let out = zerostream(&[
            "generate",
            "--model",
            model,
            "--prompt-tokens",
            "84",
            "--max-new-tokens",
            "8",
            "--top-k",
            "5",
            "--top-p",
            "0.9",
            "--seed",
            seed,
            "--json",
            "--device",
            "cpu",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(sampled("3"), sampled("3"));
    let bad = zerostream(&["generate", "--model", model, "--prompt-tokens", "500", "--device", "cpu"]);
    assert!(!bad.status.success() && stderr(&bad).contains("prompt token 500"), "{}", stderr(&bad));
}

/// The end-of-run sample with two ranks: each rank generates, paging the master weights in group by
/// group (each group's gather is a collective), and rank 0 prints the text.
#[test]
fn the_end_of_run_sample_runs_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let args =
        ["train", "--device", "cpu", "--steps", "1", "--batch-size", "2", "--seq-len", "32", "--world-size", "2", "--sample-tokens", "12"];
    let out = zerostream(&[&args[..], &["--offload-optimizer", "nvme", "--nvme-dir", dir.path().to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out).matches("sample (12 tokens").count(), 1, "{}", stderr(&out));
}

/// Whether a GPU adapter is there (a test that needs one fails under ZEROSTREAM_REQUIRE_GPU=1 without it).
fn common_gpu_available() -> bool {
    match zerostream::device::GpuDevice::open(None, None) {
        Ok(_) => true,
        Err(e) => {
            assert!(std::env::var("ZEROSTREAM_REQUIRE_GPU").as_deref() != Ok("1"), "ZEROSTREAM_REQUIRE_GPU=1 but no GPU adapter: {e:#}");
            eprintln!("SKIPPED the GPU half: no GPU adapter ({e:#})");
            false
        }
    }
}

/// `plan` (and train's check before any work) counts with the costs of the device `--device` names:
/// the cpu device keeps 16-bit block slots widened to f32, a GPU packs them.
#[test]
fn plan_counts_slots_as_the_named_device_stores_them() {
    let slot = |device: &str| -> String {
        let out = zerostream(&["plan", "--device", device, "--precision", "bf16"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let at = text.find("block slots x ").unwrap_or_else(|| panic!("{text}"));
        text[at..].split_whitespace().nth(3).unwrap().to_string()
    };
    let (cpu, gpu): (f64, f64) = (slot("cpu").parse().unwrap(), slot("gpu").parse().unwrap());
    assert!((cpu / gpu - 2.0).abs() < 0.3, "a bf16 slot: {cpu} MiB on the cpu device, {gpu} MiB on a GPU");
}
