//! AdamW with bf16 moments (`--adam-state bf16`): the fast path against the reference, bit for bit,
//! however the slice is cut; the stochastic rounding keeps the moments moving where nearest-even would
//! stall them; and the parameters stay near the fp32-moment run's.

use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zerostream_offload::adam::{AdamConfig, AdamW, Grads, Isa, MomentNoise, Moments, ParamCopy, adamw_reference_moments};

fn random(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

struct State {
    p: Vec<f32>,
    m: Vec<bf16>,
    v: Vec<bf16>,
    copy: Vec<bf16>,
}

impl State {
    fn new(n: usize) -> Self {
        State { p: random(1, n, 1.0), m: vec![bf16::ZERO; n], v: vec![bf16::ZERO; n], copy: vec![bf16::ZERO; n] }
    }
    fn bits(&self) -> (Vec<u32>, Vec<u16>, Vec<u16>, Vec<u16>) {
        let b = |x: &[bf16]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        (self.p.iter().map(|x| x.to_bits()).collect(), b(&self.m), b(&self.v), b(&self.copy))
    }
}

/// Step `step` of group 3 over elements `range` of the state (the group's elements from `base` on),
/// with f32 or bf16 gradients, through `adam` or the reference.
fn step_range(adam: Option<&AdamW>, s: &mut State, range: std::ops::Range<usize>, base: usize, step: u64, bf16_grads: bool) {
    let n = s.p.len();
    let g32 = random(step + 10, n, 4.0);
    let g16: Vec<bf16> = g32.iter().map(|x| bf16::from_f32(*x)).collect();
    let grads = if bf16_grads { Grads::Bf16(&g16[range.clone()]) } else { Grads::F32(&g32[range.clone()]) };
    let noise = MomentNoise::new(42, step, 3, base + range.start);
    let moments = Moments::Bf16 { m: &mut s.m[range.clone()], v: &mut s.v[range.clone()], noise };
    let (p, copy) = (&mut s.p[range.clone()], ParamCopy::Bf16(&mut s.copy[range]));
    match adam {
        Some(a) => a.step_moments(p, moments, grads, copy, step, 0.37, step != 2),
        None => adamw_reference_moments(p, moments, grads, copy, &AdamConfig::default(), step, 0.37, step != 2),
    }
}

#[test]
fn bf16_moments_are_bit_identical_to_the_reference_for_any_threads_chunks_and_instruction_set() {
    for (n, bf16_grads) in [(1, false), (100_003, true), (70_001, false)] {
        let mut reference = State::new(n);
        for step in 1..=3 {
            step_range(None, &mut reference, 0..n, 0, step, bf16_grads);
        }
        assert!(reference.m.iter().any(|x| x.to_f32() != 0.0), "the moments moved");
        for isa in Isa::available() {
            for (threads, chunk) in [(1, 1), (2, 7), (2, 4096), (3, 65536), (2, 1 << 20)] {
                let adam = AdamW::with_isa(AdamConfig::default(), threads, chunk, isa);
                let mut s = State::new(n);
                for step in 1..=3 {
                    step_range(Some(&adam), &mut s, 0..n, 0, step, bf16_grads);
                }
                assert!(s.bits() == reference.bits(), "n={n}: {isa:?} with {threads} threads, chunks of {chunk} differ from the reference");
            }
        }
    }
}

/// A rank updates its slice of a group with the noise of the slice's place in the group, so cutting
/// the group between ranks anywhere gives the whole group's bits: the world size changes nothing.
#[test]
fn a_group_cut_into_slices_rounds_as_the_whole_group() {
    let n = 50_000;
    let adam = AdamW::new(AdamConfig::default(), 2, 4096);
    let mut whole = State::new(n);
    for step in 1..=3 {
        step_range(Some(&adam), &mut whole, 0..n, 0, step, false);
    }
    for cuts in [vec![0, 1, n], vec![0, 12_345, 30_000, n], vec![0, 4096, n]] {
        let mut sliced = State::new(n);
        for step in 1..=3 {
            for w in cuts.windows(2) {
                step_range(Some(&adam), &mut sliced, w[0]..w[1], 0, step, false);
            }
        }
        assert!(sliced.bits() == whole.bits(), "cut at {cuts:?}");
    }
    // The noise follows the element's place in the group: the same slice elsewhere rounds otherwise.
    let mut moved = State::new(n);
    step_range(Some(&adam), &mut moved, 0..n, 1000, 1, false);
    let mut first = State::new(n);
    step_range(Some(&adam), &mut first, 0..n, 0, 1, false);
    assert!(moved.m != first.m && moved.p == first.p, "the parameters use the unrounded moments; only the stored ones differ");
}

/// With zero gradients each moment decays by its beta every step: 0.1% a step for the second, a
/// quarter of bf16's ulp, so nearest-even would keep it at 1.0 for ever. Rounded stochastically, it
/// follows beta2^t on average, as the fp32 moment does.
#[test]
fn stochastic_rounding_lets_the_second_moment_decay_where_nearest_even_would_stall() {
    let n = 4096;
    let cfg = AdamConfig { beta2: 0.999, weight_decay: 0.0, ..AdamConfig::default() };
    let adam = AdamW::new(cfg, 2, 1000);
    let (mut p, mut m, mut v) = (vec![0.0f32; n], vec![bf16::ONE; n], vec![bf16::ONE; n]);
    let steps = 1000u64;
    let zeros = vec![0.0f32; n];
    for step in 1..=steps {
        let moments = Moments::Bf16 { m: &mut m, v: &mut v, noise: MomentNoise::new(0, step, 0, 0) };
        adam.step_moments(&mut p, moments, Grads::F32(&zeros), ParamCopy::None, step, 1.0, false);
    }
    let mean_v = v.iter().map(|x| x.to_f32() as f64).sum::<f64>() / n as f64;
    let want = 0.999f64.powi(steps as i32);
    assert!((mean_v / want - 1.0).abs() < 0.02, "mean v {mean_v}, fp32 would hold {want}");
    // Nearest-even really would stall: 0.999 rounds back to 1.0 in bf16.
    assert_eq!(bf16::from_f32(0.999), bf16::ONE);
}

/// 50 steps of random gradients: bf16 moments move the parameters nearly as fp32 moments do (the
/// step uses this step's unrounded moments; only what is carried to the next step is rounded).
#[test]
fn parameters_stay_near_the_fp32_moment_run() {
    let n = 20_000;
    let cfg = AdamConfig { lr: 1e-3, ..AdamConfig::default() };
    let adam = AdamW::new(cfg, 2, 4096);
    let p0 = random(1, n, 1.0);
    let (mut p32, mut m32, mut v32) = (p0.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let (mut p16, mut m16, mut v16) = (p0.clone(), vec![bf16::ZERO; n], vec![bf16::ZERO; n]);
    for step in 1..=50u64 {
        // Gradients with a persistent direction plus noise, as training has.
        let g: Vec<f32> = random(100 + step, n, 1.0).iter().zip(&p0).map(|(r, p)| 0.5 * p + r).collect();
        adam.step(&mut p32, &mut m32, &mut v32, Grads::F32(&g), ParamCopy::None, step, 1.0, true);
        let moments = Moments::Bf16 { m: &mut m16, v: &mut v16, noise: MomentNoise::new(7, step, 0, 0) };
        adam.step_moments(&mut p16, moments, Grads::F32(&g), ParamCopy::None, step, 1.0, true);
    }
    // Each step moves a parameter by about lr; 50 of them by about 0.05. bf16 moments carry 0.4%
    // relative error per step, averaging out: the paths differ by well under a step.
    let moved: f64 = p32.iter().zip(&p0).map(|(a, b)| ((a - b) as f64).abs()).sum::<f64>() / n as f64;
    let apart: f64 = p32.iter().zip(&p16).map(|(a, b)| ((a - b) as f64).abs()).sum::<f64>() / n as f64;
    assert!(moved > 0.01, "the parameters moved {moved}");
    assert!(apart < 0.02 * moved, "bf16 moments put the parameters {apart} from fp32's (which moved {moved})");
}
