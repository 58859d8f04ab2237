//! The whole GPT-2 against PyTorch: forward (loss, every hidden state, logits) and backward (every
//! parameter gradient) on the first micro-batch of `golden/gpt2-tiny`, on the cpu and gpu devices.
//!
//! The data in `tests/golden/` is a copy of the project's shared reference (`shared/golden/`), made by
//! `gen_golden.py` beside it with PyTorch 2.15 and transformers 5.23 in float64 from the float32 weights.
//! To regenerate: run that script where PyTorch is installed and copy its output folders here.

mod common;

use common::gpu_or_skip;
use common::trajectory::golden_dir;
use safetensors::SafeTensors;
use zerostream::device::{Backend, CpuDevice};
use zerostream::model::gpt2::{Gpt2, Gpt2Config, parameter_specs};
use zerostream_checkpoints::HfModel;

struct Golden {
    bytes: Vec<u8>,
}

impl Golden {
    fn load(name: &str) -> Self {
        let path = golden_dir(name).join("golden.safetensors");
        Golden { bytes: std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (copy it from shared/golden)", path.display())) }
    }
    fn f64(&self, name: &str) -> Vec<f64> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let view = st.tensor(name).unwrap_or_else(|_| panic!("golden tensor {name} missing"));
        view.data().chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect()
    }
    fn ints(&self, name: &str) -> Vec<u32> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        st.tensor(name).unwrap().data().chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32).collect()
    }
}

fn max_abs_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max)
}

fn rel_l2_err(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (*g as f64 - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(1e-300)).sqrt()
}

fn check_forward_backward<D: Backend>(dev: &D, label: &str) {
    let golden = Golden::load("gpt2-tiny");
    let hf = HfModel::open(&golden_dir("gpt2-tiny").join("model")).unwrap();
    let zerostream_checkpoints::ArchConfig::Gpt2(cfg) = hf.config.clone() else { panic!("gpt2-tiny is a GPT-2") };
    let mut model = Gpt2::from_hf(dev, &hf).unwrap();
    let (x, y) = (golden.ints("x"), golden.ints("y"));
    let (batch, seq_len) = (4, 16);
    assert_eq!(x.len(), batch * seq_len);
    let (xt, yt) = (dev.tokens(&x).unwrap(), dev.tokens(&y).unwrap());

    let loss = model.forward(dev, &xt, &yt, batch, seq_len, None).unwrap() as f64;
    let want_loss = golden.f64("loss")[0];
    let loss_rel = (loss - want_loss).abs() / want_loss.abs();
    println!("[{label}] loss {loss:.9} vs {want_loss:.9}: relative error {loss_rel:.2e}");
    assert!(loss_rel < 1e-5, "[{label}] loss relative error {loss_rel:.2e}");

    for (i, state) in model.hidden_states().iter().enumerate() {
        let err = max_abs_err(&dev.read(state), &golden.f64(&format!("hidden_states.{i}")));
        println!("[{label}] hidden_states.{i}: max abs error {err:.2e}");
        assert!(err < 1e-4, "[{label}] hidden_states.{i}: max abs error {err:.2e}");
    }
    let err = max_abs_err(&dev.read(model.logits().unwrap()), &golden.f64("logits"));
    println!("[{label}] logits: max abs error {err:.2e}");
    assert!(err < 1e-4, "[{label}] logits: max abs error {err:.2e}");

    model.zero_grads(dev);
    model.forward(dev, &xt, &yt, batch, seq_len, Some(1.0)).unwrap();
    model.backward(dev, &xt).unwrap();
    let mut worst = (String::new(), 0.0f64);
    for (spec, grad) in parameter_specs(&cfg).iter().zip(model.grads.tensors()) {
        let name = &spec.name;
        let err = rel_l2_err(&dev.read(grad), &golden.f64(&format!("grad.{name}")));
        assert!(err < 1e-4, "[{label}] grad.{name}: relative L2 error {err:.2e}");
        if err > worst.1 {
            worst = (name.clone(), err);
        }
    }
    println!("[{label}] gradients: worst relative L2 error {:.2e} ({})", worst.1, worst.0);
}

