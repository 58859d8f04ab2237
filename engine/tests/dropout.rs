//! Dropout: the kernels draw the same masks as their twins; attention's and the model's gradients under
//! a fixed mask are the derivatives of the masked forward (checked by central differences); the GPU
//! trains like the cpu device with dropout on; the masks do not depend on the world size (keyed by the
//! global micro-batch); and dropout really changes the run while `--dropout 0` leaves the golden
//! trajectory exactly as it was. (Resuming with dropout is bit-identical: tests/checkpoints_resume.rs.)

#[macro_use]
mod common;

use common::kernel_check::{Outputs, tensor};
use common::trajectory::{Golden, bits, check_against, run_rank};
use common::{gpu_or_skip, random};
use zerostream::comm::Comm;
use zerostream::device::{AttentionDims, Backend, CpuDevice};
use zerostream::model::gpt2::Gpt2;
use zerostream::ops::dropout::{DropoutKeys, DropoutMask, DropoutRates};
use zerostream::train::TrainConfig;
use zerostream::train::ranks::in_process;
use zerostream_checkpoints::{HfModel, TokenFile};

const GOLDEN: &str = "gpt2-tiny-accum";

fn mask(p: f64, key: u64) -> DropoutMask {
    DropoutMask::new(p, key).unwrap()
}

/// dropout and dropout_residual at awkward sizes and widths; a tensor of ones shows the mask itself.
fn dropout_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for (i, &(n, cols)) in [(1, 1), (63, 7), (65, 65), (4097, 768), (40_000, 3), (70_001, 1000)].iter().enumerate() {
        let m = mask([0.1, 0.5, 0.9][i % 3], 0x5eed_0000 + i as u64);
        let (x, r) = (random(i as u64, n, 3.0), random(i as u64 + 100, n, 3.0));
        let (tx, tr, ones) = (tensor(dev, &x), tensor(dev, &r), tensor(dev, &vec![1.0; n]));
        let t = dev.alloc(n, "out").unwrap();
        dev.dropout(&t, &ones, cols, &m);
        out.push((format!("mask {n}x{cols}"), dev.read(&t)));
        dev.dropout(&t, &tx, cols, &m);
        out.push((format!("dropout {n}x{cols}"), dev.read(&t)));
        dev.dropout_residual(&t, &tr, &tx, cols, &m);
        out.push((format!("dropout_residual {n}x{cols}"), dev.read(&t)));
    }
    out
}

#[test]
fn dropout_kernels_match_twins() {
    // The masks are integer hashes: the same bits everywhere (a scaled 1 is exact).
    check!("dropout", dropout_case, 1e-6, 1e-6);
}

/// Attention with dropout on its probabilities, forward and backward, for MHA and GQA shapes, with
/// several batches so the GPU's split by batch must keep the mask's batch index global.
fn attention_dropout_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    // Partial 32-row tiles of the tiled kernels, head dims of part of one 32-channel chunk up to four.
    let cases = [
        AttentionDims::mha(3, 17, 48, 4),
        AttentionDims::gqa(2, 300, 4, 2, 12),
        AttentionDims::gqa(3, 65, 6, 3, 64),
        AttentionDims::gqa(2, 130, 4, 2, 128),
        AttentionDims::gqa(2, 33, 3, 1, 7),
    ];
    for (i, d) in cases.into_iter().enumerate() {
        let d = d.with_dropout(Some(mask([0.1, 0.3, 0.5, 0.2, 0.4][i], 77 + i as u64)));
        let tag = format!("B{} T{} H{} G{} D{}", d.batch, d.seq_len, d.heads, d.kv_heads, d.head_dim);
        let rows = d.batch * d.seq_len;
        let qkv = tensor(dev, &random(i as u64, rows * d.qkv_width(), 1.5));
        let (o, lse) = (dev.alloc(rows * d.out_width(), "o").unwrap(), dev.alloc(d.stat_len(), "lse").unwrap());
        dev.attention_forward(&o, &lse, &qkv, d);
        out.push((format!("out {tag}"), dev.read(&o)));
        out.push((format!("lse {tag}"), dev.read(&lse)));
        let dout = tensor(dev, &random(i as u64 + 1, rows * d.out_width(), 1.0));
        let dqkv = tensor(dev, &random(i as u64 + 2, rows * d.qkv_width(), 9.0));
        let delta = tensor(dev, &random(i as u64 + 3, d.stat_len(), 9.0));
        dev.attention_backward(&dqkv, &delta, &dout, &qkv, &o, &lse, d);
        out.push((format!("dqkv {tag}"), dev.read(&dqkv)));
    }
    out
}

#[test]
fn attention_with_dropout_matches_twin() {
    check!("attention dropout", attention_dropout_case, 1e-4, 1e-4);
}

