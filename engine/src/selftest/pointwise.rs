//! The elementwise ops' checks: the MLP activations forward and backward, RoPE, dropout (the masks bit
//! for bit), residual, axpy, fill, the sum of squares, and the widening of 16-bit uploads.

use anyhow::Result;

use super::{Check, CheckResult, Size, Tolerance, halves, random, upload};
use crate::device::{Activation, Backend, DropoutMask, HalfFormat};
use crate::ops::{dropout, elementwise, rope};

/// Sizes of the elementwise checks: single elements, a workgroup's edges, past one pass of the grid.
fn sizes(size: Size) -> &'static [usize] {
    size.pick(&[1, 63, 65, 4097, 40_000], &[1, 63, 65, 4097])
}

/// Each activation forward and backward (into a non-zero dx: it accumulates), at awkward sizes, and
/// where tanh and erfc saturate, exp underflows, and at 0 (ReLU's kink).
pub fn check_activations<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    let tolerance = Tolerance::close(1e-5, 1e-5);
    let edges = [-1e4, -30.0, -9.0, -0.0, 0.0, 1e-30, 9.0, 30.0, 1e4];
    let mut inputs: Vec<(String, Vec<f32>)> = sizes(size).iter().map(|&n| (n.to_string(), random(n as u64, n, 4.0))).collect();
    inputs.push(("at the edges".into(), edges.to_vec()));
    let mut results = Vec::new();
    for (f, name) in [(Activation::GeluTanh, "gelu_tanh"), (Activation::GeluErf, "gelu_erf"), (Activation::Relu, "relu")] {
        let mut fwd = Check::new(&format!("{name}_forward"), tolerance);
        for (tag, x) in &inputs {
            let out = dev.alloc(x.len(), "selftest")?;
            dev.activation_forward(f, &out, &upload(dev, x)?);
            let mut want = vec![0.0; x.len()];
            f.forward(&mut want, x);
            fwd.compare(tag, &dev.read(&out), &want);
        }
        results.push(fwd.finish());
        let mut bwd = Check::new(&format!("{name}_backward"), tolerance);
        for (i, (tag, x)) in inputs.iter().enumerate() {
            let (dout, mut dx) = (random(i as u64 + 50, x.len(), 3.0), random(i as u64 + 60, x.len(), 3.0));
            let tdx = upload(dev, &dx)?;
            dev.activation_backward(f, &tdx, &upload(dev, x)?, &upload(dev, &dout)?);
            f.backward(&mut dx, x, &dout);
            bwd.compare(tag, &dev.read(&tdx), &dx);
        }
        results.push(bwd.finish());
    }
    Ok(results)
}

/// Llama's inverse frequencies theta^(-2i/D), in f32 as transformers computes them.
fn inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect()
}

/// RoPE on packed [q | k | v] rows: q and k rotated in one call, then k alone at its column offset
/// rotated back (the backward's direction); an odd number of heads, D 128 with Llama 3's theta, 4097
/// positions (angles in the thousands of radians). Then `rope_at`: rows at absolute positions.
pub fn check_rope<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    // Both sides reduce angles exactly (ops/rope.rs), so thousands of radians cost no accuracy.
    let tolerance = Tolerance::close(1e-6, 1e-6);
    let mut check = Check::new("rope", tolerance);
    let all = [(1, 1, 1, 1, 12, 1e4), (3, 21, 5, 1, 12, 1e4), (1, 65, 3, 2, 64, 1e4), (2, 7, 3, 1, 128, 5e5), (1, 4097, 1, 1, 12, 1e4)];
    for &(batch, seq, h, kv, d, theta) in &all[..size.pick(5, 4)] {
        let (rows, stride) = (batch * seq, (h + 2 * kv) * d);
        let tag = format!("B{batch} T{seq} H{h} G{kv} D{d}");
        let freq = inv_freq(d, theta);
        let mut x = random((rows * stride + d) as u64, rows * stride, 1.0);
        let (tx, tf) = (upload(dev, &x)?, upload(dev, &freq)?);
        dev.rope(&tx, &tf, seq, rows, stride, 0, h + kv, d, false);
        rope::rope(&mut x, &freq, seq, rows, stride, 0, h + kv, d, false);
        check.compare(&format!("q and k rotated {tag}"), &dev.read(&tx), &x);
        dev.rope(&tx, &tf, seq, rows, stride, h * d, kv, d, true);
        rope::rope(&mut x, &freq, seq, rows, stride, h * d, kv, d, true);
        check.compare(&format!("k rotated back {tag}"), &dev.read(&tx), &x);
    }
    let rope_result = check.finish();
    let mut at_check = Check::new("rope_at", tolerance);
    for (first, rows, h, kv, d) in [(0, 1, 1, 1, 12), (1234, 1, 5, 1, 12), (5000, 300, 3, 2, 64), (7, 9, 2, 1, 128)] {
        let stride = (h + 2 * kv) * d;
        let freq = inv_freq(d, 5e5);
        let mut x = random((rows * stride + first) as u64, rows * stride, 1.0);
        let (tx, tf) = (upload(dev, &x)?, upload(dev, &freq)?);
        dev.rope_at(&tx, &tf, first, rows, stride, 0, h + kv, d);
        rope::rope_at(&mut x, &freq, first, rows, stride, 0, h + kv, d);
        at_check.compare(&format!("rows {first}..{} H{h} G{kv} D{d}", first + rows), &dev.read(&tx), &x);
    }
    Ok(vec![rope_result, at_check.finish()])
}

