//! The fast attention against the twins on seeded random inputs at sizes that are multiples of no block
//! (multi-head, grouped-query, dropout, a non-default scale), and its bits on 1, 2 and 3 threads.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::ops::attention as twin;
use crate::ops::dropout::DropoutMask;

fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.5..1.5)).collect()
}

struct Run {
    out: Vec<f32>,
    lse: Vec<f32>,
    dqkv: Vec<f32>,
    delta: Vec<f32>,
}

type Forward = fn(&mut [f32], &mut [f32], &[f32], AttentionDims);
type Backward = fn(&mut [f32], &mut [f32], &[f32], &[f32], &[f32], &[f32], AttentionDims);

fn run(qkv: &[f32], dout: &[f32], d: AttentionDims, forward: Forward, backward: Backward) -> Run {
    let rows = d.batch * d.seq_len;
    let (mut out, mut lse) = (vec![0.0; rows * d.out_width()], vec![0.0; d.stat_len()]);
    forward(&mut out, &mut lse, qkv, d);
    // NaN, so a gradient left unwritten shows.
    let (mut dqkv, mut delta) = (vec![f32::NAN; rows * d.qkv_width()], vec![0.0; d.stat_len()]);
    backward(&mut dqkv, &mut delta, dout, qkv, &out, &lse, d);
    Run { out, lse, dqkv, delta }
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 2e-5 * (1.0 + w.abs()), "{what}[{i}]: fast {g} vs twin {w}");
    }
}

fn shapes() -> Vec<(&'static str, AttentionDims)> {
    let mask = DropoutMask::new(0.25, 0x1234_5678_9abc).expect("a dropout mask");
    vec![
        ("mha B2 T1 H3 D5", AttentionDims::mha(2, 1, 15, 3)),
        ("mha B2 T63 H2 D16", AttentionDims::mha(2, 63, 32, 2)),
        ("mha B1 T65 H3 D7", AttentionDims::mha(1, 65, 21, 3)),
        ("mha B3 T130 H2 D64", AttentionDims::mha(3, 130, 128, 2)),
        ("gqa B2 T129 H6 G2 D12", AttentionDims::gqa(2, 129, 6, 2, 12)),
        ("gqa B1 T70 H4 G1 D9 scale 1", AttentionDims::gqa(1, 70, 4, 1, 9).with_scale(1.0)),
        ("mha dropout B2 T67 H2 D8", AttentionDims::mha(2, 67, 16, 2).with_dropout(Some(mask))),
        ("gqa dropout B1 T150 H4 G2 D6", AttentionDims::gqa(1, 150, 4, 2, 6).with_dropout(Some(mask))),
    ]
}

#[test]
fn fast_attention_matches_twin() {
    for (seed, (tag, d)) in shapes().into_iter().enumerate() {
        let qkv = random(seed as u64 * 2, d.batch * d.seq_len * d.qkv_width());
        let dout = random(seed as u64 * 2 + 1, d.batch * d.seq_len * d.out_width());
        let want = run(&qkv, &dout, d, twin::attention_forward, twin::attention_backward);
        let got = run(&qkv, &dout, d, attention_forward, attention_backward);
        assert_close(&format!("{tag}: out"), &got.out, &want.out);
        assert_close(&format!("{tag}: lse"), &got.lse, &want.lse);
        assert_close(&format!("{tag}: delta"), &got.delta, &want.delta);
        assert_close(&format!("{tag}: dqkv"), &got.dqkv, &want.dqkv);
    }
}

#[test]
fn fast_attention_bits_do_not_depend_on_threads() {
    let (tag, d) = shapes().pop().expect("a shape");
    let d = AttentionDims { batch: 3, ..d };
    let qkv = random(11, d.batch * d.seq_len * d.qkv_width());
    let dout = random(12, d.batch * d.seq_len * d.out_width());
    let bits = || {
        let r = run(&qkv, &dout, d, attention_forward, attention_backward);
        [r.out, r.lse, r.dqkv, r.delta].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>())
    };
    let first = bits();
    assert!(first == bits(), "{tag}: two calls differ");
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
        assert!(first == pool.install(bits), "{tag}: {threads} threads differ from the global pool");
    }
}
