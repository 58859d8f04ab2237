//! Tests of `codec`.

use super::*;

fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

const MODES: [GradCompression; 5] =
    [GradCompression::None, GradCompression::Bf16, GradCompression::Int8, GradCompression::OneBit, GradCompression::TopK(0.1)];

/// Each codec against what it promises, at lengths that leave partial chunks and bytes.
#[test]
fn each_codec_decodes_within_its_promise() {
    for n in [0usize, 1, 7, 9, 100, 2049, 5000] {
        let x = random(n as u64, n);
        for mode in MODES {
            let codec = Codec::new(mode, 64).unwrap();
            let mut bytes = vec![0u8; codec.encoded_bytes(n)];
            assert_eq!(bytes.len() % 4, 0);
            codec.encode(&x, &mut bytes);
            let mut y = vec![f32::NAN; n];
            codec.decode(&bytes, &mut y);
            for (c, (xs, ys)) in x.chunks(64).zip(y.chunks(64)).enumerate() {
                let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                let mean = xs.iter().map(|v| v.abs() as f64).sum::<f64>() as f32 / xs.len() as f32;
                for (v, d) in xs.iter().zip(ys) {
                    let ok = match mode {
                        GradCompression::None => d.to_bits() == v.to_bits(),
                        GradCompression::Bf16 => *d == half::bf16::from_f32(*v).to_f32(),
                        GradCompression::Int8 => (d - v).abs() <= max / 127.0 * 0.5 * 1.0001,
                        GradCompression::OneBit => (*d - mean.copysign(*v)).abs() <= mean * 1e-6,
                        GradCompression::TopK(_) => *d == 0.0 || d == v,
                    };
                    assert!(ok, "{mode} n={n} chunk {c}: {v} decoded as {d}");
                }
            }
            if let GradCompression::TopK(f) = mode {
                let kept: Vec<f32> = x.iter().zip(&y).filter(|(_, d)| **d != 0.0).map(|(v, _)| v.abs()).collect();
                assert_eq!(kept.len(), Codec::kept(f, n), "topk n={n}");
                let smallest_kept = kept.iter().fold(f32::INFINITY, |m, v| m.min(*v));
                let dropped_max = x.iter().zip(&y).filter(|(_, d)| **d == 0.0).fold(0f32, |m, (v, _)| m.max(v.abs()));
                assert!(dropped_max <= smallest_kept, "topk n={n}: dropped {dropped_max} above kept {smallest_kept}");
            }
        }
    }
}

/// topk keeps the first k of the order "magnitude down, then index up", with ties, -0.0, NaN and
/// infinities among the values.
#[test]
fn topk_keeps_the_largest_with_ties_to_the_lower_index() {
    for n in [1usize, 2, 17, 300, 4099] {
        // Few distinct magnitudes, so ties are common; both signs of each.
        let mut x: Vec<f32> = random(n as u64 + 11, n).iter().map(|v| (v * 2.0).round() / 2.0).collect();
        if n > 10 {
            (x[3], x[5], x[7], x[9]) = (-0.0, f32::NAN, f32::NEG_INFINITY, f32::INFINITY);
        }
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by(|a, b| x[*b as usize].abs().total_cmp(&x[*a as usize].abs()).then(a.cmp(b)));
        for k in [1, n / 3, n / 2, n.saturating_sub(1), n] {
            let mut want = order[..k].to_vec();
            want.sort_unstable();
            assert_eq!(topk_indices(&x, k), want, "n={n} k={k}");
        }
    }
}

/// Parallel runs of chunks change no bit: a slice many tasks long encodes to the concatenation of
/// its chunks encoded one at a time, and decodes back chunk by chunk, for chunk sizes that own
/// their bytes and (onebit) that share them.
#[test]
fn runs_of_chunks_give_the_bits_of_one_chunk_at_a_time() {
    for mode in [GradCompression::Int8, GradCompression::OneBit] {
        for ce in [8usize, 16, 24, 5] {
            let codec = Codec::new(mode, ce).unwrap();
            let n = 3 * CHUNKS_PER_TASK * ce + 13;
            let x = random(ce as u64, n);
            let mut bytes = vec![0u8; codec.encoded_bytes(n)];
            codec.encode(&x, &mut bytes);
            let chunks = n.div_ceil(ce);
            let (scales, payload) = bytes.split_at(4 * chunks);
            let mut decoded = vec![0.0f32; n];
            codec.decode(&bytes, &mut decoded);
            for (c, xc) in x.chunks(ce).enumerate() {
                let mut one = vec![0u8; codec.encoded_bytes(xc.len())];
                codec.encode(xc, &mut one);
                assert_eq!(&one[..4], &scales[4 * c..4 * c + 4], "{mode} ce={ce} chunk {c}: scale");
                let mut back = vec![0.0f32; xc.len()];
                codec.decode(&one, &mut back);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&back), bits(&decoded[c * ce..c * ce + xc.len()]), "{mode} ce={ce} chunk {c}: values");
                if mode == GradCompression::Int8 {
                    assert_eq!(&one[4..4 + xc.len()], &payload[c * ce..c * ce + xc.len()], "int8 ce={ce} chunk {c}: codes");
                }
            }
            // Every sign bit where the sequential rule puts it.
            if mode == GradCompression::OneBit {
                for (i, v) in x.iter().enumerate() {
                    assert_eq!(payload[i / 8] >> (i % 8) & 1 == 1, *v >= 0.0, "onebit ce={ce}: bit {i}");
                }
            }
        }
    }
}

