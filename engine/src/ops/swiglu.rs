//! swiglu: Llama's gated MLP activation, fused: out (rows, F) = silu(gate) * up, with gate and up read
//! from one (rows, 2F) buffer laid out [gate | up] per row (the output of one matmul against the
//! concatenated gate and up projections), and its backward.
//!
//! silu(g) = g * sigmoid(g). The sigmoid is evaluated so that exp never overflows (`sigmoid.wgsl` is the
//! same), so a gate of -1e4 gives silu 0, not NaN.

use rayon::prelude::*;

/// 1 / (1 + exp(-g)), through exp(g) for negative g so that exp's argument is never positive. Twin of
/// `common/sigmoid.wgsl`.
fn sigmoid(g: f32) -> f32 {
    if g >= 0.0 {
        1.0 / (1.0 + (-g).exp())
    } else {
        let e = g.exp();
        e / (1.0 + e)
    }
}

/// out (rows, F) = silu(gate) * up, gate_up (rows, 2F) = [gate | up]. Twin of `swiglu_forward.wgsl`.
pub fn swiglu_forward(out: &mut [f32], gate_up: &[f32], rows: usize, hidden: usize) {
    let f = hidden;
    out[..rows * f].par_chunks_mut(f.max(1)).zip(gate_up.par_chunks(2 * f.max(1))).for_each(|(o, gu)| {
        let (gate, up) = gu.split_at(f);
        for j in 0..f {
            let g = gate[j];
            o[j] = g * sigmoid(g) * up[j];
        }
    });
}

/// d_gate_up (rows, 2F) = [dout * up * silu'(gate) | dout * silu(gate)], overwritten (not accumulated:
/// it is the gradient of a matmul's output, written once). silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g))).
/// Twin of `swiglu_backward.wgsl`.
pub fn swiglu_backward(d_gate_up: &mut [f32], dout: &[f32], gate_up: &[f32], rows: usize, hidden: usize) {
    let f = hidden;
    d_gate_up[..2 * rows * f].par_chunks_mut(2 * f.max(1)).zip(gate_up.par_chunks(2 * f.max(1))).enumerate().for_each(
        |(row, (dgu, gu))| {
            let (gate, up) = gu.split_at(f);
            let (d_gate, d_up) = dgu.split_at_mut(f);
            let dr = &dout[row * f..][..f];
            for j in 0..f {
                let (g, u, d) = (gate[j], up[j], dr[j]);
                let sig = sigmoid(g);
                d_gate[j] = d * u * sig * g.mul_add(1.0 - sig, 1.0);
                d_up[j] = d * (g * sig);
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forward_f64(gate_up: &[f64], rows: usize, f: usize) -> Vec<f64> {
        (0..rows * f)
            .map(|i| (i / f, i % f))
            .map(|(r, j)| (gate_up[r * 2 * f + j], gate_up[r * 2 * f + f + j]))
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect()
    }

    #[test]
    fn forward_matches_f64_and_backward_matches_finite_differences() {
        let (rows, f) = (3, 5);
        let gate_up: Vec<f32> = (0..rows * 2 * f).map(|i| ((i * 29 % 31) as f32 - 15.0) / 3.0).collect();
        let dout: Vec<f32> = (0..rows * f).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
        let gu64: Vec<f64> = gate_up.iter().map(|&v| v as f64).collect();

        let mut out = vec![0.0; rows * f];
        swiglu_forward(&mut out, &gate_up, rows, f);
        for (i, (&g, w)) in out.iter().zip(forward_f64(&gu64, rows, f)).enumerate() {
            assert!((g as f64 - w).abs() <= 1e-6 * (1.0 + w.abs()), "out[{i}]: {g} vs {w}");
        }

        // Garbage first: the backward overwrites.
        let mut d_gate_up = vec![7.0; rows * 2 * f];
        swiglu_backward(&mut d_gate_up, &dout, &gate_up, rows, f);
        let loss = |gu: &[f64]| -> f64 { forward_f64(gu, rows, f).iter().zip(&dout).map(|(o, &d)| o * d as f64).sum() };
        let h = 1e-6;
        for i in 0..rows * 2 * f {
            let (mut plus, mut minus) = (gu64.clone(), gu64.clone());
            plus[i] += h;
            minus[i] -= h;
            let want = (loss(&plus) - loss(&minus)) / (2.0 * h);
            assert!((d_gate_up[i] as f64 - want).abs() < 1e-4 * (1.0 + want.abs()), "d_gate_up[{i}]: {} vs {want}", d_gate_up[i]);
        }
    }

    #[test]
    fn large_gates_saturate_without_nan() {
        let gate_up = [-1e4, -200.0, 100.0, 1e4, 1.0, 1.0, 1.0, 1.0];
        let mut out = [0.0; 4];
        swiglu_forward(&mut out, &gate_up, 1, 4);
        assert_eq!(out.map(|v| v.abs()), [0.0, 0.0, 100.0, 1e4]);
        let mut d = [0.0; 8];
        swiglu_backward(&mut d, &[1.0; 4], &gate_up, 1, 4);
        // silu'(g) -> 0 for g -> -inf and 1 for g -> +inf; d_up = silu(g).
        assert_eq!(d.map(|v| v.abs()), [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 100.0, 1e4]);
    }
}
