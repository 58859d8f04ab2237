//! LAMB's and LARS's bits held to those of the implementation before their passes became whole
//! vectors (commit f476305): the reference shares its block passes with the fast path, so a change to
//! them moves both, and `layerwise.rs`'s fast-against-reference test cannot see it.
//!
//! The digests below were printed by this same file run at commit 95bb545 (the parent of that change),
//! `cargo test -p zerostream-offload --test layerwise_bits -- --nocapture`. They also depend on
//! rand_chacha's stream and rand's f32 sampling: after a bump of either, print them at 95bb545 again
//! with the new versions before concluding that the optimizers changed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zerostream_offload::ParamCopy;
use zerostream_offload::layerwise::{LayerwiseConfig, NORM_BLOCK_ELEMS, Rule, layerwise_reference};

/// FNV-1a over `words`' little-endian bytes, in order.
fn digest(words: impl IntoIterator<Item = u32>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in words.into_iter().flat_map(u32::to_le_bytes) {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// 3 steps of `cfg` from seeded parameters and gradients at lengths that cut the norm blocks awkwardly,
/// decayed and excluded; the digest of every length's parameters and state.
fn run(cfg: &LayerwiseConfig) -> u64 {
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let mut all = Vec::new();
    for n in [1, 37, 1000, NORM_BLOCK_ELEMS + 333, 3 * NORM_BLOCK_ELEMS + 7] {
        for decay in [true, false] {
            let mut p: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; if cfg.moments() == 2 { n } else { 0 }]);
            for step in 1..=3u64 {
                let scale = 10f32.powi(step as i32 - 2);
                let grads: Vec<f32> = (0..n).map(|_| scale * rng.random_range(-1.0..1.0)).collect();
                layerwise_reference(cfg, &mut p, &mut m, &mut v, &grads, ParamCopy::None, step, 0.5, decay);
            }
            all.push(digest(p.iter().chain(&m).chain(&v).map(|x| x.to_bits())));
        }
    }
    digest(all.iter().flat_map(|h| [*h as u32, (*h >> 32) as u32]))
}

#[test]
fn lamb_and_lars_bits_are_those_before_the_vector_passes() {
    let lamb = LayerwiseConfig {
        lr: 1e-2,
        weight_decay: 0.01,
        rule: Rule::Lamb { beta1: 0.9, beta2: 0.999, eps: 1e-6 },
        variance_frozen_after: None,
    };
    let lars = LayerwiseConfig {
        lr: 0.1,
        weight_decay: 1e-4,
        rule: Rule::Lars { momentum: 0.9, trust_coefficient: 1e-3 },
        variance_frozen_after: None,
    };
    let (lamb_digest, lars_digest) = (run(&lamb), run(&lars));
    println!("lamb {lamb_digest:#018x} lars {lars_digest:#018x}");
    assert_eq!((lamb_digest, lars_digest), (LAMB_DIGEST, LARS_DIGEST));
}

const LAMB_DIGEST: u64 = 0xc144_a36c_6e45_c528;
const LARS_DIGEST: u64 = 0x62f7_f612_c4e8_1b0f;