/// Central difference of `f` along `u` at step `eps`, in f64.
fn directional(f: &mut dyn FnMut(f32) -> f64, eps: f32) -> f64 {
    (f(eps) - f(-eps)) / (2.0 * eps as f64)
}

#[test]
fn attention_dropout_gradient_is_the_derivative_of_the_masked_forward() {
    let dev = CpuDevice::new(None);
    let d = AttentionDims::gqa(2, 9, 4, 2, 8).with_dropout(Some(mask(0.3, 11)));
    let rows = d.batch * d.seq_len;
    let (qkv, w, u) = (random(1, rows * d.qkv_width(), 1.0), random(2, rows * d.out_width(), 1.0), random(3, rows * d.qkv_width(), 1.0));
    // loss = sum(out * w), so dout = w.
    let mut loss = |step: f32| -> f64 {
        let moved: Vec<f32> = qkv.iter().zip(&u).map(|(x, du)| x + step * du).collect();
        let (o, lse) = (dev.alloc(rows * d.out_width(), "o").unwrap(), dev.alloc(d.stat_len(), "lse").unwrap());
        dev.attention_forward(&o, &lse, &tensor(&dev, &moved), d);
        dev.read(&o).iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum()
    };
    let numeric = directional(&mut loss, 1e-2);
    let (o, lse) = (dev.alloc(rows * d.out_width(), "o").unwrap(), dev.alloc(d.stat_len(), "lse").unwrap());
    let tq = tensor(&dev, &qkv);
    dev.attention_forward(&o, &lse, &tq, d);
    let (dqkv, delta) = (dev.alloc(rows * d.qkv_width(), "dqkv").unwrap(), dev.alloc(d.stat_len(), "delta").unwrap());
    dev.attention_backward(&dqkv, &delta, &tensor(&dev, &w), &tq, &o, &lse, d);
    let analytic: f64 = dev.read(&dqkv).iter().zip(&u).map(|(g, du)| *g as f64 * *du as f64).sum();
    let err = (numeric - analytic).abs() / analytic.abs();
    println!("attention with dropout: directional derivative {analytic:.6} (backward) vs {numeric:.6} (central difference)");
    assert!(err < 1e-2, "attention dropout backward: {analytic} vs central difference {numeric} ({err:.2e})");
    // The mask matters: without it the same direction has another derivative.
    let plain = d.with_dropout(None);
    dev.attention_forward(&o, &lse, &tq, plain);
    dev.attention_backward(&dqkv, &delta, &tensor(&dev, &w), &tq, &o, &lse, plain);
    let undropped: f64 = dev.read(&dqkv).iter().zip(&u).map(|(g, du)| *g as f64 * *du as f64).sum();
    assert!((undropped - analytic).abs() > 0.05 * analytic.abs(), "dropout changed nothing: {undropped} vs {analytic}");
}

fn keys() -> DropoutKeys {
    DropoutKeys { rates: DropoutRates { embd: 0.1, attn: 0.2, resid: 0.3 }, seed: 5, step: 3, micro_batch: 7 }
}

/// gpt2-tiny resident with dropout on, on `dev`: (mean loss, every gradient) of golden micro-batch 0.
fn loss_and_grads<D: Backend>(dev: &D, dropout: Option<DropoutKeys>) -> (f32, Vec<Vec<f32>>) {
    let (model, x, y) = tiny_gpt2(dev, dropout);
    let mut model = model;
    model.zero_grads(dev);
    let loss = model.forward(dev, &x, &y, 2, 16, Some(1.0)).unwrap();
    model.backward(dev, &x).unwrap();
    (loss, model.grads.tensors().into_iter().map(|g| dev.read(g)).collect())
}

fn tiny_gpt2<D: Backend>(dev: &D, dropout: Option<DropoutKeys>) -> (Gpt2<D>, D::Tokens, D::Tokens) {
    let dir = common::trajectory::golden_dir(GOLDEN);
    let mut model = Gpt2::from_hf(dev, &HfModel::open(&dir.join("model")).unwrap()).unwrap();
    model.dropout = dropout;
    let (x, y) = TokenFile::open(&dir.join("tokens.bin")).unwrap().micro_batch(0, 2, 16).unwrap();
    (model, dev.tokens(&x).unwrap(), dev.tokens(&y).unwrap())
}

