//! Llama's own kernels against their plain-Rust twins (the cpu device): RMSNorm forward and backward,
//! RoPE (over a sequence, and at absolute positions for generation) and SwiGLU forward and backward.
//! Each case also runs with one binding limited to 64 KiB, so the paths that split large tensors
//! into windows are exercised at sizes a test can afford.

#[macro_use]
mod common;

use common::kernel_check::{Outputs, tensor};
use common::random;
use zerostream::device::Backend;

// Llama's kernels: RMSNorm, RoPE, SwiGLU.

fn rmsnorm_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    // (rows, C): a single element, C below, just above and past one 256-lane sweep, 4097 rows (split
    // under 64 KiB bindings), and a C that wraps the lanes 16 times.
    for (rows, c) in [(1, 1), (63, 48), (65, 65), (4097, 128), (7, 257), (2, 4097)] {
        let seed = (rows * 10_000 + c) as u64 + 7;
        let (x, w) = (random(seed, rows * c, 2.0), random(seed + 1, c, 1.5));
        let (tx, tw) = (tensor(dev, &x), tensor(dev, &w));
        let (o, rstd) = (dev.alloc(rows * c, "o").unwrap(), dev.alloc(rows, "rstd").unwrap());
        dev.rmsnorm_forward(&o, &rstd, &tx, &tw, rows, c, 1e-5);
        out.push((format!("forward {rows}x{c}"), dev.read(&o)));
        out.push((format!("rstd {rows}x{c}"), dev.read(&rstd)));
        // Gradients start non-zero: the backward adds into them.
        let dout = tensor(dev, &random(seed + 2, rows * c, 1.0));
        let (dx, dw) = (tensor(dev, &random(seed + 3, rows * c, 1.0)), tensor(dev, &w));
        dev.rmsnorm_backward(&dx, &dw, &dout, &tx, &tw, &rstd, rows, c);
        out.push((format!("dx {rows}x{c}"), dev.read(&dx)));
        out.push((format!("dweight {rows}x{c}"), dev.read(&dw)));
    }
    out
}

#[test]
fn rmsnorm_matches_twin() {
    // dweight sums 4097 rows through partials near 30 in magnitude, and lavapipe splits fma into a
    // multiply and an add: up to 1.3e-5 apart (out, rstd and dx agree within 1e-6).
    check!("rmsnorm", rmsnorm_case, 5e-5, 1e-5);
}

/// Llama's default inverse frequencies theta^(-2i/D), in f32 as transformers computes them.
fn llama_inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect()
}

fn rope_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    // (batch, T, H query heads, KV heads, head_dim, theta) on rows [q | k | v] of (H + 2 KV) * D: one row;
    // 63 rows; an odd number (5) of heads rotated; D 128 with Llama 3's theta; 4097 positions (angles in
    // the thousands of radians, and pieces that start mid-sequence under 64 KiB bindings).
    for (batch, seq, h, kv, d, theta) in
        [(1, 1, 1, 1, 12, 1e4), (3, 21, 5, 1, 12, 1e4), (1, 65, 3, 2, 64, 1e4), (2, 7, 3, 1, 128, 5e5), (1, 4097, 1, 1, 12, 1e4)]
    {
        let (rows, stride) = (batch * seq, (h + 2 * kv) * d);
        let tag = format!("B{batch} T{seq} H{h} KV{kv} D{d}");
        let inv_freq = tensor(dev, &llama_inv_freq(d, theta));
        let x = tensor(dev, &random((rows * stride + d) as u64, rows * stride, 1.0));
        // q and k in one call, as the model rotates them.
        dev.rope(&x, &inv_freq, seq, rows, stride, 0, h + kv, d, false);
        out.push((format!("q and k rotated {tag}"), dev.read(&x)));
        // k alone, at a column offset, rotated back (the backward's direction).
        dev.rope(&x, &inv_freq, seq, rows, stride, h * d, kv, d, true);
        out.push((format!("k rotated back {tag}"), dev.read(&x)));
    }
    out
}

#[test]
fn rope_matches_twin() {
    // Both sides reduce angles exactly (ops/rope.rs), so thousands of radians cost no accuracy.
    check!("rope", rope_case, 1e-6, 1e-6);
}

/// RoPE at absolute positions (generation's new rows): one row far along, and a chunk of 300 rows from
/// position 5000, split into pieces under 64 KiB bindings.
fn rope_at_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for (first, rows, h, kv, d) in [(0, 1, 1, 1, 12), (1234, 1, 5, 1, 12), (5000, 300, 3, 2, 64), (7, 9, 2, 1, 128)] {
        let stride = (h + 2 * kv) * d;
        let inv_freq = tensor(dev, &llama_inv_freq(d, 5e5));
        let x = tensor(dev, &random((rows * stride + first) as u64, rows * stride, 1.0));
        dev.rope_at(&x, &inv_freq, first, rows, stride, 0, h + kv, d);
        out.push((format!("rows {first}..{} H{h} KV{kv} D{d}", first + rows), dev.read(&x)));
    }
    out
}

#[test]
fn rope_at_matches_twin() {
    check!("rope at", rope_at_case, 1e-6, 1e-6);
}

fn swiglu_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for (rows, f) in [(1, 1), (63, 48), (65, 65), (4097, 128), (5, 257)] {
        let seed = (rows * 1000 + f) as u64 + 11;
        let gate_up = tensor(dev, &random(seed, rows * 2 * f, 6.0));
        let o = dev.alloc(rows * f, "out").unwrap();
        dev.swiglu_forward(&o, &gate_up, rows, f);
        out.push((format!("forward {rows}x{f}"), dev.read(&o)));
        let dout = tensor(dev, &random(seed + 1, rows * f, 1.0));
        // Garbage first: the backward overwrites its output.
        let d_gate_up = tensor(dev, &random(seed + 2, rows * 2 * f, 100.0));
        dev.swiglu_backward(&d_gate_up, &dout, &gate_up, rows, f);
        out.push((format!("backward {rows}x{f}"), dev.read(&d_gate_up)));
    }
    // Large gates: the sigmoid must saturate without overflow or NaN.
    let gate_up = tensor(dev, &[-1e4, -200.0, -30.0, 30.0, 200.0, 1e4, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let o = dev.alloc(6, "out").unwrap();
    dev.swiglu_forward(&o, &gate_up, 1, 6);
    out.push(("forward saturated".into(), dev.read(&o)));
    let d_gate_up = dev.alloc(12, "d_gate_up").unwrap();
    dev.swiglu_backward(&d_gate_up, &tensor(dev, &[1.0; 6]), &gate_up, 1, 6);
    out.push(("backward saturated".into(), dev.read(&d_gate_up)));
    out
}

#[test]
fn swiglu_matches_twin() {
    check!("swiglu", swiglu_case, 1e-5, 1e-5);
}
