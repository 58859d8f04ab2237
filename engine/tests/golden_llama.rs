//! Llama against PyTorch (`tests/golden/llama-tiny`, copied from shared/golden and made there by
//! `gen_golden_llama.py` with transformers' `LlamaForCausalLM`: grouped-query attention 4/2 heads of 12,
//! RoPE, SwiGLU, RMSNorm, untied head, llm.c's uint32 token file): the first micro-batch's loss,
//! logits, every hidden state and every gradient, and the 10-step training trajectory, on the cpu
//! device and the GPU, with the optimizer state in RAM and on NVMe. And the biases Llama-family configs
//! may ask for (`qwen2-tiny`: q/k/v biases; `llama-bias-tiny`: attention_bias and mlp_bias; made by
//! `gen_golden_bias.py` from the same tokens): the first micro-batch's loss, logits and every gradient.

mod common;

use common::gpu_or_skip;
use common::trajectory::{Golden, check_against, golden_dir, run};
use zerostream::device::{Backend, CpuDevice};
use zerostream::model::Model;
use zerostream::train::layout::group_layouts;
use zerostream_checkpoints::HfModel;
use zerostream_offload::Tier;

const NAME: &str = "llama-tiny";

fn ints(golden: &Golden, name: &str) -> Vec<u32> {
    golden.f64_or_ints(name)
}

fn rel_l2_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(g, w)| (*g as f64 - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(1e-300)).sqrt()
}

/// The first micro-batch forward and backward through the model seam, every group resident.
fn check_forward_backward<D: Backend>(dev: &D, name: &str, label: &str) {
    let golden = Golden::load(name);
    let hf = HfModel::open(&golden_dir(name).join("model")).unwrap();
    let model = Model::of_hf(&hf).unwrap();
    let (x, y) = (ints(&golden, "x"), ints(&golden, "y"));
    let (batch, seq_len) = (4, 16);
    let upload = |g: &zerostream::train::layout::GroupLayout| -> (Vec<D::Tensor>, Vec<D::Tensor>) {
        let w = g.tensors.iter().map(|t| {
            let x = dev.alloc(t.len, &t.name).unwrap();
            dev.write(&x, &hf.tensor(&t.name, &t.shape).unwrap());
            x
        });
        let w: Vec<_> = w.collect();
        let grads = g.tensors.iter().map(|t| {
            let x = dev.alloc(t.len, &format!("grad {}", t.name)).unwrap();
            dev.fill(&x, 0.0);
            x
        });
        (w, grads.collect())
    };
    let groups = group_layouts(&model);
    let (head, head_grads) = upload(&groups[0]);
    let blocks: Vec<_> = groups[1..].iter().map(upload).collect();
    let acts: Vec<_> = blocks.iter().map(|_| model.block_acts(dev, batch, seq_len).unwrap()).collect();
    let head_acts = model.head_acts(dev, batch, seq_len).unwrap();
    let residual: Vec<_> = (0..=blocks.len()).map(|_| dev.alloc(batch * seq_len * model.width(), "residual").unwrap()).collect();
    let (xt, yt) = (dev.tokens(&x).unwrap(), dev.tokens(&y).unwrap());
    model.embed_forward(dev, &residual[0], &head, &head_acts, &xt, seq_len, None);
    for (l, ((w, _), a)) in blocks.iter().zip(&acts).enumerate() {
        model.block_forward(dev, l, w, a, &residual[l], &residual[l + 1], batch, seq_len, None);
    }
    let n = blocks.len();
    let loss = model.head_forward(dev, &head, &head_acts, &residual[n], &yt, None) as f64;
    let want_loss = golden.f64("loss")[0];
    assert!((loss - want_loss).abs() / want_loss < 1e-5, "[{label}] loss {loss} vs {want_loss}");
    let logits_err = rel_l2_err(&dev.read(model.logits(&head_acts)), &golden.f64("logits"));
    assert!(logits_err < 1e-5, "[{label}] logits: relative L2 error {logits_err:.2e}");
    if golden.has("hidden_states.0") {
        for (l, r) in residual[..n].iter().enumerate() {
            let err = rel_l2_err(&dev.read(r), &golden.f64(&format!("hidden_states.{l}")));
            assert!(err < 1e-5, "[{label}] hidden_states.{l}: relative L2 error {err:.2e}");
        }
        let err = rel_l2_err(&dev.read(model.final_hidden(&head_acts)), &golden.f64(&format!("hidden_states.{n}")));
        assert!(err < 1e-5, "[{label}] hidden_states.{n} (final norm): relative L2 error {err:.2e}");
    }
    // Backward, as the trainer runs it.
    model.head_forward(dev, &head, &head_acts, &residual[n], &yt, Some(1.0));
    model.head_backward(dev, &head, &head_grads, &head_acts, &residual[n]);
    for (l, ((w, g), a)) in blocks.iter().zip(&acts).enumerate().rev() {
        model.block_backward(dev, l, w, g, a, &residual[l], &head_acts, None);
    }
    model.embed_backward(dev, &head_grads, &head_acts, &xt, None);
    let mut worst = (String::new(), 0.0f64);
    let all = std::iter::once((&groups[0], &head_grads)).chain(groups[1..].iter().zip(blocks.iter().map(|(_, g)| g)));
    for (group, grads) in all {
        for (t, grad) in group.tensors.iter().zip(grads) {
            let err = rel_l2_err(&dev.read(grad), &golden.f64(&format!("grad.{}", t.name)));
            assert!(err < 1e-4, "[{label}] grad.{}: relative L2 error {err:.2e}", t.name);
            if err > worst.1 {
                worst = (t.name.clone(), err);
            }
        }
    }
    let params: usize = groups.iter().map(|g| g.tensors.len()).sum();
    assert_eq!(params, golden.count_prefixed("grad."), "[{label}] every parameter of the golden has a gradient here");
    println!("[{label}] loss {loss}, logits error {logits_err:.2e}, worst gradient error {:.2e} ({})", worst.1, worst.0);
}

const WITH_BIASES: [&str; 2] = ["qwen2-tiny", "llama-bias-tiny"];

#[test]
fn llama_forward_and_backward_match_pytorch_on_cpu() {
    for name in std::iter::once(NAME).chain(WITH_BIASES) {
        check_forward_backward(&CpuDevice::new(None), name, &format!("{name} cpu"));
    }
}

#[test]
fn llama_forward_and_backward_match_pytorch_on_gpu() {
    if let Some(gpu) = gpu_or_skip("llama_forward_and_backward_match_pytorch_on_gpu") {
        for name in std::iter::once(NAME).chain(WITH_BIASES) {
            check_forward_backward(&gpu, name, &format!("{name} gpu"));
        }
    }
}

#[test]
fn llama_training_trajectory_matches_pytorch() {
    let golden = Golden::load(NAME);
    let cpu = CpuDevice::new(None);
    check_against(&golden, &run(&cpu, NAME, golden.train_config()), NAME, "cpu, optimizer in RAM");
    let dir = tempfile::tempdir().unwrap();
    let nvme = zerostream::train::TrainConfig {
        offload_optimizer: Tier::Nvme,
        offload_params: Tier::Nvme,
        nvme_dirs: vec![dir.path().to_path_buf()],
        ..golden.train_config()
    };
    check_against(&golden, &run(&cpu, NAME, nvme), NAME, "cpu, optimizer and parameters on NVMe");
    if let Some(gpu) = gpu_or_skip("llama_training_trajectory_matches_pytorch (gpu)") {
        check_against(&golden, &run(&gpu, NAME, golden.train_config()), NAME, "gpu");
    }
}
