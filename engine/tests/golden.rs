//! The whole GPT-2 against PyTorch: forward (loss, every hidden state, logits) and backward (every
//! parameter gradient) on the first micro-batch of `golden/gpt2-tiny`, on the cpu and gpu devices.
//!
//! The data in `tests/golden/` is a copy of the project's shared reference (`shared/golden/`), made by
//! `gen_golden.py` beside it with PyTorch 2.15 and transformers 5.23 in float64 from the float32 weights.
//! To regenerate: run that script where PyTorch is installed and copy its output folders here.

mod common;

use std::path::PathBuf;

use common::gpu_or_skip;
use safetensors::SafeTensors;
use zerostream::device::{Backend, CpuDevice};
use zerostream::model::gpt2::{Gpt2, parameter_specs};
use zerostream_checkpoints::HfModel;

fn golden_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)
}

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
