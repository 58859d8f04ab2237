//! The `zerostream` binary's refusals of bad input, naming the flag and the numbers, before any work
//! where it can: impossible budgets and missing directories, hyperparameters out of range, a metrics
//! file over an input, `--data` that is not a regular file, a run too big for the RAM or the NVMe disk,
//! `tune`'s shapes and clock, and a diverged run.

mod common;

use std::process::Command;

use common::cli::{stderr, zerostream};

#[test]
fn bad_input_is_refused_with_the_flag_and_the_numbers() {
    let out = zerostream(&["train", "--device", "cpu", "--gpu-mem-budget", "1MiB"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--gpu-mem-budget") && err.contains("cannot hold the minimum"), "{err}");
    for tier in ["--offload-optimizer", "--offload-gradients", "--offload-params"] {
        let out = zerostream(&["train", "--device", "cpu", tier, "nvme"]);
        assert!(!out.status.success() && stderr(&out).contains("--nvme-dir") && stderr(&out).contains(tier), "{}", stderr(&out));
    }
    // The gradients' own tier (`ram` is cpu's other name), as the placement reports it.
    let out =
        zerostream(&["plan", "--config", "gpt2", "--offload-optimizer", "nvme", "--offload-gradients", "ram", "--nvme-dir", "/tmp/zs"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &stderr(&out);
    assert!(out.status.success() && text.contains("AdamW moments 1.4 GiB on nvme; gradients 474.7 MiB on cpu"), "{text}");
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/tokens.bin");
    let out = zerostream(&["train", "--device", "cpu", "--config", "gpt3", "--data", data]);
    assert!(!out.status.success() && stderr(&out).contains("gpt3"), "{}", stderr(&out));
    let out = zerostream(&["train", "--device", "cpu", "--offload-params", "nvme", "--nvme-dir", "/proc/nonexistent/dir"]);
    assert!(!out.status.success() && stderr(&out).contains("/proc/nonexistent/dir"), "{}", stderr(&out));
    // Striped: every directory is checked, and one given twice is named.
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let twice = format!("{},{}", a.display(), a.display());
    let out = zerostream(&["train", "--device", "cpu", "--offload-params", "nvme", "--nvme-dir", &twice, "--steps", "1"]);
    assert!(!out.status.success() && stderr(&out).contains("given twice"), "{}", stderr(&out));
    let bad = format!("{},/proc/nonexistent/dir", a.display());
    let out = zerostream(&["train", "--device", "cpu", "--offload-params", "nvme", "--nvme-dir", &bad, "--steps", "1"]);
    assert!(!out.status.success() && stderr(&out).contains("/proc/nonexistent/dir"), "{}", stderr(&out));
    let stray = format!("{},", a.display());
    let out = zerostream(&["plan", "--device", "cpu", "--offload-params", "nvme", "--nvme-dir", &stray]);
    assert!(!out.status.success() && stderr(&out).contains("a stray comma"), "{}", stderr(&out));
}

/// `tune`'s shapes and clock are refused by flag before an adapter is opened (a zero batch once tuned
/// empty products into the table, `--quick` silently dropped the flags it overrides), and so is a world
/// of no ranks.
#[test]
fn counts_and_clocks_out_of_range_are_refused() {
    for (args, named) in [
        (&["--batch-size", "0"][..], "--batch-size"),
        (&["--seq-len", "0"], "--seq-len"),
        (&["--vocab-chunk-rows", "0"], "--vocab-chunk-rows"),
        (&["--max-seconds=-1"], "--max-seconds"),
        (&["--max-seconds", "nan"], "--max-seconds"),
        (&["--quick", "--models", "gpt2"], "--models"),
    ] {
        let out = zerostream(&[&["tune", "--no-save"][..], args].concat());
        let err = stderr(&out);
        assert!(out.status.code() == Some(2) && err.contains(named), "tune {args:?}: {err}");
    }
    // Zero counts are refused as the command line is read, by flag, in every command that takes them.
    for args in [
        &["train", "--grad-accum", "0"][..],
        &["plan", "--seq-len", "0"],
        &["eval", "--model", "m", "--data", "d", "--batch-size", "0"],
        &["bench", "kernels", "--seq-len", "0"],
        // Each bench's timed repetitions (h2d, d2h, overlap and collectives ran one for 0).
        &["bench", "h2d", "--reps", "0"],
        &["bench", "d2h", "--reps", "0"],
        &["bench", "overlap", "--reps", "0"],
        &["bench", "collectives", "--reps", "0"],
        &["bench", "adam", "--reps", "0"],
    ] {
        let out = zerostream(args);
        let (err, flag) = (stderr(&out), args[args.len() - 2]);
        assert!(
            out.status.code() == Some(2) && err.contains(&format!("for '{flag} <")) && err.contains("must be at least 1"),
            "{args:?}: {err}"
        );
    }
    // bench overlap's copy and matmul are checked before the adapter is opened or a line printed.
    for (flag, value) in [("--bytes", "3"), ("--m", "0")] {
        let out = zerostream(&["bench", "overlap", flag, value]);
        let (err, said) = (stderr(&out), String::from_utf8_lossy(&out.stdout).into_owned());
        assert!(!out.status.success() && err.contains(flag) && err.contains("must be") && said.is_empty(), "{said}{err}");
    }
    // plan took --world-size 0 for one rank.
    let out = zerostream(&["plan", "--config", "gpt2", "--world-size", "0"]);
    assert!(out.status.code() == Some(2) && stderr(&out).contains("--world-size"), "{}", stderr(&out));
    // No validation batches was refused only when the first validation came, after training with --eval-every 0.
    let out = zerostream(&["train", "--device", "cpu", "--eval-batches", "0", "--eval-every", "0"]);
    assert!(out.status.code() == Some(2) && stderr(&out).contains("--eval-batches"), "{}", stderr(&out));
    // An adapter --devices names that is not there is reported as --devices' (it said --adapter).
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/tokens.bin");
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/model");
    let out = zerostream(&["train", "--model", model, "--data", data, "--steps", "1", "--world-size", "2", "--devices", "99,cpu"]);
    assert!(!out.status.success() && stderr(&out).contains("rank 0 of 2: opening its device: --devices 99"), "{}", stderr(&out));
    // A list of another length than the ranks is refused before any output is made.
    let tensorboard = std::env::temp_dir().join(format!("zs-devices-refused-{}", std::process::id()));
    let tb = tensorboard.to_str().unwrap();
    let out =
        zerostream(&["train", "--model", model, "--data", data, "--world-size", "2", "--devices", "cpu,cpu,cpu", "--tensorboard", tb]);
    assert!(!out.status.success() && stderr(&out).contains("--devices lists 3 devices for --world-size 2"), "{}", stderr(&out));
    assert!(!tensorboard.exists(), "a refused run makes no --tensorboard directory");
    // A billion micro-batches a step took 16 GB of RAM to plan before anything was said.
    let out = zerostream(&["plan", "--config", "gpt2", "--grad-accum", "1000000000"]);
    assert!(!out.status.success() && stderr(&out).contains("--grad-accum 1000000000: at most 65536"), "{}", stderr(&out));
}

#[test]
fn hyperparameters_out_of_range_are_refused_before_any_work() {
    for (flag, value) in [
        ("--lr", "nan"),
        ("--lr", "-1"),
        ("--beta1", "1"),
        ("--beta2", "2"),
        ("--eps", "0"),
        ("--weight-decay", "-100"),
        ("--grad-clip", "inf"),
        ("--momentum", "1"),
        ("--trust-coefficient", "0"),
    ] {
        let out = zerostream(&["train", "--device", "cpu", "--steps", "1", &format!("{flag}={value}")]);
        let err = stderr(&out);
        // Read, then refused: an error (1), as `train --help` says; 2 is for a line that cannot be read.
        assert!(out.status.code() == Some(1) && err.contains(flag) && err.contains("must be"), "{flag} {value}: {err}");
        // The same as two words: a negative number is the flag's value, not an unknown argument.
        let out = zerostream(&["train", "--device", "cpu", "--steps", "1", flag, value]);
        let err = stderr(&out);
        assert!(!out.status.success() && err.contains(flag) && err.contains("must be"), "{flag} {value}: {err}");
    }
    // The NVMe tier's I/O settings, refused at once with or without that tier (not after the first write).
    for (flag, value) in [("--block-size", "1000"), ("--block-size", "0"), ("--queue-depth", "0")] {
        let out = zerostream(&["train", "--device", "cpu", "--steps", "1", flag, value]);
        let err = stderr(&out);
        assert!(!out.status.success() && err.contains(&format!("{flag} {value}: expected")) && !err.contains("placement:"), "{err}");
    }
    // A cosine "down" to a floor above its peak would raise the rate.
    let out = zerostream(&["train", "--device", "cpu", "--steps", "1", "--min-lr", "1"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--min-lr 1 is above --lr 0.002"), "{err}");
    // An unknown optimizer names the ones there are; the layer-wise ones refuse bf16 moments.
    let out = zerostream(&["train", "--device", "cpu", "--steps", "1", "--optimizer", "sgd"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--optimizer") && err.contains("lamb") && err.contains("lars"), "{err}");
    let out = zerostream(&["train", "--device", "cpu", "--steps", "1", "--optimizer", "lars", "--adam-state", "bf16"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--optimizer lars") && err.contains("--adam-state bf16"), "{err}");
    // The cpu device has no copy queue to move copies to.
    let out = zerostream(&["train", "--device", "cpu", "--steps", "1", "--copy-queue"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--copy-queue") && err.contains("cpu device"), "{err}");
    // A frozen variance needs a warm-up to learn it in, and an optimizer that keeps one.
    for (extra, says) in [
        (&["--freeze-variance"][..], "--grad-compression-warmup"),
        (&["--freeze-variance", "--grad-compression-warmup", "2", "--optimizer", "lars"][..], "--optimizer lars"),
    ] {
        let out = zerostream(&[&["train", "--device", "cpu", "--steps", "1"][..], extra].concat());
        let err = stderr(&out);
        assert!(!out.status.success() && err.contains("--freeze-variance") && err.contains(says), "{extra:?}: {err}");
    }
    // bf16 words for an fp16 working copy would cost as many bytes and lose bits.
    let out = zerostream(&["train", "--device", "cpu", "--steps", "1", "--precision", "fp16", "--param-compression", "bf16"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--param-compression bf16") && err.contains("--precision fp16"), "{err}");
}

#[test]
fn outputs_over_inputs_and_unreadable_data_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("tokens.bin");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/tokens.bin"), &data).unwrap();
    let before = std::fs::read(&data).unwrap();
    let d = data.to_str().unwrap();
    let out = zerostream(&["train", "--device", "cpu", "--config", "gpt2", "--data", d, "--metrics", d]);
    assert!(!out.status.success() && stderr(&out).contains("is the input"), "{}", stderr(&out));
    // Every output against every input and every other output: --trace onto the data, the --config
    // file or the --config-file under --metrics or --trace, two outputs on one path.
    let config = dir.path().join("tiny.json");
    std::fs::write(&config, r#"{"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "n_positions": 64}"#).unwrap();
    let config_file = dir.path().join("run.toml");
    std::fs::write(&config_file, "steps = 1\n").unwrap();
    let (c, cf) = (config.to_str().unwrap(), config_file.to_str().unwrap());
    let other = dir.path().join("out.json");
    let o = other.to_str().unwrap();
    let m = dir.path().join("m.jsonl");
    let (m, resolved) = (m.to_str().unwrap(), dir.path().join("m.config.toml").to_str().unwrap().to_string());
    for (extra, says) in [
        (&["--config", "gpt2", "--trace", d][..], "--trace"),
        (&["--config", c, "--metrics", c][..], "(--config)"),
        (&["--config", c, "--trace", c][..], "(--config)"),
        (&["--config", "gpt2", "--config-file", cf, "--metrics", cf][..], "(--config-file)"),
        (&["--config", "gpt2", "--trace", o, "--metrics", o][..], "is also the --metrics"),
        (&["--config", "gpt2", "--metrics", m, "--trace", &resolved][..], "is also the --metrics' resolved configuration"),
    ] {
        let out = zerostream(&[&["train", "--device", "cpu", "--steps", "1", "--data", d][..], extra].concat());
        let err = stderr(&out);
        assert!(!out.status.success() && err.contains(says) && !err.contains("placement:"), "{extra:?}: {err}");
    }
    assert!(std::fs::read_to_string(&config).unwrap().contains("n_embd") && !other.exists());
    assert_eq!(std::fs::read_to_string(&config_file).unwrap(), "steps = 1\n");
    // A directory as --metrics is refused before the state is built, not after.
    let out = zerostream(&["train", "--device", "cpu", "--config", "gpt2", "--data", d, "--metrics", dir.path().to_str().unwrap()]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("is a directory") && !err.contains("placement:"), "{err}");
    assert_eq!(std::fs::read(&data).unwrap(), before, "the data file is untouched");
    // A pipe or a directory as --data is refused at once (a pipe would block the open).
    let refused = |path: &std::path::Path| {
        let path = path.to_str().unwrap();
        let out = zerostream(&["train", "--device", "cpu", "--config", "gpt2", "--data", path, "--steps", "1"]);
        assert!(!out.status.success() && stderr(&out).contains("not a regular file"), "{path}: {}", stderr(&out));
    };
    refused(dir.path());
    #[cfg(unix)]
    {
        let fifo = dir.path().join("fifo");
        assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        refused(&fifo);
    }
}

/// A cpu run of `--steps 40` at lr 1e30, which sends the weights to infinity in one update, so every
/// later step's gradients are non-finite; `extra` flags added.
fn diverging_run(extra: &[&str]) -> String {
    let mut args = vec!["train", "--device", "cpu", "--steps", "40", "--batch-size", "1", "--seq-len", "16", "--lr", "1e30"];
    args.extend(["--warmup-steps", "0", "--lr-schedule", "constant", "--grad-clip", "0", "--sample-tokens", "0"]);
    args.extend(extra);
    let out = zerostream(&args);
    assert!(!out.status.success(), "the diverged run succeeded");
    stderr(&out)
}

#[test]
fn a_diverged_run_stops_with_an_error_after_a_few_skipped_steps() {
    let err = diverging_run(&[]);
    assert!(err.contains("were all skipped") && err.contains("diverged"), "{err}");
    assert!(!err.contains("--matmul-inputs"), "{err}");
}

/// With f16 matmul inputs the loss is scaled, so the run allows more skipped steps (the scale halves
/// each time), and a non-finite loss also names f16's range as a possible cause.
#[test]
fn a_diverged_f16_inputs_run_names_f16s_range() {
    let err = diverging_run(&["--matmul-inputs", "f16"]);
    assert!(err.contains("were all skipped") && err.contains("f16's range (65504)"), "{err}");
    // 24 skipped steps, not 3: "steps 1..=24" (step 0's update is the one that diverged).
    assert!(err.contains("steps 1 to 24 were all skipped"), "{err}");
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
fn an_unknown_zero_stage_is_refused_naming_the_stages() {
    let out = zerostream(&["train", "--device", "cpu", "--config", "gpt2", "--zero-stage", "4", "--steps", "1"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--zero-stage") && err.contains("expected 0, 1, 2 or 3"), "{err}");
}

#[test]
fn a_run_too_big_for_its_nvme_disk_is_refused_before_any_work() {
    // A GPT-2 of 15000 blocks of width 2048 (755B parameters): ~12.7 TiB of state on NVMe, more than any
    // disk a test runs on; its RAM need (the groups paged in, and the cpu device's 1.5 GiB with one
    // token's block inputs kept) is under 6 GiB.
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
        "--gpu-mem-budget",
        "1600MiB",
        "--recompute",
        "--batch-size",
        "1",
        "--seq-len",
        "1",
        "--steps",
        "1",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--nvme-dir") && err.contains("GiB free"), "{err}");
    assert!(!nvme.exists(), "nothing was written before the refusal");
}

/// Runs and benchmarks asked for more memory or threads than the machine or the adapter has refuse by
/// flag with the numbers, before allocating (an allocation that fails aborts the process; a buffer past the
/// adapter's limit fails wgpu's validation).
#[test]
fn benches_too_big_for_the_machine_are_refused_before_allocating() {
    // The cpu device's memory is RAM: activations of 100000 sequences of 1024 tokens are refused with it.
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/tokens.bin");
    let out = zerostream(&["train", "--device", "cpu", "--config", "gpt2", "--data", data, "--batch-size", "100000", "--seq-len", "1024"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("host RAM") && err.contains("the device's") && err.contains("--gpu-mem-budget"), "{err}");
    // eval refuses a micro-batch larger than its data before allocating for it (it aborted allocating
    // 190 GiB; the cpu device's own refusal of such a tensor is tested in device/cpu.rs).
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/model");
    let out = zerostream(&["eval", "--device", "cpu", "--model", model, "--data", data, "--batch-size", "100000000", "--seq-len", "16"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "an error, not an abort: {err}");
    assert!(err.contains("fewer than one micro-batch of --batch-size 100000000 x --seq-len 16"), "{err}");
    // train refuses it by flag at start-up too, before any step reads it.
    let out = zerostream(&["train", "--device", "cpu", "--model", model, "--data", data, "--batch-size", "1000", "--seq-len", "16"]);
    let err = stderr(&out);
    assert!(err.contains(&format!("--data {data}: ")) && err.contains("fewer than one micro-batch of --batch-size 1000"), "{err}");
    assert!(!err.contains("step "), "refused before training: {err}");
    // Thread counts past any machine's are refused, not attempted.
    for (args, flag) in [
        (&["bench", "adam", "--params", "1000", "--threads", "100000"][..], "--threads 100000"),
        (&["train", "--device", "cpu", "--adam-threads", "100000"][..], "--adam-threads 100000"),
        (&["bench", "collectives", "--world-size", "100000"][..], "--world-size 100000"),
    ] {
        let err = stderr(&zerostream(args));
        assert!(err.contains(flag) && (err.contains("at most") || err.contains("2 to 1024")), "{err}");
    }
    let err = stderr(&zerostream(&["bench", "collectives", "--world-size", "1"]));
    assert!(err.contains("--world-size 1: 2 to 1024") && err.contains("exchanges nothing"), "{err}");
    let err = stderr(&zerostream(&["bench", "collectives", "--world-size", "1000", "--sizes", "1GiB"]));
    assert!(err.contains("--world-size 1000") && err.contains("GiB of RAM"), "{err}");
    let err = stderr(&zerostream(&["bench", "collectives", "--sizes", "6"]));
    assert!(err.contains("--sizes 6") && err.contains("multiple of 4"), "{err}");
    let out = zerostream(&["bench", "adam", "--params", "1000000000000000", "--reps", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "an error, not an abort: {err}");
    assert!(err.contains("--params") && err.contains("GiB of RAM"), "{err}");
    let Some(gpu) = common::gpu_or_skip("benches_too_big_for_the_machine_are_refused_before_allocating") else { return };
    let max = gpu.summary().max_buffer_bytes;
    for link in [zerostream::bench::transfer::Link::HostToDevice, zerostream::bench::transfer::Link::DeviceToHost] {
        let err = zerostream::bench::transfer::bench_transfer(&gpu, link, &[4, max.saturating_add(4) & !3], 1, |_| panic!("no size ran"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--sizes") && err.contains("largest buffer"), "{err}");
    }
}

/// Standard output that cannot be written (a full disk: /dev/full) is an error in words with exit
/// code 1, not a panic and its backtrace.
#[test]
fn a_full_standard_output_is_an_error_not_a_panic() {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let out = Command::new(env!("CARGO_BIN_EXE_zerostream"))
        .args(["plan", "--config", "gpt2", "--device", "cpu"])
        .stdout(full)
        .output()
        .expect("running zerostream");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("writing to standard output failed") && !err.contains("panicked"), "{err}");
}

/// `plan --model` reads no weights but checks their headers: weights config.json does not describe
/// are refused by tensor, as a run would refuse them, rather than planned.
#[test]
fn plan_checks_a_model_directorys_weights_against_its_config() {
    let dir = tempfile::tempdir().unwrap();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/model");
    let plan = |model: &str| zerostream(&["plan", "--device", "cpu", "--model", model, "--batch-size", "1", "--seq-len", "8"]);
    let out = plan(golden);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::copy(format!("{golden}/model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(format!("{golden}/config.json")).unwrap()).unwrap();
    config["n_embd"] = 64.into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let out = plan(dir.path().to_str().unwrap());
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("is stored with shape [128, 32], but config.json makes it [128, 64]"), "{err}");
}
