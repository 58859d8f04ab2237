//! The output projection and the loss in vocabulary chunks (`model::vocab`, `train::vocab_head`): a
//! chunked run still follows PyTorch's trajectory, and where the (V, C) matrix lives — resident whole,
//! or streamed a chunk at a time under the smallest budget — never changes a bit, for a tied GPT-2 and
//! an untied Llama, in fp32 and bf16, on both devices.
//!
//! The data is the copy of shared/golden in `tests/golden/` (see tests/golden.rs for its origin).

mod common;

use common::gpu_or_skip;
use common::trajectory::{Golden, Run, bits, check_against, golden_dir, run};
use zerostream::device::{Backend, CpuDevice};
use zerostream::model::Model;
use zerostream::train::{Precision, TrainConfig, minimum_device_bytes, minimum_device_bytes_on, plan_on};
use zerostream_checkpoints::HfModel;

fn model_of(name: &str) -> Model {
    Model::of_hf(&HfModel::open(&golden_dir(name).join("model")).unwrap()).unwrap()
}

/// `tc` run with the output projection resident, then streamed under the smallest budget: the same
/// bits, the streamed run within its budget; `check_streamed` then looks at the streamed run's device.
/// Returns the resident run.
fn resident_and_streamed<D: Backend>(
    make_dev: impl Fn(Option<u64>) -> D,
    name: &str,
    tc: TrainConfig,
    what: &str,
    check_streamed: impl FnOnce(&D),
) -> Run {
    let model = model_of(name);
    let unlimited = make_dev(None);
    let costs = unlimited.alloc_costs();
    let resident = run(&unlimited, name, tc.clone());
    let minimum = minimum_device_bytes_on(&model, &tc, costs);
    let streamed_tc = TrainConfig { gpu_mem_budget: Some(minimum), ..tc };
    assert!(!plan_on(&model, &streamed_tc, 1, costs).unwrap().vocab_resident, "{what}: the smallest budget streams the projection");
    let dev = make_dev(Some(minimum));
    let streamed = run(&dev, name, streamed_tc);
    assert!(streamed.peak_bytes <= minimum, "{what}: peak {} bytes above the budget {minimum}", streamed.peak_bytes);
    assert!(bits(&streamed) == bits(&resident), "{what}: streaming the projection changed the losses or the final parameters");
    println!("{what}: streamed under {minimum} bytes (peak {}), bit-identical to resident", streamed.peak_bytes);
    check_streamed(&dev);
    resident
}

#[test]
fn chunked_loss_follows_pytorch_and_streaming_changes_no_bit() {
    // gpt2-tiny-accum: vocabulary 128, tied; chunks of 37 ids (the last one 17).
    let golden = Golden::load("gpt2-tiny-accum");
    let tc = TrainConfig { vocab_chunk_rows: 37, ..golden.train_config() };
    let resident = resident_and_streamed(CpuDevice::new, "gpt2-tiny-accum", tc.clone(), "gpt2 tied, fp32, cpu", |_| {});
    check_against(&golden, &resident, "gpt2-tiny-accum", "cpu, 4 vocabulary chunks");
    let bf16 = TrainConfig { precision: Precision::Bf16, steps: 3, ..tc.clone() };
    resident_and_streamed(CpuDevice::new, "gpt2-tiny-accum", bf16, "gpt2 tied, bf16, cpu", |_| {});
    // llama-tiny: vocabulary 256, untied lm_head; chunks of 100 ids.
    let golden = Golden::load("llama-tiny");
    let tc = TrainConfig { vocab_chunk_rows: 100, ..golden.train_config() };
    let resident = resident_and_streamed(CpuDevice::new, "llama-tiny", tc, "llama untied, fp32, cpu", |_| {});
    check_against(&golden, &resident, "llama-tiny", "cpu, 3 vocabulary chunks");
}

#[test]
fn chunked_loss_streams_bit_identically_on_gpu() {
    let Some(_) = gpu_or_skip("chunked_loss_streams_bit_identically_on_gpu") else { return };
    // Every upload from pinned memory a device copy, however small: the kept vocabulary matrices'
    // chunks too.
    let gpu = |budget: Option<u64>| {
        let dev = zerostream::device::GpuDevice::open(None, budget).unwrap();
        dev.set_pinned_copy_min_bytes(0);
        dev
    };
    let golden = Golden::load("gpt2-tiny-accum");
    let tc = TrainConfig { vocab_chunk_rows: 37, steps: 3, ..golden.train_config() };
    // The streamed runs upload from pinned memory: the working copies and the kept projection's chunks.
    let pinned = |dev: &zerostream::device::GpuDevice| match dev.host_staging_unavailable() {
        None => assert!(dev.pinned_upload_bytes() > 0, "the streamed run uploaded nothing from pinned memory"),
        Some(why) => eprintln!("SKIPPED chunked_loss_streams_bit_identically_on_gpu (pinned part): no pinned memory here ({why})"),
    };
    resident_and_streamed(gpu, "gpt2-tiny-accum", tc, "gpt2 tied, fp32, gpu", pinned);
    let golden = Golden::load("llama-tiny");
    let tc = TrainConfig { vocab_chunk_rows: 100, steps: 3, ..golden.train_config() };
    resident_and_streamed(gpu, "llama-tiny", tc, "llama untied, fp32, gpu", pinned);
}

