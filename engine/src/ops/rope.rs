//! rope: rotary position embedding as transformers' Llama applies it (the rotate-half convention), in
//! place on a window of a packed activation.
//!
//! x is (rows, row_stride) with rows = B*T; row r is position t = r % T. The rotated heads are the `heads`
//! blocks of head_dim D starting at column `col_offset` (for Llama's packed (B, T, (H + 2*KV) * D) buffer
//! [q | k | v], col_offset 0 and heads H + KV rotate q and k in one call). Within a head, element i < D/2
//! pairs with i + D/2: `angle = f32(t) * inv_freq[i]` (an f32 product, as transformers computes its
//! frequencies in float32), (a, b) -> (a cos - b sin, b cos + a sin). `inverse` rotates by -angle, which is
//! RoPE's backward applied to the gradient. inv_freq (D/2) is the caller's, so rope scaling is too.
//!
//! sin and cos come from [`sincos`], not the platform's: WGSL bounds the error of its sin and cos only
//! inside [-pi, pi] (by 2^-11), while angles reach thousands of radians. `sincos` reduces the angle
//! against pi/2 split into pieces whose products with the quadrant are exact, then evaluates Cephes'
//! single-precision polynomials; `rope.wgsl` does the same operations. The reduction is exact whether
//! or not a driver fuses fma (lavapipe does not), so the twin and the kernel differ by an ulp or so.

use rayon::prelude::*;
use std::f32::consts::FRAC_2_PI;

/// pi/2 = PIO2_1 + ... + PIO2_4 + PIO2_TAIL (to about 70 bits). The first four are 6-bit integers times
/// 2^-5, 2^-11, 2^-17, 2^-23, so their products with any quadrant below 2^18 are exact in f32.
const PIO2_1: f32 = 1.5625;
const PIO2_2: f32 = 7.812_5e-3;
const PIO2_3: f32 = 4.806_518_6e-4;
const PIO2_4: f32 = 3.099_441_5e-6;
/// The rest of pi/2, rounded to f32 (bits 0x33a22169).
const PIO2_TAIL: f32 = 7.549_79e-8;
/// Cephes `sinf`: sin(r) ~ r + r^3 (S1 + S2 r^2 + S3 r^4) for |r| <= pi/4.
const SIN_COEFFS: [f32; 3] = [-1.666_665_5e-1, 8.332_161e-3, -1.951_529_6e-4];
/// Cephes `cosf`: cos(r) ~ 1 - r^2/2 + r^4 (C1 + C2 r^2 + C3 r^4) for |r| <= pi/4.
const COS_COEFFS: [f32; 3] = [4.166_664_6e-2, -1.388_731_6e-3, 2.443_315_7e-5];

/// (sin(angle), cos(angle)) within about 1.5 ulp for |angle| < 2^18 * pi/2 (411,774 radians: position
/// 400,000 at inverse frequency 1); past that the reduction is no longer exact. Twin of `sincos` in
/// `rope.wgsl`.
pub fn sincos(angle: f32) -> (f32, f32) {
    // Quadrant j and r = angle - j * pi/2 in about [-pi/4, pi/4]. The first four steps are exact: each
    // product is, and each difference is a multiple of the finer of angle's ulp and the piece's unit, below
    // 2^24 of them. Only the tail rounds (by at most half an ulp of r).
    let j = (angle * FRAC_2_PI).round_ties_even();
    let r = angle - j * PIO2_1;
    let r = r - j * PIO2_2;
    let r = r - j * PIO2_3;
    let r = r - j * PIO2_4;
    let r = (-j).mul_add(PIO2_TAIL, r);
    let z = r * r;
    let [s1, s2, s3] = SIN_COEFFS;
    let [c1, c2, c3] = COS_COEFFS;
    let sin = (s3.mul_add(z, s2).mul_add(z, s1) * z).mul_add(r, r);
    let cos = (c3.mul_add(z, c2).mul_add(z, c1) * z).mul_add(z, (-0.5f32).mul_add(z, 1.0));
    match (j as i32) & 3 {
        0 => (sin, cos),
        1 => (cos, -sin),
        2 => (-sin, -cos),
        _ => (-cos, sin),
    }
}

/// Rotates `heads` heads of head_dim at `col_offset` of each row of x (rows, row_stride) in place; row r
/// is position r % rows_per_seq; `inverse` rotates back. Twin of `rope.wgsl`.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &mut [f32],
    inv_freq: &[f32],
    rows_per_seq: usize,
    rows: usize,
    row_stride: usize,
    col_offset: usize,
    heads: usize,
    head_dim: usize,
    inverse: bool,
) {
    assert!(rows == 0 || rows_per_seq > 0, "rope: rows_per_seq is 0");
    rotate(x, inv_freq, |row| row % rows_per_seq, rows, row_stride, col_offset, heads, head_dim, inverse);
}

/// [`rope`] forward, with row r at position `first_position + r` (no wrap): the new rows of a generation
/// step with a KV cache. Twin of `rope.wgsl` dispatched with `first_row` = `first_position`.
#[allow(clippy::too_many_arguments)]
pub fn rope_at(
    x: &mut [f32],
    inv_freq: &[f32],
    first_position: usize,
    rows: usize,
    row_stride: usize,
    col_offset: usize,
    heads: usize,
    head_dim: usize,
) {
    rotate(x, inv_freq, |row| first_position + row, rows, row_stride, col_offset, heads, head_dim, false);
}

