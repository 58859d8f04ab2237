//! safetensors files: a valid file with its header length and JSON header flipped, truncated and
//! grown at random. `HfModel::open` and `tensor` never panic; errors name the file.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::{IndexedMutRandom, IndexedRandom};
use zerostream_checkpoints::HfModel;

use crate::common::*;

/// One random edit, mostly within the header (its 8-byte length and the JSON after it).
fn mutate(rng: &mut StdRng, bytes: &mut Vec<u8>, header_end: usize) {
    let within = |rng: &mut StdRng, len: usize| rng.random_range(0..len.clamp(1, header_end + 8));
    match rng.random_range(0..7) {
        0 if !bytes.is_empty() => {
            let i = within(rng, bytes.len()).min(bytes.len() - 1);
            bytes[i] ^= 1 << rng.random_range(0..8);
        }
        1 => {
            let n = header_end as u64 - 8;
            let len = *[0, 1, n - 1, n + 1, n + 8, u64::MAX, 100_000_001, rng.random(), rng.random_range(0..2 * n)].choose(rng).unwrap();
            bytes.splice(0..8.min(bytes.len()), len.to_le_bytes());
        }
        2 => bytes.truncate(rng.random_range(0..=bytes.len())),
        3 => {
            let at = within(rng, bytes.len()).min(bytes.len());
            let insert: Vec<u8> = (0..rng.random_range(1..8)).map(|_| rng.random()).collect();
            bytes.splice(at..at, insert);
        }
        4 if bytes.len() > 8 => {
            // A character that matters to JSON, in the JSON.
            let i = rng.random_range(8..header_end.min(bytes.len()).max(9)).min(bytes.len() - 1);
            bytes[i] = *b"{}[]\":,0123456789-e. ".choose(rng).unwrap();
        }
        5 if bytes.len() > 8 => {
            let i = rng.random_range(8..bytes.len());
            bytes.remove(i);
        }
        _ => {
            // Anywhere, the tensor data included.
            if let Some(b) = bytes.choose_mut(rng) {
                *b = rng.random();
            }
        }
    }
}

#[test]
fn safetensors_never_panic_and_errors_name_the_file() {
    let mut rng = rng(2);
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("model.safetensors");
    let tensors = tiny_tensors();
    let good = safetensors_bytes(&tensors);
    let header_end = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    write_model(dir.path(), &tiny_config(), &good);
    let (mut opened, mut read) = (0, 0);
    for i in 0..cases() {
        let mut bytes = good.clone();
        if rng.random_bool(0.25) {
            // Only the tensor data: the file opens, and the reader must cope with any values.
            let i = rng.random_range(header_end..bytes.len());
            bytes[i] = rng.random();
        } else {
            for _ in 0..rng.random_range(1..4) {
                mutate(&mut rng, &mut bytes, header_end);
            }
        }
        std::fs::write(&weights, &bytes).unwrap();
        case("safetensors", i, String::from_utf8_lossy(&bytes), || {
            let model = match HfModel::open(dir.path()) {
                Ok(model) => model,
                Err(e) => {
                    names(&e, &weights);
                    return;
                }
            };
            opened += 1;
            for (name, _, shape, _) in &tensors {
                match model.tensor(name, shape) {
                    Ok(values) => {
                        read += 1;
                        assert_eq!(values.len(), shape.iter().product::<usize>());
                        assert!(values.iter().all(|v| v.is_finite()));
                    }
                    // "not found" names the model directory, the others the file in it.
                    Err(e) => drop(names(&e, dir.path())),
                }
            }
        });
    }
    assert!(opened > cases() / 5 && read > cases() / 2, "opened {opened}, read {read} tensors");
}