/// The device minimum no longer grows with the vocabulary: gpt2-xl's with 8x the vocabulary needs only
/// the per-chunk statistics more (a resident (V, C) matrix and its gradient would add 8 B per entry).
#[test]
fn device_minimum_does_not_grow_with_the_vocabulary() {
    let Model::Gpt2(xl) = Model::preset("gpt2-xl").unwrap() else { unreachable!() };
    let tc = TrainConfig { batch: 1, seq_len: 64, recompute: true, precision: Precision::Bf16, ..TrainConfig::default() };
    let minimum =
        |vocab: usize| minimum_device_bytes(&Model::Gpt2(zerostream::model::gpt2::Gpt2Config { vocab_size: vocab, ..xl.clone() }), &tc);
    let (v, c) = (xl.vocab_size as u64, xl.n_embd as u64);
    let (small, large) = (minimum(xl.vocab_size), minimum(8 * xl.vocab_size));
    println!("gpt2-xl device minimum: {small} bytes at vocabulary {v}, {large} at {}", 8 * v);
    assert!(large - small < 8 * 7 * v * c / 1000, "the minimum grows with the (V, C) matrix");
    let stats_growth = 4 * 3 * 64 * (8 * v).div_ceil(8192);
    assert!(large - small <= stats_growth, "8x the vocabulary costs {} more bytes", large - small);
}

/// The vocabulary matrices are found by name, not by shape: a GPT-2 whose context equals its vocabulary
/// has wpe of the same shape as wte, and it is neither the embedding nor the projection.
#[test]
fn vocabulary_matrices_are_found_by_name() {
    let Model::Gpt2(base) = Model::preset("gpt2").unwrap() else { unreachable!() };
    let square = zerostream::model::gpt2::Gpt2Config { vocab_size: 1024, n_positions: 1024, ..base.clone() };
    assert_eq!(Model::Gpt2(square.clone()).vocab_tensors(), (0, 0));
    let untied = zerostream::model::gpt2::Gpt2Config { tie_word_embeddings: false, ..square };
    let model = Model::Gpt2(untied);
    let (embedding, projection) = model.vocab_tensors();
    let specs = model.head_specs();
    assert_eq!((specs[embedding].name.as_str(), specs[projection].name.as_str()), ("transformer.wte.weight", "lm_head.weight"));
}

/// `eval` reads the vocabulary matrices from the model's files a token's row or a vocabulary chunk at a
/// time: for a model whose (V, C) matrix is most of it, the device's peak stays below that one matrix
/// (a resident head needed it whole), and the loss is a finite number near ln V for random weights.
#[test]
fn eval_never_holds_the_vocabulary_matrix() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let golden = golden_dir("gpt2-tiny");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden.join("model/config.json")).unwrap()).unwrap();
    let vocab = 40_000;
    config["vocab_size"] = vocab.into();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let model = Model::Gpt2(zerostream_checkpoints::Gpt2Config::from_file(&config_path).unwrap());
    // Small random weights (norm weights 1), every tensor the model's table names.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = zerostream::train::layout::group_layouts(&model)
        .iter()
        .flat_map(|g| g.tensors.clone())
        .map(|t| {
            let one = t.name.contains("ln_") && t.name.ends_with("weight");
            let values: Vec<f32> = (0..t.len).map(|_| if one { 1.0 } else { rng.random_range(-0.02f32..0.02) }).collect();
            (t.name, t.shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            (name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    let report = eval_tiny(&CpuDevice::new(None), dir.path(), &golden.join("tokens.bin"));
    let matrix_bytes = (vocab * model.width() * 4) as u64;
    assert!(
        report.peak_device_bytes < matrix_bytes,
        "eval's device peak {} bytes holds a {matrix_bytes}-byte vocabulary matrix",
        report.peak_device_bytes
    );
    assert!((report.loss - (vocab as f64).ln()).abs() < 0.5, "loss {} for random weights, ln V = {}", report.loss, (vocab as f64).ln());
    // The GPU streams the same chunks through one slot (each upload ordered after the last chunk's work).
    if let Some(gpu) = gpu_or_skip("eval_never_holds_the_vocabulary_matrix (gpu)") {
        let on_gpu = eval_tiny(&gpu, dir.path(), &golden.join("tokens.bin"));
        assert!((on_gpu.loss - report.loss).abs() < 1e-5 * report.loss, "gpu eval loss {} vs cpu {}", on_gpu.loss, report.loss);
        assert!(on_gpu.peak_device_bytes < matrix_bytes, "gpu eval's device peak {} bytes", on_gpu.peak_device_bytes);
    }
    println!("eval: device peak {} bytes, a (V, C) matrix {matrix_bytes}, loss {}", report.peak_device_bytes, report.loss);
}

/// `zerostream eval` of 2 micro-batches of 2 x 16 tokens.
fn eval_tiny<D: Backend>(dev: &D, model: &std::path::Path, data: &std::path::Path) -> zerostream::EvalReport {
    let eval = zerostream::EvalData {
        path: data,
        dtype: zerostream_checkpoints::TokenWidth::U16,
        batch: 2,
        seq_len: 16,
        batches: 2,
        progress: false,
    };
    zerostream::eval::evaluate(dev, model, &eval).unwrap()
}
