//! What the bad-input tests share: seeded randomness with a bounded case count, a small valid model
//! directory, and the checks every error must pass.

use std::path::Path;

use rand::SeedableRng;
use rand::rngs::StdRng;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

/// Cases per property test: a few thousand keeps each well under a few seconds in a debug build.
/// `ZEROSTREAM_FUZZ_CASES` runs more (or fewer) by hand.
pub fn cases() -> usize {
    std::env::var("ZEROSTREAM_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(2000)
}

/// A fixed seed per test so that a failure reproduces; `ZEROSTREAM_FUZZ_SEED` explores others.
pub fn rng(test: u64) -> StdRng {
    let base = std::env::var("ZEROSTREAM_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    StdRng::seed_from_u64(base ^ test)
}

/// Runs one case; a panic is reported with the case's input before it fails the test.
pub fn case(name: &str, i: usize, input: impl std::fmt::Debug, f: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        eprintln!("{name}: case {i} panicked; input: {input:?}");
        std::panic::resume_unwind(panic);
    }
}

/// Fails unless `err` (with its causes) names `path`.
#[track_caller]
pub fn names(err: &anyhow::Error, path: &Path) -> String {
    let text = format!("{err:#}");
    assert!(text.contains(&path.display().to_string()), "error does not name {}: {text}", path.display());
    text
}

/// config.json of a tiny GPT-2, as Hugging Face writes one (its dropout as the published `gpt2`'s).
pub fn tiny_config() -> Value {
    json!({
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1,
        "bos_token_id": 50256,
        "embd_pdrop": 0.1,
        "eos_token_id": 50256,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2",
        "n_ctx": 8,
        "n_embd": 4,
        "n_head": 2,
        "n_inner": null,
        "n_layer": 1,
        "n_positions": 8,
        "reorder_and_upcast_attn": false,
        "resid_pdrop": 0.1,
        "scale_attn_by_inverse_layer_idx": false,
        "scale_attn_weights": true,
        "summary_activation": null,
        "summary_first_dropout": 0.1,
        "summary_proj_to_labels": true,
        "summary_type": "cls_index",
        "summary_use_proj": true,
        "tie_word_embeddings": true,
        "use_cache": true,
        "vocab_size": 16
    })
}

/// A tensor to store: name, dtype, shape, little-endian bytes.
pub type Stored = (&'static str, Dtype, Vec<usize>, Vec<u8>);

/// Tensors in each floating-point dtype the reader converts; values 0.5, 1.5, ...
pub fn tiny_tensors() -> Vec<Stored> {
    let values = |n: usize| (0..n).map(|i| i as f64 + 0.5);
    vec![
        ("wte.weight", Dtype::F32, vec![4, 3], values(12).flat_map(|v| (v as f32).to_le_bytes()).collect()),
        ("h.0.ln_1.weight", Dtype::F16, vec![3], values(3).flat_map(|v| half::f16::from_f64(v).to_le_bytes()).collect()),
        ("wpe.weight", Dtype::BF16, vec![2, 3], values(6).flat_map(|v| half::bf16::from_f64(v).to_le_bytes()).collect()),
        ("h.0.ln_1.bias", Dtype::F64, vec![3], values(3).flat_map(|v| v.to_le_bytes()).collect()),
    ]
}

/// The bytes of a safetensors file holding `tensors`.
pub fn safetensors_bytes(tensors: &[Stored]) -> Vec<u8> {
    let views: Vec<(&str, TensorView)> =
        tensors.iter().map(|(name, dtype, shape, bytes)| (*name, TensorView::new(*dtype, shape.clone(), bytes).unwrap())).collect();
    safetensors::serialize(views, None).unwrap()
}

/// Writes a model directory: `config` as config.json and `weights` as model.safetensors.
pub fn write_model(dir: &Path, config: &Value, weights: &[u8]) {
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(config).unwrap()).unwrap();
    std::fs::write(dir.join("model.safetensors"), weights).unwrap();
}

/// Makes a FIFO at `path`.
#[cfg(unix)]
pub fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// Runs `f` on another thread and fails if it takes more than 10 s: a FIFO opened for reading
/// blocks until a writer comes, and a test that hangs says less than one that fails.
#[cfg(unix)]
pub fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("blocked (opened a FIFO for reading?)")
}
