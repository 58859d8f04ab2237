//! Each refusal, once: the error names the file (and key or tensor) and says what was expected.

use std::path::Path;

use safetensors::Dtype;
use serde_json::{Value, json};
use zerostream_checkpoints::{Gpt2Config, HfModel, TokenFile, write_token_file};

use crate::common::*;

fn config_error(dir: &Path, config: &Value) -> String {
    let path = dir.join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    names(&Gpt2Config::from_file(&path).unwrap_err(), &path)
}

fn with(key: &str, value: Value) -> Value {
    let mut config = tiny_config();
    config[key] = value;
    config
}

#[test]
fn config_options_the_engine_does_not_implement_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for (key, value, expected) in [
        ("add_cross_attention", json!(true), "supported: add_cross_attention = false"),
        ("scale_attn_weights", json!("yes"), "scale_attn_weights is a string, expected true or false"),
        ("tie_word_embeddings", json!(0), "tie_word_embeddings is a number, expected true or false"),
        ("model_type", json!("llama"), "model_type \"llama\": this model family is not supported yet"),
        ("model_type", json!(2), "model_type is a number"),
        ("activation_function", json!("swish"), "activation_function \"swish\" is not supported"),
        ("n_embd", json!(1u64 << 40), "n_embd = 1099511627776 is above"),
        ("n_inner", json!(0), "n_inner = 0 must be positive"),
        ("layer_norm_epsilon", json!(-1.0), "layer_norm_epsilon = -1 must be a positive number"),
        ("resid_pdrop", json!(1.5), "resid_pdrop = 1.5 is not a dropout probability"),
        ("n_head", json!(-2), "not a GPT-2 config: n_head: invalid value: integer `-2`"),
        ("n_embd", json!("32"), "not a GPT-2 config: n_embd: invalid type: string"),
        ("n_head", json!(0), "n_head = 0; n_embd, n_head, n_layer, vocab_size and n_positions must all be positive"),
    ] {
        let text = config_error(dir.path(), &with(key, value));
        assert!(text.contains(expected), "{key}: {text}");
    }
    // A llama config lacks GPT-2's keys: the family is named before any missing key is.
    let llama = json!({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32});
    assert!(config_error(dir.path(), &llama).contains("this model family is not supported yet"));
    assert!(config_error(dir.path(), &json!([1, 2])).contains("expected a JSON object"));
    std::fs::write(dir.path().join("config.json"), "{\"n_embd\": 4,").unwrap();
    let path = dir.path().join("config.json");
    assert!(names(&Gpt2Config::from_file(&path).unwrap_err(), &path).contains("not valid JSON"));
}

#[test]
fn implemented_options_are_accepted_and_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let mut config = tiny_config();
    for (key, value) in [
        ("scale_attn_weights", json!(false)),
        ("scale_attn_by_inverse_layer_idx", json!(true)),
        ("reorder_and_upcast_attn", json!(true)),
        ("tie_word_embeddings", json!(false)),
        ("activation_function", json!("relu")),
    ] {
        config[key] = value;
    }
    std::fs::write(&path, config.to_string()).unwrap();
    let parsed = Gpt2Config::from_file(&path).unwrap();
    assert!(!parsed.scale_attn_weights && parsed.scale_attn_by_inverse_layer_idx && parsed.reorder_and_upcast_attn);
    assert!(!parsed.tie_word_embeddings);
    assert_eq!(parsed.activation_function, "relu");
    std::fs::write(&path, parsed.to_hf_json().to_string()).unwrap();
    assert_eq!(Gpt2Config::from_file(&path).unwrap(), parsed);
    for f in ["gelu_new", "gelu_pytorch_tanh", "gelu", "relu"] {
        std::fs::write(&path, with("activation_function", json!(f)).to_string()).unwrap();
        assert_eq!(Gpt2Config::from_file(&path).unwrap().activation_function, f);
    }
    // Absent keys mean transformers' defaults.
    let mut bare = tiny_config();
    for key in ["scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "tie_word_embeddings"] {
        bare.as_object_mut().unwrap().remove(key);
    }
    std::fs::write(&path, bare.to_string()).unwrap();
    let parsed = Gpt2Config::from_file(&path).unwrap();
    assert!(parsed.scale_attn_weights && !parsed.scale_attn_by_inverse_layer_idx && !parsed.reorder_and_upcast_attn);
    assert!(parsed.tie_word_embeddings);
}

