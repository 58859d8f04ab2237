//! LAMB and LARS against PyTorch implementations of them, and the fast path against the reference.
//!
//! `tests/golden/layerwise.safetensors` was made by `engine/tests/golden/gen_layerwise_golden.py` (the
//! optimizers themselves in `layerwise_torch.py` beside it) with PyTorch 2.15: for lengths 1 to 20000,
//! initial parameters, 5 steps of gradients from 1e-3 to 10 in scale, and after the 5 steps each
//! rule's parameters and state, for a decayed-and-adapted tensor and an excluded one.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::SafeTensors;
use zerostream_offload::ParamCopy;
use zerostream_offload::adam::Isa;
use zerostream_offload::layerwise::{
    Layerwise, LayerwiseConfig, NORM_BLOCK_ELEMS, NORM_PIECE_ELEMS, NormSlots, Rule, SquaredNorms, layerwise_reference,
};

fn golden() -> Vec<u8> {
    std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/layerwise.safetensors")).expect("tests/golden/layerwise.safetensors")
}

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name)
        .unwrap_or_else(|_| panic!("golden tensor {name}"))
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The worst error of `got` against `want`, relative to `want`'s largest magnitude.
fn worst_error(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0.0f64, |a, w| a.max(w.abs() as f64)).max(1e-30);
    got.iter().zip(want).map(|(g, w)| (*g as f64 - *w as f64).abs()).fold(0.0, f64::max) / scale
}

fn configs(meta: &std::collections::HashMap<String, String>) -> [(&'static str, LayerwiseConfig); 2] {
    let get = |k: &str| meta[k].parse::<f64>().unwrap();
    let wd = get("wd");
    [
        (
            "lamb",
            LayerwiseConfig {
                lr: get("lamb_lr"),
                weight_decay: wd,
                rule: Rule::Lamb { beta1: get("beta1"), beta2: get("beta2"), eps: get("eps") },
                variance_frozen_after: None,
            },
        ),
        (
            "lars",
            LayerwiseConfig {
                lr: get("lars_lr"),
                weight_decay: wd,
                rule: Rule::Lars { momentum: get("momentum"), trust_coefficient: get("trust_coefficient") },
                variance_frozen_after: None,
            },
        ),
    ]
}

/// Runs `steps` steps of `cfg` over one whole tensor with the fast path's two passes.
fn run_fast(opt: &Layerwise, p: &mut [f32], m: &mut [f32], v: &mut [f32], grads: &[f32], steps: usize, decay: bool) {
    let n = p.len();
    for s in 0..steps {
        let g = &grads[s * n..(s + 1) * n];
        let norms = opt.measure(p, m, v, g, s as u64 + 1, 1.0, decay, 0).total();
        let trust = opt.trust_ratio(norms, decay);
        opt.apply(p, m, v, g, ParamCopy::None, s as u64 + 1, 1.0, decay, trust);
    }
}

#[test]
fn matches_pytorch_lamb_and_lars_at_every_length() {
    let bytes = golden();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta: std::collections::HashMap<String, String> = header.metadata().clone().expect("metadata").into_iter().collect();
    let steps: usize = meta["steps"].parse().unwrap();
    let mut worst = [0.0f64; 3];
    for (rule, cfg) in configs(&meta) {
        for threads in [1, 2] {
            let opt = Layerwise::new(cfg, threads);
            for n in meta["sizes"].split(',').map(|s| s.parse::<usize>().unwrap()) {
                let grads = f32s(&st, &format!("n{n}.grads"));
                for (kind, decay) in [("decay", true), ("nodecay", false)] {
                    let key = format!("n{n}.{rule}.{kind}");
                    let mut p = f32s(&st, &format!("n{n}.p0"));
                    let mut m = vec![0.0; n];
                    let mut v = if rule == "lamb" { vec![0.0; n] } else { Vec::new() };
                    run_fast(&opt, &mut p, &mut m, &mut v, &grads, steps, decay);
                    // fp32 against fp32: the norms differ in how they are summed (f64 blocks here,
                    // PyTorch's f32 reduction there), so the trust ratios, and every step, differ by
                    // about an f32 rounding; 1e-6 of the tensor's largest magnitude is that, with room.
                    let errs = [
                        worst_error(&p, &f32s(&st, &format!("{key}.p"))),
                        worst_error(&m, &f32s(&st, &format!("{key}.m"))),
                        if rule == "lamb" { worst_error(&v, &f32s(&st, &format!("{key}.v"))) } else { 0.0 },
                    ];
                    for (what, (err, w)) in ["p", "m", "v"].iter().zip(errs.iter().zip(worst.iter_mut())) {
                        assert!(*err < 1e-6, "{key}.{what} ({threads} threads): worst error {err:.2e} of its largest magnitude");
                        *w = w.max(*err);
                    }
                }
            }
        }
    }
    println!(
        "worst error against PyTorch (of each tensor's largest magnitude): p {:.2e}, m {:.2e}, v {:.2e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn fast_path_is_bit_identical_to_the_reference_for_any_thread_count_and_instruction_set() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let rules = [Rule::Lamb { beta1: 0.9, beta2: 0.99, eps: 1e-8 }, Rule::Lars { momentum: 0.9, trust_coefficient: 0.01 }];
    for rule in rules {
        let cfg = LayerwiseConfig { lr: 0.01, weight_decay: 0.1, rule, variance_frozen_after: None };
        for n in [1, 5, NORM_BLOCK_ELEMS - 1, NORM_BLOCK_ELEMS + 3, 3 * NORM_BLOCK_ELEMS + 77] {
            let p0: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let grads: Vec<Vec<f32>> = (0..3).map(|_| (0..n).map(|_| rng.random_range(-0.1..0.1)).collect()).collect();
            let v_len = if cfg.moments() == 2 { n } else { 0 };
            let decay = n % 2 == 1;
            let (mut p, mut m, mut v) = (p0.clone(), vec![0.0; n], vec![0.0; v_len]);
            let mut copy = vec![half::bf16::ZERO; n];
            for (s, g) in grads.iter().enumerate() {
                layerwise_reference(&cfg, &mut p, &mut m, &mut v, g, ParamCopy::Bf16(&mut copy), s as u64 + 1, 0.5, decay);
            }
            for (threads, isa) in [1, 2, 3].into_iter().flat_map(|t| Isa::available().into_iter().map(move |i| (t, i))) {
                let opt = Layerwise::with_isa(cfg, threads, isa);
                let (mut fp, mut fm, mut fv) = (p0.clone(), vec![0.0; n], vec![0.0; v_len]);
                let mut fcopy = vec![half::bf16::ZERO; n];
                for (s, g) in grads.iter().enumerate() {
                    let norms = opt.measure(&fp, &mut fm, &mut fv, g, s as u64 + 1, 0.5, decay, 0).total();
                    let trust = opt.trust_ratio(norms, decay);
                    opt.apply(&mut fp, &mut fm, &fv, g, ParamCopy::Bf16(&mut fcopy), s as u64 + 1, 0.5, decay, trust);
                }
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fp), bits(&p), "{rule:?} n={n} threads={threads} {isa:?}: p");
                assert_eq!(bits(&fm), bits(&m), "{rule:?} n={n} threads={threads} {isa:?}: m");
                assert_eq!(bits(&fv), bits(&v), "{rule:?} n={n} threads={threads} {isa:?}: v");
                assert_eq!(fcopy, copy, "{rule:?} n={n} threads={threads} {isa:?}: the bf16 copy");
                assert!(fcopy.iter().zip(&fp).all(|(c, x)| *c == half::bf16::from_f32(*x)), "the copy is the parameters rounded");
            }
        }
    }
}

