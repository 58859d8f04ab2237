//! `zerostream bench kernels --quick --json` on whatever adapter there is (lavapipe in CI): a row for
//! every kernel of the training step, each with a positive, finite rate, and the step's kernel time; the
//! cooperative-matrix matmul timed where the adapter has it, said to be unavailable where not.

mod common;

use std::collections::HashSet;
use std::process::Command;

/// Every op a GPT-2 training step records on the gpu device.
const STEP_KERNELS: &[&str] = &[
    "matmul",
    "bias_backward",
    "attention_forward",
    "attention_backward",
    "layernorm_forward",
    "layernorm_backward",
    "gelu_forward",
    "gelu_backward",
    "residual_forward",
    "fill",
    "encoder_forward",
    "encoder_backward",
    "crossentropy",
];

/// Ops timed beside the step's that the step does not run yet (the head's vocabulary chunks).
const OTHER_KERNELS: &[&str] = &["crossentropy_chunk_stats", "crossentropy_chunk_grad"];

#[test]
fn bench_kernels_quick_gives_every_kernel_a_positive_rate() {
    let test = "bench_kernels_quick_gives_every_kernel_a_positive_rate";
    let Some(dev) = common::gpu_or_skip(test) else { return };
    drop(dev); // the binary opens its own
    let out = Command::new(env!("CARGO_BIN_EXE_zerostream"))
        .args(["bench", "kernels", "--quick", "--json"])
        .output()
        .expect("running zerostream");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench kernels failed: {stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let rows: Vec<&serde_json::Value> = lines.iter().filter(|v| v.get("kernel").is_some()).collect();
    let kernels: HashSet<&str> = rows.iter().map(|r| r["kernel"].as_str().expect("kernel is a string")).collect();
    for k in STEP_KERNELS.iter().chain(OTHER_KERNELS) {
        assert!(kernels.contains(k), "no row for {k}; rows: {kernels:?}");
    }
    // Every row's name is one --only takes (the device's copy is the ceiling, not a kernel).
    for k in kernels.iter().filter(|k| **k != "copy_buffer_to_buffer") {
        assert!(zerostream::bench::kernels::ROWS.contains(k), "{k} is missing from bench::kernels::ROWS");
    }
    assert!(rows.iter().any(|r| r["precision"] == "bf16-B"), "no row for the matmul with a 16-bit B operand");
    // The cooperative-matrix matmul: timed beside the fp32 one where the adapter has it, else every row
    // says it is unavailable (and why) and none claims it.
    let coop_rows = rows.iter().filter(|r| r["kernel"] == "matmul" && r["precision"].as_str().is_some_and(|p| p.starts_with("f16-coop")));
    let coop_rows = coop_rows.count();
    // The multiply-add's own rate (coop_probe.wgsl), once, as the products' ceiling.
    let probe_rows = rows.iter().filter(|r| r["kernel"] == "matmul_coop_mma").count();
    let available = rows.iter().all(|r| r["matmul_coop"] == "available");
    if available {
        let fp32_products = rows.iter().filter(|r| r["kernel"] == "matmul" && r["precision"] == "fp32").count();
        assert_eq!(coop_rows, fp32_products, "one f16-coop row per product");
        assert_eq!(probe_rows, 1, "one cooperative multiply-add probe");
    } else {
        assert_eq!(coop_rows + probe_rows, 0);
        assert!(rows.iter().all(|r| r["matmul_coop"].as_str().is_some_and(|m| m.starts_with("unavailable on this adapter: "))));
    }
    for r in &rows {
        let rate = if r["bound"] == "compute" { r["gflops"].as_f64() } else { r["gbps"].as_f64() };
        let rate = rate.unwrap_or_else(|| panic!("no rate in {r}"));
        assert!(rate.is_finite() && rate > 0.0, "rate {rate} in {r}");
        assert!(r["seconds"].as_f64().is_some_and(|s| s > 0.0), "seconds in {r}");
    }
    // The attention rows name the variant that ran (the tuning table's, else the untuned one).
    for r in rows.iter().filter(|r| r["kernel"].as_str().is_some_and(|k| k.starts_with("attention_"))) {
        let variant = r["variant"].as_str().unwrap_or_else(|| panic!("no variant in {r}"));
        assert!(zerostream_shaders::AttentionTile::parse(variant).is_ok(), "{r}");
    }
    let step = lines.iter().find(|v| v.get("step_kernel_seconds").is_some()).expect("a step estimate line");
    assert!(step["step_kernel_seconds"].as_f64().is_some_and(|s| s.is_finite() && s > 0.0), "{step}");
}

/// A Llama preset times its step's matrix products (issue #22's fp32 goal is set at Llama-3.2-1B's
/// shapes too): seven linears' forward, dinp and dW and the head's three, each weight's products also
/// with a bf16 B, at the model's own shapes (GQA's narrower k and v projections), each linear once per
/// layer and the head once per vocabulary chunk; no step estimate, since the other kernels are not timed.
#[test]
fn bench_kernels_times_a_llama_steps_products() {
    let test = "bench_kernels_times_a_llama_steps_products";
    let Some(dev) = common::gpu_or_skip(test) else { return };
    drop(dev);
    let out = Command::new(env!("CARGO_BIN_EXE_zerostream"))
        .args(["bench", "kernels", "--models", "llama-3.2-1b", "--batch-size", "1", "--seq-len", "8", "--reps", "1"])
        .args(["--only", "matmul", "--copy-size", "16MiB", "--json"])
        .output()
        .expect("running zerostream");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench kernels failed: {stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let fp32: Vec<&serde_json::Value> =
        lines.iter().filter(|r| r["model"] == "llama-3.2-1b" && r["kernel"] == "matmul" && r["precision"] == "fp32").collect();
    assert_eq!(fp32.len(), 7 * 3 + 3, "{fp32:?}");
    let row = |case: &str| *fp32.iter().find(|r| r["case"] == case).unwrap_or_else(|| panic!("no {case} row"));
    // hidden 2048, 8 key-value heads of 64, MLP 8192; the head's chunk of 8192 rows.
    assert_eq!(row("k_proj forward")["shape"], "M=8 N=512 K=2048");
    assert_eq!(row("down_proj dinp")["shape"], "M=8 N=8192 K=2048");
    assert_eq!(row("gate_proj dW")["shape"], "M=8192 N=2048 K=8");
    assert_eq!(row("lm_head forward")["shape"], "M=8 N=8192 K=2048");
    assert_eq!(row("q_proj dW")["per_step"], 16, "once per layer");
    assert_eq!(row("lm_head dW")["per_step"], 16, "128256 ids in chunks of 8192");
    let bf16_b = lines.iter().filter(|r| r["model"] == "llama-3.2-1b" && r["precision"] == "bf16-B").count();
    assert_eq!(bf16_b, 7 * 2 + 2, "each weight's forward and dinp again with a bf16 B");
    for r in &fp32 {
        assert!(r["gflops"].as_f64().is_some_and(|g| g.is_finite() && g > 0.0), "{r}");
    }
    assert!(lines.iter().all(|v| v.get("step_kernel_seconds").is_none()), "no step estimate from the products alone");
    // A name that matches no kernel is refused with the list, not answered with an empty table.
    let out = Command::new(env!("CARGO_BIN_EXE_zerostream")).args(["bench", "kernels", "--quick", "--only", "matmull"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--only \"matmull\" matches no kernel (the kernels: matmul,"), "{stderr}");
    // A row's name, as the table prints it, times that row alone.
    let out = Command::new(env!("CARGO_BIN_EXE_zerostream"))
        .args(["bench", "kernels", "--models", "gpt2", "--batch-size", "1", "--seq-len", "8", "--reps", "1"])
        .args(["--only", "gelu_backward", "--copy-size", "16MiB", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let kernels: Vec<&str> = rows.iter().filter(|r| r["model"] == "gpt2").filter_map(|r| r["kernel"].as_str()).collect();
    assert_eq!(kernels, ["gelu_backward"], "{rows:?}");
}
