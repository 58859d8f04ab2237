//! Token files: random bytes, llm.c headers with mutated fields, and files truncated after opening.
//! `TokenFile::open` and `micro_batch` never panic; they either agree with the bytes or name the file.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use zerostream_checkpoints::TokenFile;
use zerostream_checkpoints::tokens::LLMC_MAGIC;

use crate::common::*;

/// An llm.c header (magic, version, count) followed by `tokens` random tokens, or random bytes.
fn token_file_bytes(rng: &mut StdRng) -> Vec<u8> {
    let n = rng.random_range(0..300usize);
    match rng.random_range(0..4) {
        0 => (0..rng.random_range(0..3000)).map(|_| rng.random()).collect(),
        1 => (0..2 * n).map(|_| rng.random_range(0..4)).collect(),
        _ => {
            let mut header = [0i32; 256];
            header[0] = if rng.random_bool(0.9) { LLMC_MAGIC } else { rng.random() };
            header[1] = *[1, 1, 1, 0, 2, -1, rng.random()].choose(rng).unwrap();
            let count = n as i32;
            header[2] = *[count, count, count - 1, count + 1, 0, -1, i32::MAX, i32::MIN, rng.random()].choose(rng).unwrap();
            if rng.random_bool(0.1) {
                header[rng.random_range(3..256)] = rng.random();
            }
            let mut bytes: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
            bytes.extend((0..2 * n).map(|_| rng.random::<u8>()));
            if rng.random_bool(0.2) {
                bytes.truncate(rng.random_range(0..=bytes.len()));
            }
            bytes
        }
    }
}

#[test]
fn token_files_never_panic_and_agree_with_their_bytes_or_name_the_file() {
    let mut rng = rng(1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.bin");
    let (mut opened, mut truncated) = (0, 0);
    for i in 0..cases() {
        let bytes = token_file_bytes(&mut rng);
        let (g, batch, seq_len) = (rng.random_range(0..1000), rng.random_range(0..4), rng.random_range(0..40));
        let cut = rng.random_bool(0.3).then(|| rng.random_range(0..bytes.len().max(1)));
        std::fs::write(&path, &bytes).unwrap();
        case("token file", i, (&bytes, g, batch, seq_len, cut), || {
            let file = match TokenFile::open(&path) {
                Ok(file) => file,
                Err(e) => {
                    names(&e, &path);
                    return;
                }
            };
            opened += 1;
            // Where the tokens lie, by the format's definition.
            let start = if bytes.len() >= 1024 && bytes[..4] == LLMC_MAGIC.to_le_bytes() { 1024 } else { 0 };
            assert!(start + 2 * file.len <= bytes.len(), "{} tokens from byte {start} in {} bytes", file.len, bytes.len());
            let token = |i: usize| u16::from_le_bytes([bytes[start + 2 * i], bytes[start + 2 * i + 1]]) as u32;
            match file.micro_batch(g, batch, seq_len) {
                Ok((x, y)) => {
                    let span = batch * seq_len;
                    let first = (g % ((file.len - 1) / span)) * span;
                    assert_eq!(x, (first..first + span).map(token).collect::<Vec<_>>());
                    assert_eq!(y, (first + 1..first + span + 1).map(token).collect::<Vec<_>>());
                }
                Err(e) => {
                    names(&e, &path);
                }
            }
            let largest = (0..file.len).map(token).max();
            file.check_vocab(65536).unwrap();
            if let Some(largest) = largest {
                names(&file.check_vocab(largest as usize).unwrap_err(), &path);
            }
            if let Some(cut) = cut.filter(|&c| c < bytes.len()) {
                truncated += 1;
                std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(cut as u64).unwrap();
                // Every call that reads must notice; a file too short for the call says so first.
                let reads = [
                    (file.len >= 2, file.micro_batch(g, 1, 1).map(drop)),
                    (file.len > 0, file.check_vocab(65536)),
                    (file.len > 0, file.get(0).map(drop)),
                ];
                for (reads, result) in reads {
                    if reads {
                        let text = names(&result.unwrap_err(), &path);
                        assert!(text.contains("changed during the run"), "{text}");
                    }
                }
            }
        });
    }
    // The generator must reach the interesting paths, not only refusals.
    assert!(opened > cases() / 4 && truncated > cases() / 20, "opened {opened}, truncated {truncated}");
}
