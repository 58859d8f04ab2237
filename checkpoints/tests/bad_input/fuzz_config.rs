//! config.json: a valid GPT-2 config with keys dropped, retyped, set to huge, zero, negative or
//! unknown values, and its text cut or garbled. `Gpt2Config::from_file` never panics, errors name the
//! file, and what it accepts is valid and survives `to_hf_json`.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};
use zerostream_checkpoints::Gpt2Config;

use crate::common::*;

fn random_value(rng: &mut StdRng) -> Value {
    let pool = [
        Value::Null,
        json!(true),
        json!(false),
        json!(0),
        json!(1),
        json!(-1),
        json!(2),
        json!(3),
        json!(4),
        json!(8),
        json!(64),
        json!(4097),
        json!(0.1),
        json!(-0.5),
        json!(1.0),
        json!(1e300),
        json!(-1e300),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1u64 << 32),
        json!(1u64 << 62),
        json!(""),
        json!("gpt2"),
        json!("llama"),
        json!("gelu"),
        json!("gelu_pytorch_tanh"),
        json!([]),
        json!([1, 2]),
        json!({}),
    ];
    match rng.random_range(0..3) {
        0 => json!(rng.random_range(0..100_000u64)),
        1 => json!(rng.random::<f64>() * 2.0 - 0.5),
        _ => pool.choose(rng).unwrap().clone(),
    }
}

fn config_text(rng: &mut StdRng) -> String {
    let mut config = tiny_config();
    let object = config.as_object_mut().unwrap();
    let keys: Vec<String> = object.keys().cloned().collect();
    for _ in 0..rng.random_range(1..4) {
        let key = keys.choose(rng).unwrap().clone();
        match rng.random_range(0..4) {
            0 => drop(object.remove(&key)),
            1 => drop(object.insert(format!("unknown_{}", rng.random_range(0..3)), random_value(rng))),
            _ => drop(object.insert(key, random_value(rng))),
        }
    }
    let mut text = config.to_string();
    match rng.random_range(0..10) {
        0 => text.truncate(rng.random_range(0..=text.len())),
        1 => {
            let i = rng.random_range(0..text.len());
            if text.is_char_boundary(i) && text.is_char_boundary(i + 1) {
                let c = *b"{}[]\":,0-9e. x".choose(rng).unwrap() as char;
                text.replace_range(i..i + 1, &c.to_string());
            }
        }
        _ => {}
    }
    text
}

#[test]
fn configs_never_panic_and_errors_name_the_file() {
    let mut rng = rng(3);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let mut accepted = 0;
    for i in 0..cases() {
        let text = config_text(&mut rng);
        std::fs::write(&path, &text).unwrap();
        case("config", i, &text, || match Gpt2Config::from_file(&path) {
            Ok(config) => {
                accepted += 1;
                config.validate().unwrap();
                assert!(config.hidden() > 0);
                let _ = config.dropout_requested();
                std::fs::write(&path, config.to_hf_json().to_string()).unwrap();
                assert_eq!(Gpt2Config::from_file(&path).unwrap(), config, "to_hf_json does not round-trip");
            }
            Err(e) => drop(names(&e, &path)),
        });
    }
    assert!(accepted > cases() / 20, "accepted {accepted}");
}