#[test]
fn dropout_is_recorded_not_refused_and_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, tiny_config().to_string()).unwrap();
    let config = Gpt2Config::from_file(&path).unwrap();
    assert_eq!((config.resid_pdrop, config.embd_pdrop, config.attn_pdrop), (0.1, 0.1, 0.1));
    assert_eq!(config.dropout_requested().as_deref(), Some("resid_pdrop = 0.1, embd_pdrop = 0.1, attn_pdrop = 0.1"));
    let json = config.to_hf_json();
    assert_eq!(json["attn_pdrop"], json!(0.1));
    std::fs::write(&path, json.to_string()).unwrap();
    assert_eq!(Gpt2Config::from_file(&path).unwrap(), config);

    let mut bare = tiny_config();
    for key in ["resid_pdrop", "embd_pdrop", "attn_pdrop"] {
        bare.as_object_mut().unwrap().remove(key);
    }
    std::fs::write(&path, bare.to_string()).unwrap();
    let config = Gpt2Config::from_file(&path).unwrap();
    assert_eq!(config.dropout_requested(), None);
    assert_eq!(Gpt2Config::preset("gpt2").unwrap().dropout_requested(), None);
    let only_attn = Gpt2Config { attn_pdrop: 0.2, ..config };
    assert_eq!(only_attn.dropout_requested().as_deref(), Some("attn_pdrop = 0.2"));
}

#[test]
fn non_finite_weights_are_refused_naming_tensor_and_element() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("model.safetensors");
    let mut f32s = [0.5f32; 12];
    f32s[3] = f32::NAN;
    let tensors: Vec<Stored> = vec![
        ("wte.weight", Dtype::F32, vec![4, 3], f32s.iter().flat_map(|v| v.to_le_bytes()).collect()),
        (
            "h.0.ln_1.weight",
            Dtype::F16,
            vec![3],
            [1.0, f32::INFINITY, 1.0].iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
        ),
        // Finite as f64, infinite as the f32 it is trained in.
        ("h.0.ln_1.bias", Dtype::F64, vec![3], [1.0, 1.0, 1e300f64].iter().flat_map(|v| v.to_le_bytes()).collect()),
        ("wpe.weight", Dtype::F64, vec![2], [1.0, -2.0f64].iter().flat_map(|v| v.to_le_bytes()).collect()),
    ];
    write_model(dir.path(), &tiny_config(), &safetensors_bytes(&tensors));
    let model = HfModel::open(dir.path()).unwrap();
    let err = |name: &str, shape: &[usize]| names(&model.tensor(name, shape).unwrap_err(), &weights);
    let text = err("transformer.wte.weight", &[4, 3]);
    assert!(text.contains("tensor transformer.wte.weight holds a non-finite value (NaN as f32) at element 3 of 12"), "{text}");
    assert!(err("h.0.ln_1.weight", &[3]).contains("(inf as f32) at element 1"));
    assert!(err("h.0.ln_1.bias", &[3]).contains("(inf as f32) at element 2"));
    assert_eq!(model.tensor("wpe.weight", &[2]).unwrap(), vec![1.0, -2.0]);
    assert!(err("wpe.weight", &[3]).contains("has shape [2], expected [3]"));
}