#[test]
fn trust_ratio_follows_each_papers_formula_and_falls_back_to_one() {
    let lamb = LayerwiseConfig {
        lr: 1.0,
        weight_decay: 0.1,
        rule: Rule::Lamb { beta1: 0.9, beta2: 0.99, eps: 1e-8 },
        variance_frozen_after: None,
    };
    let lars = LayerwiseConfig {
        lr: 1.0,
        weight_decay: 0.5,
        rule: Rule::Lars { momentum: 0.9, trust_coefficient: 0.01 },
        variance_frozen_after: None,
    };
    let norms = SquaredNorms { param: 9.0, update: 4.0 }; // |p| = 3, |u| = 2
    let opt = |c| Layerwise::new(c, 1);
    assert_eq!(opt(lamb).trust_ratio(norms, true), 1.5);
    assert_eq!(opt(lars).trust_ratio(norms, true), 0.01 * 3.0 / (2.0 + 0.5 * 3.0));
    for c in [lamb, lars] {
        assert_eq!(opt(c).trust_ratio(norms, false), 1.0, "no adaptation without decay");
        assert_eq!(opt(c).trust_ratio(SquaredNorms { param: 0.0, update: 4.0 }, true), 1.0, "zero weights");
        assert_eq!(opt(c).trust_ratio(SquaredNorms { param: 9.0, update: 0.0 }, true), 1.0, "zero step");
    }
}