/// The one-pass error feedback gives the bits of add, encode, decode and subtract, and
/// `decode_add` those of decode and add, for every codec.
#[test]
fn fused_passes_equal_the_separate_ones() {
    for mode in MODES {
        for (n, chunk) in [(1usize, 64usize), (100, 7), (1000, 256), (4099, 64), (513, 1), (40000, 16)] {
            let codec = Codec::new(mode, chunk).unwrap();
            let (x, r0) = (random(n as u64 + 3, n), random(n as u64 + 5, n));
            let mut fused = (r0.clone(), vec![0u8; codec.encoded_bytes(n)]);
            codec.encode_with_feedback(&x, &mut fused.0, &mut fused.1);
            let mut r = r0.clone();
            r.iter_mut().zip(&x).for_each(|(r, v)| *r += v);
            let mut bytes = vec![0u8; codec.encoded_bytes(n)];
            codec.encode(&r, &mut bytes);
            let mut d = vec![0.0f32; n];
            codec.decode(&bytes, &mut d);
            r.iter_mut().zip(&d).for_each(|(r, d)| *r -= d);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(fused.1, bytes, "{mode} n={n} chunk={chunk}: bytes");
            assert_eq!(bits(&fused.0), bits(&r), "{mode} n={n} chunk={chunk}: residual");
            // decode_add onto values that include -0.0, which a separate `+= 0.0` would turn to +0.0.
            let mut sum = random(n as u64 + 7, n);
            sum.iter_mut().step_by(5).for_each(|v| *v = -0.0);
            let mut separate = sum.clone();
            separate.iter_mut().zip(&d).for_each(|(s, d)| *s += d);
            codec.decode_add(&bytes, &mut sum);
            assert_eq!(bits(&sum), bits(&separate), "{mode} n={n} chunk={chunk}: decode_add");
        }
    }
}

/// topk's decode_add where the values sent include -0.0 (fewer non-zeros than pairs kept) and land
/// on -0.0: the bits of a decoded copy added element by element.
#[test]
fn topk_decode_add_keeps_the_bits_of_negative_zeros() {
    let codec = Codec::new(GradCompression::TopK(0.5), 64).unwrap();
    let n = 40;
    let mut x = vec![0.0f32; n];
    x.iter_mut().step_by(3).for_each(|v| *v = -0.0);
    x[7] = 2.0;
    let mut bytes = vec![0u8; codec.encoded_bytes(n)];
    codec.encode(&x, &mut bytes);
    let mut decoded = vec![1.0f32; n];
    codec.decode(&bytes, &mut decoded);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(decoded.iter().any(|v| v.to_bits() == (-0.0f32).to_bits()), "a -0.0 is sent: {decoded:?}");
    let mut sum: Vec<f32> = (0..n).map(|i| if i % 2 == 0 { -0.0 } else { i as f32 }).collect();
    let mut separate = sum.clone();
    separate.iter_mut().zip(&decoded).for_each(|(s, d)| *s += d);
    codec.decode_add(&bytes, &mut sum);
    assert_eq!(bits(&sum), bits(&separate));
    assert!(sum.iter().any(|v| v.to_bits() == (-0.0f32).to_bits()), "-0.0 + -0.0 stays -0.0");
}

/// Error feedback loses nothing: over many steps, the decoded values sent plus the residual left
/// equal the gradients given, up to f32 rounding.
#[test]
fn error_feedback_sends_everything_eventually() {
    let n = 300;
    for mode in MODES {
        let codec = Codec::new(mode, 32).unwrap();
        let (mut residual, mut sent_sum, mut given_sum) = (vec![0f32; n], vec![0f64; n], vec![0f64; n]);
        let mut bytes = vec![0u8; codec.encoded_bytes(n)];
        let mut decoded = vec![0f32; n];
        for step in 0..50 {
            let g = random(step, n);
            codec.encode_with_feedback(&g, &mut residual, &mut bytes);
            codec.decode(&bytes, &mut decoded);
            for i in 0..n {
                sent_sum[i] += decoded[i] as f64;
                given_sum[i] += g[i] as f64;
            }
        }
        for i in 0..n {
            let gap = (sent_sum[i] + residual[i] as f64 - given_sum[i]).abs();
            assert!(gap < 1e-3, "{mode}: element {i} lost {gap}");
        }
    }
}