#[test]
fn gpt2_matches_pytorch_on_cpu() {
    check_forward_backward(&CpuDevice::new(None), "cpu");
}

#[test]
fn gpt2_matches_pytorch_on_gpu() {
    if let Some(gpu) = gpu_or_skip("gpt2_matches_pytorch_on_gpu") {
        let label = gpu.describe();
        check_forward_backward(&gpu, &label);
    }
}

/// gpt2-tiny with `edit(config)` and its weights passed through `weights(name, values)`: logits and
/// every gradient (in checkpoint order, named) after one forward and backward of the golden batch.
fn run_variant<D: Backend>(
    dev: &D,
    edit: impl FnOnce(&mut Gpt2Config),
    mut weights: impl FnMut(&str, Vec<f32>) -> Vec<f32>,
) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let golden = Golden::load("gpt2-tiny");
    let hf = HfModel::open(&golden_dir("gpt2-tiny").join("model")).unwrap();
    let zerostream_checkpoints::ArchConfig::Gpt2(mut cfg) = hf.config.clone() else { panic!("gpt2-tiny is a GPT-2") };
    edit(&mut cfg);
    let mut model = Gpt2::from_fn(dev, &cfg, |name, shape| {
        // An untied lm_head is not in the checkpoint: it starts as a copy of wte.
        let stored = if name == "lm_head.weight" { "transformer.wte.weight" } else { name };
        Ok(weights(name, hf.tensor(stored, shape)?))
    })
    .unwrap();
    let (xt, yt) = (dev.tokens(&golden.ints("x")).unwrap(), dev.tokens(&golden.ints("y")).unwrap());
    model.zero_grads(dev);
    model.forward(dev, &xt, &yt, 4, 16, None).unwrap();
    let logits = dev.read(model.logits().unwrap());
    model.forward(dev, &xt, &yt, 4, 16, Some(1.0)).unwrap();
    model.backward(dev, &xt).unwrap();
    let grads = parameter_specs(&cfg).iter().zip(model.grads.tensors()).map(|(s, g)| (s.name.clone(), dev.read(g))).collect();
    (logits, grads)
}

fn assert_all_close(label: &str, got: &[f32], want: &[f32], tol: f64) {
    let want: Vec<f64> = want.iter().map(|&w| w as f64).collect();
    let err = rel_l2_err(got, &want);
    assert!(err < tol, "{label}: relative L2 error {err:.2e}");
}

/// Scales the q part (the first C columns of c_attn's weight, the first C of its bias) of block l by
/// `s(l)`.
fn scale_q(name: &str, mut values: Vec<f32>, s: impl Fn(usize) -> f32) -> Vec<f32> {
    let c = 32; // gpt2-tiny's n_embd
    let Some(l) = name.strip_prefix("transformer.h.").and_then(|r| r.split('.').next()).and_then(|l| l.parse::<usize>().ok()) else {
        return values;
    };
    if name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_attn.bias") {
        for row in values.chunks_mut(3 * c) {
            row[..c].iter_mut().for_each(|q| *q *= s(l));
        }
    }
    values
}

type ConfigEdit = Box<dyn Fn(&mut Gpt2Config)>;
type QScale = Box<dyn Fn(usize) -> f32>;