#[test]
fn invalid_or_truncated_safetensors_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("model.safetensors");
    let good = safetensors_bytes(&tiny_tensors());
    let open_error = |bytes: &[u8]| {
        write_model(dir.path(), &tiny_config(), bytes);
        names(&HfModel::open(dir.path()).err().expect("opened a bad file"), &weights)
    };
    assert!(open_error(&good[..good.len() - 1]).contains("truncated?"));
    assert!(open_error(&good[..20]).contains("runs past the end of the file"));
    assert!(open_error(&good[..5]).contains("shorter than the 8-byte header length"));
    assert!(open_error(&[good.as_slice(), &[0]].concat()).contains("trailing bytes"));
    assert!(open_error(&[&[255u8; 8][..], &good[8..]].concat()).contains("header length"));
    let mut bad_json = good.clone();
    bad_json[8] = b'[';
    assert!(open_error(&bad_json).contains("invalid header"));
    // A header safetensors refuses: the tensor at fault named, and how.
    let file_of =
        |header: &str, data_bytes: usize| [&(header.len() as u64).to_le_bytes()[..], header.as_bytes(), &vec![0u8; data_bytes]].concat();
    let tensor = |name: &str, dtype: &str, shape: &str, offsets: &str| {
        format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":{offsets}}}"#)
    };
    let a = tensor("wte.weight", "F32", "[4,3]", "[0,48]");
    for (b, want) in [
        (tensor("wpe.weight", "F5", "[2]", "[48,56]"), "tensor wpe.weight: dtype \"F5\" is not one safetensors names"),
        (tensor("wpe.weight", "F4", "[3]", "[48,56]"), "shape [3] of F4 is 12 bits, not whole bytes"),
        (
            tensor("wpe.weight", "F32", "[3]", "[48,56]"),
            "tensor wpe.weight: data_offsets [48, 56] hold 8 bytes, but shape [3] of F32 is 12 bytes",
        ),
        (
            tensor("wpe.weight", "F32", "[2]", "[40,48]"),
            "tensor wpe.weight: data_offsets [40, 48] overlap the tensor before it, which ends at 48",
        ),
    ] {
        let err = open_error(&file_of(&format!("{{{a},{b}}}"), 56));
        assert!(err.contains(want), "{err}");
    }

    // Truncated after opening: an error when the tensor is read, not SIGBUS.
    write_model(dir.path(), &tiny_config(), &good);
    let model = HfModel::open(dir.path()).unwrap();
    assert_eq!(model.tensor("wte.weight", &[4, 3]).unwrap()[..2], [0.5, 1.5]);
    std::fs::OpenOptions::new().write(true).open(&weights).unwrap().set_len(good.len() as u64 - 10).unwrap();
    let text = names(&model.tensor("wte.weight", &[4, 3]).unwrap_err(), &weights);
    assert!(text.contains("changed after it was opened"), "{text}");
}

#[test]
fn token_file_truncated_or_rewritten_during_the_run_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.bin");
    let tokens: Vec<u16> = (0..100).collect();
    write_token_file(&path, &tokens).unwrap();
    let file = TokenFile::open(&path).unwrap();
    assert_eq!(file.micro_batch(3, 2, 4).unwrap().0, (24..32).collect::<Vec<u32>>());

    let handle = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    handle.set_len(1024 + 2 * 50).unwrap();
    for err in [file.micro_batch(3, 2, 4).unwrap_err(), file.check_vocab(1000).unwrap_err(), file.get(0).unwrap_err()] {
        let text = names(&err, &path);
        assert!(text.contains("changed during the run: it was 1224 bytes when opened and is 1124 bytes now"), "{text}");
        assert!(text.contains("expected 100 tokens"), "{text}");
    }

    // The same size again, but written after the open: its modification time tells.
    handle.set_len(1024 + 2 * 100).unwrap();
    let later = std::fs::metadata(&path).unwrap().modified().unwrap() + std::time::Duration::from_secs(5);
    handle.set_modified(later).unwrap();
    assert!(names(&file.micro_batch(0, 2, 4).unwrap_err(), &path).contains("rewritten after it was opened"));

    // Replaced by a rename (as `prepare` writes): a run goes on reading the file it opened.
    let before = TokenFile::open(&path).unwrap();
    write_token_file(&path, &[7; 100]).unwrap();
    assert_eq!(before.micro_batch(0, 1, 2).unwrap().0, vec![0, 1]);
    assert_eq!(TokenFile::open(&path).unwrap().micro_batch(0, 1, 2).unwrap().0, vec![7, 7]);
}

#[test]
fn write_token_file_touches_no_other_file() {
    let dir = tempfile::tempdir().unwrap();
    let bystanders = ["x.tmp", ".x.bin.tmp", "x.bin.tmp", ".x.tmp", ".x.bin.zerostream.tmp", "x"];
    for name in bystanders {
        std::fs::write(dir.path().join(name), name).unwrap();
    }
    let out = dir.path().join("x.bin");
    write_token_file(&out, &[1, 2, 3]).unwrap();
    write_token_file(&out, &[4, 5, 6, 7]).unwrap();
    for name in bystanders {
        assert_eq!(std::fs::read_to_string(dir.path().join(name)).unwrap(), name, "{name} was touched");
    }
    let file = TokenFile::open(&out).unwrap();
    assert_eq!((file.len, file.get(3).unwrap()), (4, 7));
    let mut left: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    let mut expected: Vec<String> = bystanders.iter().chain(&["x.bin"]).map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(left, expected, "a temporary file was left behind");

    // A directory where the file should go is refused, not replaced.
    let taken = dir.path().join("taken.bin");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("keep"), "keep").unwrap();
    assert!(names(&write_token_file(&taken, &[1]).unwrap_err(), &taken).contains("not a regular file"));
    assert_eq!(std::fs::read_to_string(taken.join("keep")).unwrap(), "keep");
    // A missing directory is an error naming the file.
    let nowhere = dir.path().join("missing").join("x.bin");
    names(&write_token_file(&nowhere, &[1]).unwrap_err(), &nowhere);
}

