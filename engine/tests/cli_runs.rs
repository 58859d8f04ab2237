//! The `zerostream` binary's commands end to end on working input: a short training run with its
//! metrics file and saved model, training through a full disk under the metrics, validation against
//! `eval`, `plot`, `generate` against transformers, the end-of-run sample on every rank, and `plan`.

mod common;

use common::cli::{stderr, zerostream};

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
    let mut lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // The built-in run holds out its last scenes: the last row is the validation after step 5.
    let last = lines.pop().unwrap();
    assert!(last["final_validation"] == true && last["step"] == 6 && last["val_loss"].is_number(), "{last}");
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
    // Printed as it comes, decoded after the prompt: the word tokenizer's space between them too.
    let model = save.to_str().unwrap();
    let generated = zerostream(&["generate", "--device", "cpu", "--model", model, "--prompt", "HAMLET", "--max-new-tokens", "3"]);
    let printed = String::from_utf8_lossy(&generated.stdout);
    assert!(generated.status.success() && printed.starts_with("HAMLET ") && !printed.starts_with("HAMLET  "), "{printed:?}");
    assert!(err.contains("what it did:") && err.contains("state:") && err.contains("traffic:"), "{err}");
}

/// `--trace` on the gpu device (the asynchronous one, whose downloads overlap backward): a Chrome trace
/// whose device-thread spans follow the step schedule (every block forward and backward, each download
/// begun and finished, in each step), nested inside one span per step, and whose optimizer-thread spans
/// are one update per group for every step but the last (whose update may end after the run: dropped).
#[test]
fn trace_writes_the_step_schedule_as_a_chrome_timeline() {
    if !common_gpu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("timeline/trace.json");
    let args = ["train", "--device", "gpu", "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--sample-tokens", "0"];
    let out = zerostream(&[&args[..], &["--trace", trace.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let events: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let spans = |tid: u64, cat: &str| -> Vec<&serde_json::Value> {
        events.iter().filter(|e| e["ph"] == "X" && e["tid"] == tid && e["cat"] == cat).collect()
    };
    // The built-in run's model: 4 blocks.
    for (cat, per_step) in [("forward", 4), ("backward", 4), ("download>", 4), ("download<", 4), ("head", 1), ("step", 1)] {
        assert_eq!(spans(1, cat).len(), 3 * per_step, "{cat} spans on the device thread");
    }
    let steps = spans(1, "step");
    for e in events.iter().filter(|e| e["ph"] == "X" && e["tid"] == 1 && e["cat"] != "step") {
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        let inside = |s: &&serde_json::Value| {
            let (sts, sdur) = (s["ts"].as_f64().unwrap(), s["dur"].as_f64().unwrap());
            sts <= ts && ts + dur <= sts + sdur + 1.0
        };
        assert!(dur >= 0.0 && steps.iter().any(inside), "{e} is in no step");
    }
    // 5 groups (the head's, then the 4 blocks'); the last step's sweep may be cut off.
    let updates = spans(2, "update").len();
    assert!((2 * 5..=3 * 5).contains(&updates), "{updates} update spans: 5 groups a step");
}

/// A stream as the metrics (here /dev/full, which fails every write with ENOSPC, as a full disk does)
/// gets its rows, and nothing is written beside it: no resolved configuration or plot in /dev.
#[test]
fn a_full_disk_under_the_metrics_file_does_not_stop_training() {
    let beside = ["/dev/full.config.toml", "/dev/full.svg"];
    // Left by runs before streams were told apart.
    beside.iter().for_each(|p| drop(std::fs::remove_file(p)));
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
    assert!(beside.iter().all(|p| !std::path::Path::new(p).exists()), "a file was written beside /dev/full");
}

#[test]
fn plot_overlays_runs_and_never_overwrites_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    // "a" twice: the second run replaces the first's rows, and says so.
    for (name, lr) in [("a", "2e-3"), ("a", "2e-3"), ("b", "1e-3")] {
        let metrics = dir.path().join(format!("{name}.jsonl"));
        let replaced = metrics.exists();
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
        assert_eq!(stderr(&out).contains("replacing the 4 rows an earlier run wrote there"), replaced, "{}", stderr(&out));
        assert_eq!(std::fs::read_to_string(&metrics).unwrap().lines().count(), 4, "3 steps and the validation after them");
        if !replaced {
            files.push(metrics.to_str().unwrap().to_string());
        }
    }
    for name in ["a", "b"] {
        assert!(dir.path().join(format!("{name}.svg")).exists(), "each run draws NAME.svg beside its NAME.jsonl");
    }
    let svg = dir.path().join("cmp.svg");
    let out = zerostream(&["plot", &files[0], &files[1], "-o", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let before = std::fs::read(&files[0]).unwrap();
    let out = zerostream(&["plot", &files[0], "-o", &files[0]]);
    assert!(!out.status.success() && stderr(&out).contains("would be overwritten"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&files[0]).unwrap(), before);
    // A missing input is reported as missing, not as the output (neither path exists).
    let missing = dir.path().join("missing.jsonl");
    let out = zerostream(&["plot", missing.to_str().unwrap(), "-o", dir.path().join("new.svg").to_str().unwrap()]);
    assert!(!out.status.success() && stderr(&out).contains("missing.jsonl: No such file"), "{}", stderr(&out));
    // Only SVG is drawn: a .png name is refused rather than filled with SVG.
    let png = dir.path().join("cmp.png");
    let out = zerostream(&["plot", &files[0], "-o", png.to_str().unwrap()]);
    assert!(!out.status.success() && stderr(&out).contains("SVG only") && !png.exists(), "{}", stderr(&out));
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
    assert_eq!(has_val, [true, false, true, false, true], "steps 0 and 2 are validated, and the weights the last step left");
    assert!(rows[4]["step"] == 4 && rows[4]["final_validation"] == true && rows[4].get("loss").is_none(), "{}", rows[4]);
    let said = err.split("validation: loss ").nth(1).and_then(|s| s.split_whitespace().next()).unwrap();
    assert_eq!(format!("{:.4}", rows[4]["val_loss"].as_f64().unwrap()), said, "the row holds the loss the log says");
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
fn a_short_file_is_read_whole_by_eval_and_validation_and_one_too_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny");
    let (model, data) = (format!("{golden}/model"), format!("{golden}/tokens.bin"));
    // Asked for more micro-batches than the file holds, both read each of them once, and say so.
    let shape = ["--device", "cpu", "--data", &data, "--batch-size", "2", "--seq-len", "16"];
    let all = zerostream(&[&["eval", "--model", &model, "--batches", "100000"][..], &shape].concat());
    assert!(all.status.success() && stderr(&all).contains("fewer than --batches 100000"), "{}", stderr(&all));
    let all: serde_json::Value = serde_json::from_slice(&all.stdout).unwrap();
    let held = all["batches"].as_u64().unwrap();
    assert!((2..100000).contains(&held), "{all}");
    let exact = zerostream(&[&["eval", "--model", &model, "--batches", &held.to_string()][..], &shape].concat());
    let exact: serde_json::Value = serde_json::from_slice(&exact.stdout).unwrap();
    assert_eq!(all["loss"].as_f64(), exact["loss"].as_f64());
    let metrics = dir.path().join("all.jsonl");
    let flags = ["--model", &model, "--val-data", &data, "--eval-every", "1", "--eval-batches", "100000", "--steps", "1"];
    let out = zerostream(&[&["train", "--sample-tokens", "0", "--metrics", metrics.to_str().unwrap()][..], &flags, &shape].concat());
    assert!(out.status.success() && stderr(&out).contains(&format!("holds {held} micro-batches")), "{}", stderr(&out));
    let row: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&metrics).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(row["val_loss"].as_f64(), exact["loss"].as_f64(), "train's validation reads what eval reads");
    // Validation data without one micro-batch is refused before training, not after it.
    let small = dir.path().join("small.bin");
    std::fs::write(&small, [0u8; 20]).unwrap();
    let flags = ["--model", &model, "--val-data", small.to_str().unwrap(), "--eval-every", "0", "--steps", "1"];
    let out = zerostream(&[&["train", "--sample-tokens", "0"][..], &flags, &shape].concat());
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("validation data") && err.contains("--batch-size 2 x --seq-len 16"), "{err}");
    assert!(!err.contains("tok/s"), "no step ran: {err}");
}

/// A model whose sliding window bounds its context generates as the model without the window up to
/// it, then stops, saying why; a prompt longer than the window is refused (past the window, each
/// layer's keys carry the text before it, which a recompute over the window would not).
#[test]
fn generation_stops_at_a_sliding_window() {
    let dir = tempfile::tempdir().unwrap();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/llama-tiny/model");
    for name in ["config.json", "model.safetensors"] {
        std::fs::copy(format!("{golden}/{name}"), dir.path().join(name)).unwrap();
    }
    let config_path = dir.path().join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["sliding_window"] = 8.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let ids = |model: &str, prompt: &str| {
        let out = zerostream(&[
            "generate",
            "--device",
            "cpu",
            "--model",
            model,
            "--prompt-tokens",
            prompt,
            "--max-new-tokens",
            "20",
            "--temperature",
            "0",
            "--json",
        ]);
        let row: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("null")).unwrap();
        (row["ids"].as_array().map(|ids| ids.iter().map(|i| i.as_u64().unwrap()).collect::<Vec<_>>()), stderr(&out))
    };
    let windowed = dir.path().to_str().unwrap();
    let (full, _) = ids(golden, "5,17,99,3");
    let (within, err) = ids(windowed, "5,17,99,3");
    let within = within.unwrap();
    assert_eq!(within.len(), 5, "4 prompt tokens + 5 new: the last from position 7 ({err})");
    assert_eq!(within[..], full.unwrap()[..5], "the window changes nothing within it");
    assert!(err.contains("generation stopped after 5 new tokens at the model's sliding window of 8"), "{err}");
    let (refused, err) = ids(windowed, "1,2,3,4,5,6,7,8,9");
    assert!(refused.is_none() && err.contains("the prompt's 9 tokens are more than the model's sliding window of 8"), "{err}");
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
        assert!(err.contains("leaves 50.0 KiB for generation"), "sizes in the unit that shows them: {err}");
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
    // The text is the run's result on stdout, once, and stays there under --quiet.
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.lines().filter(|l| !l.is_empty()).count() >= 1, "{text:?}");
    let quiet = zerostream(&[&["--quiet"][..], &args[..5], &["--batch-size", "1", "--seq-len", "8", "--sample-tokens", "5"]].concat());
    assert!(quiet.status.success() && !quiet.stdout.is_empty() && quiet.stderr.is_empty(), "{}", stderr(&quiet));
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

/// `bench io` measures every engine in a directory it creates, and leaves nothing behind: not its
/// file, not the directories it made.
#[test]
fn bench_io_measures_and_leaves_no_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("new").join("drive");
    let out = zerostream(&[
        "bench",
        "io",
        "--dir",
        dir.to_str().unwrap(),
        "--size",
        "4MiB",
        "--block-size",
        "1MiB",
        "--queue-depth",
        "2",
        "--io-engine",
        "threads",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{report}");
    assert!(runs[0]["write_gbps"].as_f64().unwrap() > 0.0 && runs[0]["read_gbps"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(runs[0]["bytes"], 4 << 20, "{report}");
    assert!(!tmp.path().join("new").exists(), "bench io left {} behind", tmp.path().join("new").display());
    // A size that is no whole number of blocks moves the next whole number, and says so.
    let odd = ["bench", "io", "--dir", dir.to_str().unwrap(), "--size", "2500KiB", "--block-size", "1MiB", "--queue-depth", "2"];
    let out = zerostream(&[&odd[..], &["--io-engine", "threads"]].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("(3MiB each way: --size rounded up"), "{text}{}", stderr(&out));
    // Bad flags are named, before anything is written (they ran, or named a Rust struct).
    for (flag, value) in [("--size", "0"), ("--block-size", "3"), ("--queue-depth", "0")] {
        let out = zerostream(&["bench", "io", "--dir", dir.to_str().unwrap(), flag, value]);
        let err = stderr(&out);
        assert!(!out.status.success() && err.contains(&format!("{flag} {value}: expected")), "{err}");
        assert!(!tmp.path().join("new").exists());
    }
}

// Tests that start processes live in binaries without in-process trainers: a child started while a
// trainer drops its NVMe directory holds the directory's lock (a copy of the descriptor) until it
// execs, and the next trainer in that directory found it in use.

/// Stage 3 with a cpu rank beside a GPU rank under one budget: the cpu device charges less, so it
/// held more block slots, and its uploads' gathers met the GPU rank's other ones (a panic). The ranks
/// keep the fewer slots, and the run follows the cpu-only one.
#[test]
fn ranks_on_devices_of_other_sizes_keep_one_upload_schedule() {
    let Some(gpu) = common::gpu_or_skip("ranks_on_devices_of_other_sizes_keep_one_upload_schedule") else { return };
    drop(gpu);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("six.json");
    std::fs::write(&config, r#"{"model_type": "gpt2", "n_layer": 6, "n_embd": 32, "n_head": 2, "vocab_size": 256, "n_positions": 64}"#)
        .unwrap();
    let model = zerostream::train::run::model_config(&zerostream::train::run::ModelChoice::Config(config.display().to_string())).unwrap();
    let base = zerostream::train::TrainConfig {
        zero_stage: zerostream::train::ZeroStage::Three,
        batch: 2,
        seq_len: 16,
        ..zerostream::train::TrainConfig::default()
    };
    // A budget where the GPU holds fewer block slots than the cpu device.
    let slots = |budget, costs| {
        let tc = zerostream::train::TrainConfig { gpu_mem_budget: Some(budget), ..base.clone() };
        zerostream::train::plan_on(&model, &tc, 2, costs).map_or(0, |p| p.block_slots)
    };
    let (cpu, gpu) = (zerostream::device::AllocCosts::CPU, zerostream::device::AllocCosts::GPU);
    let minimum = zerostream::train::minimum_device_bytes_on(&model, &base, gpu);
    let budget = (0..256u64)
        .map(|i| minimum + i * 4096)
        .find(|&b| slots(b, cpu) > slots(b, gpu))
        .expect("a budget where the cpu device holds more block slots than the GPU");
    let data = common::trajectory::golden_dir("gpt2-tiny-accum").join("tokens.bin");
    let losses = |devices: &str| {
        let metrics = dir.path().join(format!("{devices}.jsonl"));
        let out = zerostream(&[
            "train",
            "--config",
            config.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            "--sample-tokens",
            "0",
            "--world-size",
            "2",
            "--devices",
            devices,
            "--zero-stage",
            "3",
            "--gpu-mem-budget",
            &budget.to_string(),
            "--metrics",
            metrics.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "--devices {devices}: {}", stderr(&out));
        common::cli::trajectory(&metrics).into_iter().map(|(_, loss, _)| f64::from_bits(loss)).collect::<Vec<f64>>()
    };
    let (mixed, cpu_only) = (losses("cpu,0"), losses("cpu,cpu"));
    assert_eq!(mixed.len(), 3);
    for (s, (a, b)) in mixed.iter().zip(&cpu_only).enumerate() {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "step {s}: loss {a} on cpu + GPU ranks against {b} on two cpu ranks");
    }
}

/// A run in an `--nvme-dir` another model's run used keeps only its own shard files there: the other
/// model's (groups this one has not) are removed, and said, as the start-up room check counted them.
#[test]
fn a_run_removes_the_shards_of_another_model_from_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let golden = common::trajectory::golden_dir("gpt2-tiny");
    let config = dir.path().join("one-layer.json");
    std::fs::write(&config, r#"{"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 256, "n_positions": 64}"#)
        .unwrap();
    let (data, model, one) = (golden.join("tokens.bin"), golden.join("model"), config.to_str().unwrap());
    let train = |model_flag: &str, model: &str, nvme: &std::path::Path| {
        let nvme_state = ["--offload-optimizer", "nvme", "--offload-params", "nvme", "--nvme-dir", nvme.to_str().unwrap()];
        let out =
            zerostream(&common::cli::one_step_train(&[&[model_flag, model, "--data", data.to_str().unwrap()][..], &nvme_state].concat()));
        assert!(out.status.success(), "{}", stderr(&out));
        let names = |d: std::path::PathBuf| -> std::collections::BTreeSet<String> {
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
        };
        (stderr(&out), names(nvme.join("rank0")))
    };
    let (own, fresh) = (dir.path().join("own"), dir.path().join("shared"));
    let (_, alone) = train("--config", one, &own);
    let (_, two_layers) = train("--model", model.to_str().unwrap(), &fresh);
    assert!(two_layers.len() > alone.len(), "{two_layers:?} against {alone:?}");
    let (said, after) = train("--config", one, &fresh);
    assert_eq!(after, alone, "only the one-layer run's files remain");
    let removed = two_layers.iter().filter(|n| n.ends_with(".bin") && !alone.contains(*n)).count();
    assert!(said.contains(&format!("removed {removed} shard files an earlier run of another shape left")), "{said}");
}