/// Along a random direction in one tensor at a time, the backward's derivative against a central
/// difference of the forward with the same masks: a mask that differed between forward and backward at
/// any site moves some tensor's derivative by far more than the tolerance.
#[test]
fn model_gradients_under_dropout_are_the_derivatives_of_the_masked_loss() {
    let dev = CpuDevice::new(None);
    let (loss, grads) = loss_and_grads(&dev, Some(keys()));
    let (plain_loss, _) = loss_and_grads(&dev, None);
    assert_ne!(loss, plain_loss, "dropout changed nothing");
    let (mut model, x, y) = tiny_gpt2(&dev, Some(keys()));
    let tensors = model.params.tensors().len();
    let mut worst = (0.0f64, 0);
    assert_eq!(grads.len(), tensors, "one gradient per parameter tensor");
    for (i, grad) in grads.iter().enumerate() {
        let original = dev.read(model.params.tensors()[i]);
        let dir = random(1000 + i as u64, original.len(), 1.0);
        let analytic: f64 = grad.iter().zip(&dir).map(|(a, b)| *a as f64 * *b as f64).sum();
        let mut moved_loss = |step: f32| -> f64 {
            let t = model.params.tensors()[i];
            dev.write(t, &original.iter().zip(&dir).map(|(a, b)| a + step * b).collect::<Vec<f32>>());
            model.forward(&dev, &x, &y, 2, 16, None).unwrap() as f64
        };
        let numeric = directional(&mut moved_loss, 1e-3);
        dev.write(model.params.tensors()[i], &original);
        // Tensors whose derivative is tiny are judged against 1e-3 absolute (f32 forward noise).
        let err = (numeric - analytic).abs() / analytic.abs().max(0.1);
        if err > worst.0 {
            worst = (err, i);
        }
    }
    println!("gpt2-tiny with dropout: worst directional-derivative error {:.2e} (tensor {} of {tensors})", worst.0, worst.1);
    assert!(worst.0 < 1e-2, "model backward under dropout: tensor {} off by {:.2e}", worst.1, worst.0);
}

#[test]
fn the_gpu_draws_the_cpu_devices_masks_in_a_whole_model() {
    let Some(gpu) = gpu_or_skip("the_gpu_draws_the_cpu_devices_masks_in_a_whole_model") else { return };
    let (cpu_loss, cpu_grads) = loss_and_grads(&CpuDevice::new(None), Some(keys()));
    let (gpu_loss, gpu_grads) = loss_and_grads(&gpu, Some(keys()));
    assert!(((cpu_loss - gpu_loss) / cpu_loss).abs() < 1e-5, "loss {gpu_loss} (gpu) vs {cpu_loss} (cpu)");
    for (i, (g, c)) in gpu_grads.iter().zip(&cpu_grads).enumerate() {
        let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let diff: Vec<f32> = g.iter().zip(c).map(|(a, b)| a - b).collect();
        assert!(norm(&diff) <= 1e-4 * norm(c) + 1e-9, "gradient {i}: relative L2 error {:.2e}", norm(&diff) / norm(c));
    }
}

fn train(dropout: Option<f64>, world: usize) -> common::trajectory::Run {
    let golden = Golden::load(GOLDEN);
    let tc = TrainConfig { dropout, steps: 4, grad_accum: 2 / world, ..golden.train_config() };
    let runs = in_process(world, |comm: Comm| run_rank(&CpuDevice::new(None), GOLDEN, tc.clone(), comm)).unwrap();
    runs.into_iter().next().unwrap()
}

#[test]
fn dropout_masks_do_not_depend_on_the_world_size_and_zero_changes_nothing() {
    let one = train(Some(0.1), 1);
    let two = train(Some(0.1), 2);
    for (s, (a, b)) in one.losses.iter().zip(&two.losses).enumerate() {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "step {s}: loss {a} (one rank) vs {b} (two ranks)");
    }
    let none = train(None, 1);
    assert!(one.losses.iter().zip(&none.losses).all(|(a, b)| a != b), "dropout 0.1 trained like no dropout");
    // --dropout 0 is no dropout at all: the golden run, bit for bit.
    assert!(bits(&train(Some(0.0), 1)) == bits(&none));
    check_against(&Golden::load(GOLDEN), &train_full(Some(0.0)), GOLDEN, "dropout 0");
}

fn train_full(dropout: Option<f64>) -> common::trajectory::Run {
    let golden = Golden::load(GOLDEN);
    run_rank(&CpuDevice::new(None), GOLDEN, TrainConfig { dropout, ..golden.train_config() }, Comm::single()).unwrap()
}

#[test]
fn the_gpu_trains_like_the_cpu_device_with_dropout() {
    let Some(gpu) = gpu_or_skip("the_gpu_trains_like_the_cpu_device_with_dropout") else { return };
    let golden = Golden::load(GOLDEN);
    let tc = TrainConfig { dropout: Some(0.2), steps: 4, ..golden.train_config() };
    let cpu = run_rank(&CpuDevice::new(None), GOLDEN, tc.clone(), Comm::single()).unwrap();
    let gpu = run_rank(&gpu, GOLDEN, tc, Comm::single()).unwrap();
    for (s, (a, b)) in cpu.losses.iter().zip(&gpu.losses).enumerate() {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "step {s}: loss {a} (cpu) vs {b} (gpu)");
    }
}