/// `scale_attn_weights: false` leaves q . k unscaled, so it computes what the scaled model computes with
/// q divided by sqrt(head size); `scale_attn_by_inverse_layer_idx` divides block l's scores by l + 1, so
/// it computes what the plain model computes with block l's q divided by l + 1. Logits and the
/// gradients of the weights not rescaled agree.
fn check_attention_scales<D: Backend>(dev: &D, label: &str) {
    let (logits, grads) = run_variant(dev, |_| {}, |_, v| v);
    let sqrt_d = (8f32).sqrt(); // head size 32 / 4
    let variants: [(&str, ConfigEdit, QScale); 2] = [
        ("scale_attn_weights false", Box::new(|c| c.scale_attn_weights = false), Box::new(move |_| 1.0 / sqrt_d)),
        ("scale_attn_by_inverse_layer_idx", Box::new(|c| c.scale_attn_by_inverse_layer_idx = true), Box::new(|l| (l + 1) as f32)),
    ];
    for (name, edit, s) in variants {
        let (got_logits, got_grads) = run_variant(dev, edit, |n, v| scale_q(n, v, &s));
        assert_all_close(&format!("[{label}] {name}: logits"), &got_logits, &logits, 1e-5);
        for ((n, g), (_, w)) in got_grads.iter().zip(&grads).filter(|((n, _), _)| !n.contains("c_attn")) {
            assert_all_close(&format!("[{label}] {name}: grad {n}"), g, w, 1e-4);
        }
    }
    // Both flags: block l's scores are divided by l + 1 alone, so q is scaled by (l + 1) / sqrt(D).
    let (got_logits, _) = run_variant(
        dev,
        |c| (c.scale_attn_weights, c.scale_attn_by_inverse_layer_idx) = (false, true),
        |n, v| scale_q(n, v, |l| (l + 1) as f32 / sqrt_d),
    );
    assert_all_close(&format!("[{label}] both flags: logits"), &got_logits, &logits, 1e-5);
}

#[test]
fn attention_scale_options_on_cpu() {
    check_attention_scales(&CpuDevice::new(None), "cpu");
}

#[test]
fn attention_scale_options_on_gpu() {
    if let Some(gpu) = gpu_or_skip("attention_scale_options_on_gpu") {
        check_attention_scales(&gpu, &gpu.describe());
    }
}

/// An untied lm_head that is a copy of wte computes the tied model: the same logits, and the tied wte's
/// gradient is the sum of the untied wte's and lm_head's; every other gradient is the same.
fn check_untied_head<D: Backend>(dev: &D, label: &str) {
    let (logits, grads) = run_variant(dev, |_| {}, |_, v| v);
    let (got_logits, got_grads) = run_variant(dev, |c| c.tie_word_embeddings = false, |_, v| v);
    assert_all_close(&format!("[{label}] untied: logits"), &got_logits, &logits, 1e-6);
    let find = |n: &str| &got_grads.iter().find(|(g, _)| g == n).unwrap_or_else(|| panic!("no gradient {n}")).1;
    let (wte, lm_head) = (find("transformer.wte.weight"), find("lm_head.weight"));
    let sum: Vec<f32> = wte.iter().zip(lm_head).map(|(a, b)| a + b).collect();
    for (n, want) in &grads {
        let got = if n == "transformer.wte.weight" { &sum } else { find(n) };
        assert_all_close(&format!("[{label}] untied: grad {n}"), got, want, 1e-5);
    }
    assert_eq!(got_grads.len(), grads.len() + 1);
    assert_eq!(got_grads.last().unwrap().0, "lm_head.weight", "lm_head is last in checkpoint order");
}

#[test]
fn untied_lm_head_on_cpu() {
    check_untied_head(&CpuDevice::new(None), "cpu");
}

#[test]
fn untied_lm_head_on_gpu() {
    if let Some(gpu) = gpu_or_skip("untied_lm_head_on_gpu") {
        check_untied_head(&gpu, &gpu.describe());
    }
}

/// The configured activation is the one the MLP runs: the exact GELU is within its small difference
/// from the tanh GELU, and ReLU is further off (and still finite).
#[test]
fn activation_function_is_used() {
    let dev = CpuDevice::new(None);
    let (tanh, _) = run_variant(&dev, |_| {}, |_, v| v);
    let with = |f: &str| run_variant(&dev, |c| c.activation_function = f.into(), |_, v| v).0;
    let max_diff = |a: &[f32]| a.iter().zip(&tanh).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert_eq!(max_diff(&with("gelu_pytorch_tanh")), 0.0);
    let (erf, relu) = (max_diff(&with("gelu")), max_diff(&with("relu")));
    assert!(erf > 0.0 && erf < 1e-2, "gelu vs gelu_new: {erf:.2e}");
    assert!(relu > erf && relu.is_finite(), "relu vs gelu_new: {relu:.2e}");
}