/// dropout and dropout_residual at awkward sizes and widths and three rates. The masks are integer
/// hashes and a kept element is one product: dropout (of ones: the mask itself, and of x) is checked bit
/// for bit; dropout_residual within rounding (a GPU may fuse its multiply and add).
pub fn check_dropout<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    let all = [(1, 1), (63, 7), (65, 65), (4097, 768), (40_000, 3), (70_001, 1000)];
    let cases: Vec<(String, usize, usize, DropoutMask, u64)> = all[..size.pick(6, 4)]
        .iter()
        .enumerate()
        .map(|(i, &(n, cols))| {
            let p = [0.1, 0.5, 0.9][i % 3];
            (format!("{n}x{cols} p {p}"), n, cols, DropoutMask::new(p, 0x5eed_0000 + i as u64).expect("p > 0"), i as u64)
        })
        .collect();
    let mut bits = Check::new("dropout", Tolerance::Bits);
    for (tag, n, cols, mask, seed) in &cases {
        for (what, x) in [("mask", vec![1.0; *n]), ("x", random(*seed, *n, 3.0))] {
            let out = dev.alloc(*n, "selftest")?;
            dev.dropout(&out, &upload(dev, &x)?, *cols, mask);
            let mut want = vec![0.0; *n];
            dropout::dropout(&mut want, &x, *cols, mask);
            bits.compare(&format!("{what} {tag}"), &dev.read(&out), &want);
        }
    }
    let bits = bits.finish();
    let mut residual = Check::new("dropout_residual", Tolerance::close(1e-6, 1e-6));
    for (tag, n, cols, mask, seed) in &cases {
        let (x, r) = (random(*seed, *n, 3.0), random(seed + 100, *n, 3.0));
        let out = dev.alloc(*n, "selftest")?;
        dev.dropout_residual(&out, &upload(dev, &r)?, &upload(dev, &x)?, *cols, mask);
        let mut want = vec![0.0; *n];
        dropout::dropout_residual(&mut want, &r, &x, *cols, mask);
        residual.compare(tag, &dev.read(&out), &want);
    }
    Ok(vec![bits, residual.finish()])
}

/// residual_forward, axpy, fill (bit for bit) and sum_squares at awkward sizes.
pub fn check_elementwise<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    let tolerance = Tolerance::close(1e-5, 1e-5);
    let inputs = |n: usize| (random(n as u64, n, 3.0), random(n as u64 + 1, n, 3.0));
    let mut residual = Check::new("residual_forward", tolerance);
    for &n in sizes(size) {
        let ((x, y), t) = (inputs(n), dev.alloc(n, "selftest")?);
        dev.residual_forward(&t, &upload(dev, &x)?, &upload(dev, &y)?);
        let mut want = vec![0.0; n];
        elementwise::residual_forward(&mut want, &x, &y);
        residual.compare(&n.to_string(), &dev.read(&t), &want);
    }
    let mut results = vec![residual.finish()];
    let mut axpy = Check::new("axpy", tolerance);
    for &n in sizes(size) {
        let (x, mut y) = inputs(n);
        let t = upload(dev, &y)?;
        dev.axpy(&t, 0.5, &upload(dev, &x)?, -2.0);
        elementwise::axpy(&mut y, 0.5, &x, -2.0);
        axpy.compare(&n.to_string(), &dev.read(&t), &y);
    }
    results.push(axpy.finish());
    let mut fill = Check::new("fill", Tolerance::Bits);
    for &n in sizes(size) {
        let (mut x, _) = inputs(n);
        let t = upload(dev, &x)?;
        dev.fill(&t, 1.25);
        elementwise::fill(&mut x, 1.25);
        fill.compare(&n.to_string(), &dev.read(&t), &x);
    }
    results.push(fill.finish());
    let mut sum_squares = Check::new("sum_squares", tolerance);
    for &n in sizes(size) {
        let (x, _) = inputs(n);
        let got = dev.sum_squares(&upload(dev, &x)?) as f32;
        sum_squares.compare(&n.to_string(), &[got], &[elementwise::sum_squares(&x) as f32]);
    }
    results.push(sum_squares.finish());
    Ok(results)
}

/// 16-bit uploads widened to f32 (`Backend::write_16bit` into an f32 tensor: the gpu's
/// `cast_half_to_f32.wgsl`), f16 and bf16, bit for bit, with infinities, subnormals and signed zeros.
pub fn check_widening<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    let mut check = Check::new("cast_half_to_f32", Tolerance::Bits);
    for &n in sizes(size) {
        let mut x = random(n as u64 + 7, n, 100.0);
        let specials = [70000.0, -70000.0, 1e-8, -1e-7, -0.0, 1e-30, 65504.0, 2049.0];
        x.iter_mut().zip(specials).for_each(|(v, s)| *v = s);
        for format in [HalfFormat::F16, HalfFormat::Bf16] {
            let bits = halves(format, &x);
            let t = dev.alloc(n, "selftest")?;
            dev.write_16bit(&t, &bits, format)?;
            let mut want = vec![0.0; n];
            match format {
                HalfFormat::F16 => elementwise::cast_f16_to_f32(&mut want, &bits),
                HalfFormat::Bf16 => elementwise::cast_bf16_to_f32(&mut want, &bits),
            }
            check.compare(&format!("{format:?} {n}"), &dev.read(&t), &want);
        }
    }
    Ok(vec![check.finish()])
}