/// What the trainer relies on across ranks: each rank measures its slice of a group's tensors, the
/// slices are put together through `NormSlots`, and every tensor's norms have the bits one rank
/// measuring the whole group gets, whatever the slices' length (any multiple of a piece) and however
/// the tensors sit in the group. LAMB's moments are the same too.
#[test]
fn norms_of_slices_put_together_have_the_bits_of_the_whole_tensors() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    // A group of three tensors at awkward offsets: one block and a bit, a short one, three blocks.
    let lens = [NORM_BLOCK_ELEMS + 1000, 37, 3 * NORM_BLOCK_ELEMS + 5];
    let mut tensors = Vec::new();
    for len in lens {
        let start = tensors.last().map_or(0, |t: &std::ops::Range<usize>| t.end);
        tensors.push(start..start + len);
    }
    let n = tensors.last().unwrap().end;
    let p: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let g: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    for rule in [Rule::Lamb { beta1: 0.9, beta2: 0.99, eps: 1e-8 }, Rule::Lars { momentum: 0.9, trust_coefficient: 0.001 }] {
        let opt = Layerwise::new(LayerwiseConfig { lr: 0.1, weight_decay: 0.01, rule, variance_frozen_after: None }, 2);
        let lamb = opt.config.moments() == 2;
        // (norms, m, v) with slices of `slice_len` (one slice: the whole group).
        let measured = |slice_len: usize| {
            let slots = NormSlots::new(&tensors, slice_len);
            let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; if lamb { n } else { 0 }]);
            let mut summed = vec![0.0f64; slots.values()];
            for owned in (0..n.next_multiple_of(slice_len)).step_by(slice_len).map(|s| s..s + slice_len) {
                let mut mine = vec![0.0f64; slots.values()];
                for (t, range) in tensors.iter().enumerate() {
                    let r = range.start.max(owned.start)..range.end.min(owned.end);
                    if r.is_empty() {
                        continue;
                    }
                    let vr = if lamb { r.clone() } else { 0..0 };
                    let part = opt.measure(&p[r.clone()], &mut m[r.clone()], &mut v[vr], &g[r.clone()], 1, 1.0, true, r.start);
                    slots.fill(t, &part, &mut mine);
                }
                summed.iter_mut().zip(&mine).for_each(|(s, x)| *s += x);
            }
            (slots.totals(&summed), m, v)
        };
        let whole = measured(n.next_multiple_of(NORM_PIECE_ELEMS));
        let exact_p: f64 = p[tensors[2].clone()].iter().map(|&x| (x as f64) * (x as f64)).sum();
        assert!((whole.0[2].param - exact_p).abs() <= 1e-12 * exact_p, "{} vs {exact_p}", whole.0[2].param);
        for slice_len in [64, 640, NORM_BLOCK_ELEMS - 64, NORM_BLOCK_ELEMS, NORM_BLOCK_ELEMS + 128, 2 * NORM_BLOCK_ELEMS + 64 * 7] {
            let sliced = measured(slice_len);
            for (t, (a, b)) in sliced.0.iter().zip(&whole.0).enumerate() {
                assert_eq!(
                    (a.param.to_bits(), a.update.to_bits()),
                    (b.param.to_bits(), b.update.to_bits()),
                    "{rule:?} {slice_len}: tensor {t}"
                );
            }
            assert!(sliced.1 == whole.1 && sliced.2 == whole.2, "{rule:?} {slice_len}: the moments");
        }
    }
}

/// LAMB with the variance frozen past step 1 (1-bit LAMB): v keeps its bits, m and p go on, and the
/// fast path still equals the reference bit for bit.
#[test]
fn lamb_with_a_frozen_variance_keeps_its_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let cfg = LayerwiseConfig {
        lr: 0.01,
        weight_decay: 0.1,
        rule: Rule::Lamb { beta1: 0.9, beta2: 0.99, eps: 1e-8 },
        variance_frozen_after: Some(1),
    };
    let n = NORM_BLOCK_ELEMS + 3;
    let p0: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let (mut p, mut m, mut v) = (p0.clone(), vec![0.0; n], vec![0.0; n]);
    let (mut fp, mut fm, mut fv) = (p0, vec![0.0; n], vec![0.0; n]);
    let opt = Layerwise::new(cfg, 2);
    let mut v_at_freeze = Vec::new();
    for step in 1..=3 {
        let g: Vec<f32> = (0..n).map(|_| rng.random_range(-0.1..0.1)).collect();
        let m_before = m.clone();
        layerwise_reference(&cfg, &mut p, &mut m, &mut v, &g, ParamCopy::None, step, 1.0, true);
        let norms = opt.measure(&fp, &mut fm, &mut fv, &g, step, 1.0, true, 0).total();
        opt.apply(&mut fp, &mut fm, &fv, &g, ParamCopy::None, step, 1.0, true, opt.trust_ratio(norms, true));
        assert!((&fp, &fm, &fv) == (&p, &m, &v), "step {step}: the fast path differs from the reference");
        if step == 1 {
            v_at_freeze = v.clone();
        } else {
            assert!(v == v_at_freeze && m != m_before, "step {step}: v changed, or m stood still");
        }
    }
}