#[cfg(unix)]
#[test]
fn pipes_and_directories_given_as_files_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let (f, d) = (fifo.clone(), dir.path().to_path_buf());
    let (tokens, dir_as_tokens, config) = within_10s(move || {
        (
            TokenFile::open(&f).err().map(|e| format!("{e:#}")),
            TokenFile::open(&d).err().map(|e| format!("{e:#}")),
            Gpt2Config::from_file(&f).err().map(|e| format!("{e:#}")),
        )
    });
    assert!(tokens.unwrap().contains("is a pipe, socket or device, not a regular file"));
    assert!(dir_as_tokens.unwrap().contains("is a directory, not a regular file"));
    assert!(config.unwrap().contains("not a regular file"));
    assert!(names(&write_token_file(&fifo, &[1]).unwrap_err(), &fifo).contains("not a regular file"));

    // A model directory whose weights are a FIFO.
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("config.json"), tiny_config().to_string()).unwrap();
    mkfifo(&model.join("model.safetensors"));
    let m = model.clone();
    let err = within_10s(move || HfModel::open(&m).err().map(|e| format!("{e:#}"))).unwrap();
    assert!(err.contains(&model.join("model.safetensors").display().to_string()) && err.contains("not a regular file"), "{err}");

    // A model directory whose config.json is a FIFO (read by every family's reader), and a token
    // file's tokenizer record.
    let piped = dir.path().join("piped");
    std::fs::create_dir(&piped).unwrap();
    mkfifo(&piped.join("config.json"));
    let (p, f) = (piped.clone(), fifo.clone());
    let (hf, llama) = within_10s(move || {
        (
            HfModel::open(&p).err().map(|e| format!("{e:#}")),
            zerostream_checkpoints::LlamaConfig::from_file(&f).err().map(|e| format!("{e:#}")),
        )
    });
    let hf = hf.unwrap();
    assert!(hf.contains(&piped.join("config.json").display().to_string()) && hf.contains("not a regular file"), "{hf}");
    assert!(llama.unwrap().contains("not a regular file"));
    let tokens = dir.path().join("t.bin");
    write_token_file(&tokens, &[1, 2]).unwrap();
    mkfifo(&zerostream_checkpoints::DataTokenizer::sidecar(&tokens));
    let record = within_10s(move || zerostream_checkpoints::DataTokenizer::read_beside(&tokens).err().map(|e| format!("{e:#}")));
    assert!(record.unwrap().contains("not a regular file"));
}

/// A sharded model (model.safetensors.index.json and its shards) reads as one; a tensor the index
/// promises in a shard that does not hold it is named with the shard.
#[test]
fn a_sharded_model_reads_as_one_and_a_broken_promise_names_its_shard() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = tiny_tensors();
    let (first, second) = tensors.split_at(2);
    std::fs::write(dir.path().join("config.json"), serde_json::to_vec(&tiny_config()).unwrap()).unwrap();
    std::fs::write(dir.path().join("model-00001-of-00002.safetensors"), safetensors_bytes(first)).unwrap();
    std::fs::write(dir.path().join("model-00002-of-00002.safetensors"), safetensors_bytes(second)).unwrap();
    let shard_of = |i: usize| if i < 2 { "model-00001-of-00002.safetensors" } else { "model-00002-of-00002.safetensors" };
    let mut map: serde_json::Map<String, Value> = tensors.iter().enumerate().map(|(i, t)| (t.0.to_string(), json!(shard_of(i)))).collect();
    let index = dir.path().join("model.safetensors.index.json");
    std::fs::write(&index, json!({"metadata": {}, "weight_map": map}).to_string()).unwrap();
    let model = HfModel::open(dir.path()).unwrap();
    assert_eq!(model.tensor("transformer.wpe.weight", &[2, 3]).unwrap(), [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]);
    assert_eq!(model.tensor("wte.weight", &[4, 3]).unwrap()[11], 11.5);
    map.insert("ln_f.weight".into(), json!("model-00002-of-00002.safetensors"));
    std::fs::write(&index, json!({"weight_map": map}).to_string()).unwrap();
    let err = HfModel::open(dir.path()).unwrap().tensor("transformer.ln_f.weight", &[3]).unwrap_err().to_string();
    assert!(err.contains("model.safetensors.index.json names tensor transformer.ln_f.weight in model-00002-of-00002.safetensors"), "{err}");
}