#[allow(clippy::too_many_arguments)]
fn rotate(
    x: &mut [f32],
    inv_freq: &[f32],
    position: impl Fn(usize) -> usize + Sync,
    rows: usize,
    row_stride: usize,
    col_offset: usize,
    heads: usize,
    head_dim: usize,
    inverse: bool,
) {
    let half = head_dim / 2;
    assert!(head_dim.is_multiple_of(2), "rope: head_dim {head_dim} is odd");
    assert!(inv_freq.len() >= half, "rope: {} inverse frequencies for head_dim {head_dim}", inv_freq.len());
    assert!(col_offset + heads * head_dim <= row_stride, "rope: heads past the end of a row of {row_stride}");
    assert!(rows * row_stride <= x.len(), "rope: x holds fewer than {rows} rows of {row_stride}");
    if rows == 0 || heads * half == 0 {
        return;
    }
    x[..rows * row_stride].par_chunks_mut(row_stride).enumerate().for_each(|(row, xr)| {
        let t = position(row) as f32;
        for (i, &freq) in inv_freq[..half].iter().enumerate() {
            let (sin, cos) = sincos(t * freq);
            let sin = if inverse { -sin } else { sin };
            for h in 0..heads {
                let lo = col_offset + h * head_dim + i;
                let (a, b) = (xr[lo], xr[lo + half]);
                xr[lo] = a.mul_add(cos, -(b * sin));
                xr[lo + half] = b.mul_add(cos, a * sin);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::f32::consts::FRAC_PI_2;

    /// Llama's default inverse frequencies, theta^(-2i/D), in f32 as transformers computes them.
    fn inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
        (0..head_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect()
    }

    #[test]
    fn constants_are_the_f32_values_the_kernel_spells_out() {
        let pieces = [PIO2_1, PIO2_2, PIO2_3, PIO2_4, PIO2_TAIL].map(f32::to_bits);
        assert_eq!(pieces, [0x3fc8_0000, 0x3c00_0000, 0x39fc_0000, 0x3650_0000, 0x33a2_2169]);
        assert_eq!(SIN_COEFFS.map(f32::to_bits), [0xbe2a_aaa3, 0x3c08_839e, 0xb94c_a1f9]);
        assert_eq!(COS_COEFFS.map(f32::to_bits), [0x3d2a_aaa5, 0xbab6_061a, 0x37cc_f5ce]);
    }

    #[test]
    fn sincos_is_accurate_far_from_zero() {
        // Every position up to 2^18 times a few of Llama's frequencies, against f64 sin and cos of the same f32.
        let freqs = [1.0f32, 1.5, 0.1, 1e-3];
        let mut worst = 0.0f64;
        for t in 0..(1 << 18) {
            for f in freqs {
                let angle = t as f32 * f;
                let (s, c) = sincos(angle);
                let a = angle as f64;
                worst = worst.max((s as f64 - a.sin()).abs()).max((c as f64 - a.cos()).abs());
            }
        }
        assert!(worst < 1.2e-7, "worst error {worst}"); // 2 ulp of values near 1; measured 9.1e-8
    }

    #[test]
    fn matches_an_f64_rotation_and_inverse_undoes_it() {
        // Two sequences of 5 positions, rows of [q (3 heads) | k (1) | v (1)] with head_dim 12; rotate q and k.
        let (batch, seq, d, stride) = (2, 5, 12, 5 * 12);
        let rows = batch * seq;
        let freqs = inv_freq(d, 10_000.0);
        let x: Vec<f32> = (0..rows * stride).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let mut y = x.clone();
        rope(&mut y, &freqs, seq, rows, stride, 0, 4, d, false);
        for row in 0..rows {
            let t = (row % seq) as f64;
            for col in 0..stride {
                let (h, i) = (col / d, col % d);
                let want = if h >= 4 {
                    x[row * stride + col] as f64 // v is untouched
                } else {
                    let k = i % (d / 2);
                    let angle = (t as f32 * freqs[k]) as f64;
                    let (a, b) = (x[row * stride + h * d + k] as f64, x[row * stride + h * d + k + d / 2] as f64);
                    if i < d / 2 { a * angle.cos() - b * angle.sin() } else { b * angle.cos() + a * angle.sin() }
                };
                let got = y[row * stride + col] as f64;
                assert!((got - want).abs() < 1e-6, "row {row} col {col}: {got} vs {want}");
            }
        }
        rope(&mut y, &freqs, seq, rows, stride, 0, 4, d, true);
        for (i, (a, b)) in y.iter().zip(&x).enumerate() {
            assert!((a - b).abs() <= 1e-6, "inverse(rope(x))[{i}] = {a}, x = {b}");
        }
    }

    #[test]
    fn position_zero_and_a_hand_computed_quarter_turn() {
        // head_dim 4: pairs (0, 2) and (1, 3). Position 1 with inv_freq [pi/2, 0]: the first pair turns a
        // quarter, (a, b) -> (-b, a); the second does not move.
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0];
        rope(&mut x, &[FRAC_PI_2, 0.0], 2, 2, 4, 0, 1, 4, false);
        let want = [1.0, 2.0, 3.0, 4.0, -3.0, 2.0, 1.0, 4.0];
        for (g, w) in x.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{x:?}");
        }
    }
}
