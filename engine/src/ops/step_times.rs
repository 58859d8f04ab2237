//! The `cpu` device's ops at the shapes of one GPT-2 124M fp32 training step (B = 4, T = 256), each timed
//! as its twin and as its fast kernel where it has one, alternately so that the machine's load hits both,
//! the best of a few repetitions, times how often the op runs in a step: where a step's time goes.
//! Run: `cargo test --release -p zerostream --lib step_times -- --ignored --nocapture`.

use std::time::Instant;

use rand::{Rng, SeedableRng};

use super::matmul::{MatmulShape, Operand};
use super::*;

fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// The best of `reps` runs of `f`, in seconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

struct Table {
    rows: Vec<(String, f64, Option<f64>)>,
}

impl Table {
    /// Records op `name`, run `count` times a step: its twin's seconds, and the fast kernel's if any.
    fn add(&mut self, name: &str, count: usize, twin: f64, fast: Option<f64>) {
        let (t, f) = (twin * count as f64, fast.map(|f| f * count as f64));
        println!(
            "{name:34} x{count:3}: twin {t:7.3} s/step{}",
            f.map(|f| format!(", fast {f:7.3} s/step ({:.1}x)", t / f)).unwrap_or_default()
        );
        self.rows.push((name.to_string(), t, f));
    }
}

/// The linear layers' products (forward, dX with B^T, dW with A^T of each), as `model::gpt2` issues them.
fn time_matmuls(table: &mut Table, bt: usize, c: usize, v: usize, layers: usize, reps: usize) {
    let rm = MatmulShape::row_major;
    let linears = [
        ("qkv", c, 3 * c, layers),
        ("attn proj", c, c, layers),
        ("fc", c, 4 * c, layers),
        ("fc proj", 4 * c, c, layers),
        ("head", c, v, 1),
    ];
    for (name, k_in, n_out, count) in linears {
        let products = [
            ("fwd", rm(bt, n_out, k_in)),
            ("dX", MatmulShape { b: Operand::transposed(k_in), ..rm(bt, k_in, n_out) }),
            ("dW", MatmulShape { a: Operand::transposed(k_in), ..rm(k_in, n_out, bt) }),
        ];
        for (what, s) in products {
            let a = random(s.a.span(0..s.m, 0..s.k).end, 1);
            let bm = random(s.b.span(0..s.k, 0..s.n).end, 2);
            let mut out = vec![0.0f32; s.m * s.n];
            let (mut twin, mut fast) = (f64::MAX, f64::MAX);
            for _ in 0..reps {
                twin = twin.min(best(1, || matmul::matmul(&mut out, &a, &bm, None, &s, false)));
                fast = fast.min(best(1, || matmul_fast::matmul(&mut out, &a, &bm, None, &s, false)));
            }
            table.add(&format!("matmul {name} {what} {}x{}x{}", s.m, s.n, s.k), count, twin, Some(fast));
        }
    }
}

#[test]
#[ignore = "a measurement, not a check"]
fn step_times() {
    let (b, t, c, v, layers, heads) = (4, 256, 768, 50257, 12, 12);
    let bt = b * t;
    let reps = 3;
    let mut table = Table { rows: Vec::new() };
    time_matmuls(&mut table, bt, c, v, layers, reps);
    let d = attention::AttentionDims::mha(b, t, c, heads);
    let qkv = random(bt * 3 * c, 3);
    let dout = random(bt * c, 4);
    let (mut out, mut lse, mut dqkv, mut delta) =
        (vec![0.0; bt * c], vec![0.0; d.stat_len()], vec![0.0; bt * 3 * c], vec![0.0; d.stat_len()]);
    let twin = best(reps, || attention::attention_forward(&mut out, &mut lse, &qkv, d));
    let fast = best(reps, || attention_fast::attention_forward(&mut out, &mut lse, &qkv, d));
    table.add("attention fwd", layers, twin, Some(fast));
    let twin = best(1, || attention::attention_backward(&mut dqkv, &mut delta, &dout, &qkv, &out, &lse, d));
    let fast = best(reps, || attention_fast::attention_backward(&mut dqkv, &mut delta, &dout, &qkv, &out, &lse, d));
    table.add("attention bwd", layers, twin, Some(fast));

    let x = random(bt * 4 * c, 5);
    let g = random(bt * 4 * c, 6);
    let mut y = vec![0.0; bt * 4 * c];
    let twin = best(reps, || gelu::gelu_forward(&mut y, &x));
    let fast = best(reps, || gelu_fast::gelu_forward(&mut y, &x));
    table.add("gelu fwd (B T 4C)", layers, twin, Some(fast));
    let twin = best(reps, || gelu::gelu_backward(&mut y, &x, &g));
    let fast = best(reps, || gelu_fast::gelu_backward(&mut y, &x, &g));
    table.add("gelu bwd", layers, twin, Some(fast));

    let logits = random(bt * v, 7);
    let targets: Vec<u32> = (0..bt as u32).map(|i| i * 7919 % v as u32).collect();
    let mut losses = vec![0.0; bt];
    let mut work = logits.clone();
    let twin = best(reps, || {
        work.copy_from_slice(&logits);
        crossentropy::crossentropy(&mut losses, &mut work, &targets, v, Some(1.0 / bt as f32))
    });
    let fast = best(reps, || {
        work.copy_from_slice(&logits);
        crossentropy_fast::crossentropy(&mut losses, &mut work, &targets, v, Some(1.0 / bt as f32))
    });
    let copy = best(reps, || work.copy_from_slice(&logits));
    table.add("crossentropy (B T V)", 1, twin - copy, Some(fast - copy));

    let (x, w, bias) = (random(bt * c, 8), random(c, 9), random(c, 10));
    let (mut o, mut mean, mut rstd) = (vec![0.0; bt * c], vec![0.0; bt], vec![0.0; bt]);
    let twin = best(reps, || layernorm::layernorm_forward(&mut o, &mut mean, &mut rstd, &x, &w, &bias, bt, c, 1e-5));
    table.add("layernorm fwd", 2 * layers + 1, twin, None);
    let (mut dx, mut dw, mut db) = (vec![0.0; bt * c], vec![0.0; c], vec![0.0; c]);
    let twin = best(reps, || layernorm::layernorm_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &mean, &rstd, bt, c));
    let fast = best(reps, || reduce_fast::layernorm_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &mean, &rstd, bt, c));
    table.add("layernorm bwd", 2 * layers + 1, twin, Some(fast));
    let twin = best(reps, || elementwise::residual_forward(&mut o, &x, &dout));
    table.add("residual fwd", 2 * layers, twin, None);
    // The four linear layers' biases per block: 3C + C + 4C + C columns, timed as one 9C-wide sum.
    let mut dbias = vec![0.0; 9 * c];
    let g9 = random(bt * 9 * c, 11);
    let twin = best(reps, || matmul::bias_backward(&mut dbias, &g9, bt, 9 * c));
    let fast = best(reps, || reduce_fast::bias_backward(&mut dbias, &g9, bt, 9 * c));
    table.add("bias bwd (3C + C + 4C + C)", layers, twin, Some(fast));

    let twin: f64 = table.rows.iter().map(|r| r.1).sum();
    let fast: f64 = table.rows.iter().map(|r| r.2.unwrap_or(r.1)).sum();
    let matmul_fast: f64 = table.rows.iter().filter(|r| r.0.starts_with("matmul")).map(|r| r.2.unwrap_or(r.1)).sum();
    println!("total: twins {twin:.3} s/step, cpu device {fast:.3} s/step, of which matmul {matmul_fast:.3} s");
}
