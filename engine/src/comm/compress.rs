//! Compressed gradient exchange (`--grad-compression`, and `--param-compression` for the working
//! copy's all-gather): the codecs that turn a slice of f32 values into bytes for the wire and back,
//! and the error feedback that keeps training on course (what a codec drops from a gradient slice is
//! added into the next gradient sent for that slice, so nothing is lost, only delayed: 1-bit SGD,
//! Seide et al. 2014; error-feedback SGD, Karimireddy et al. 2019).
//!
//! Each codec's output has a size fixed by the slice's length alone, so the exchange stays one
//! all-to-all of equal chunks; encoding and decoding are pure functions of their input, so every rank
//! and both transports decode the same values and the rank-order sum stays deterministic.

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};

/// How gradients cross between ranks in the reduce-scatter.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum GradCompression {
    /// f32, exactly (4 bytes per element).
    #[default]
    None,
    /// Rounded to bfloat16, to nearest even (2 bytes per element).
    Bf16,
    /// Per chunk: a scale max|x|/127 and each element rounded to the nearest of -127..=127 steps of it
    /// (1 byte per element plus 4 per chunk).
    Int8,
    /// Per chunk: mean|x| and each element's sign (1 bit per element plus 4 bytes per chunk).
    OneBit,
    /// The largest-magnitude fraction F of each piece, as (index, value) pairs (8 bytes per pair; ties
    /// go to the lower index).
    TopK(f32),
}

impl FromStr for GradCompression {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "none" => GradCompression::None,
            "bf16" => GradCompression::Bf16,
            "int8" => GradCompression::Int8,
            "onebit" => GradCompression::OneBit,
            _ => match s.strip_prefix("topk:") {
                Some(f) => match f.parse::<f32>() {
                    Ok(f) if f > 0.0 && f <= 1.0 => GradCompression::TopK(f),
                    _ => bail!("--grad-compression {s}: topk's fraction must be a number in (0, 1], e.g. topk:0.01"),
                },
                None => bail!("--grad-compression {s}: expected none, bf16, int8, onebit or topk:F (F in (0, 1], e.g. topk:0.01)"),
            },
        })
    }
}

impl fmt::Display for GradCompression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GradCompression::None => write!(f, "none"),
            GradCompression::Bf16 => write!(f, "bf16"),
            GradCompression::Int8 => write!(f, "int8"),
            GradCompression::OneBit => write!(f, "onebit"),
            GradCompression::TopK(fraction) => write!(f, "topk:{fraction}"),
        }
    }
}

/// Elements per scale of `int8` and `onebit` unless `--grad-compression-chunk` says otherwise: a
/// scale's 4 bytes add an eighth to a 1-bit chunk (28.4x fewer bytes than f32, not 32x), and in
/// exchange a chunk spans few rows of a matrix, so rows of very different size (an embedding's rare
/// and common tokens) share a scale less often. Measured (benches/results/2026-11-26-grad-compression.md):
/// onebit's loss after 300 steps of a small GPT-2 was 32% above `none`'s with 2048 and 3.3% with 256.
pub const DEFAULT_CHUNK_ELEMS: usize = 256;

/// How the working copy crosses between ranks in its all-gather (`--param-compression`, ZeRO++'s
/// quantised weights): each rank encodes its slice and every rank, this one included, uses the decoded
/// values for every slice, so the ranks' working copies stay identical. The master weights stay exact;
/// no error feedback is needed (each update re-encodes the new weights).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ParamCompression {
    /// The working copy's own words (`--precision`), exactly.
    #[default]
    None,
    /// Rounded to bfloat16 (the same as none with a bf16 working copy).
    Bf16,
    /// A scale max|x|/127 per [`PARAM_CHUNK_ELEMS`] elements and a byte per element.
    Int8,
}

/// Elements per scale of `--param-compression int8`.
pub const PARAM_CHUNK_ELEMS: usize = 256;

impl ParamCompression {
    /// The codec the all-gather encodes slices with (None: the words as they are).
    pub fn codec(self) -> Option<Codec> {
        let mode = match self {
            ParamCompression::None => return None,
            ParamCompression::Bf16 => GradCompression::Bf16,
            ParamCompression::Int8 => GradCompression::Int8,
        };
        Some(Codec { mode, chunk_elems: PARAM_CHUNK_ELEMS })
    }
    /// As the flag takes it.
    pub fn name(self) -> &'static str {
        match self {
            ParamCompression::None => "none",
            ParamCompression::Bf16 => "bf16",
            ParamCompression::Int8 => "int8",
        }
    }
}

/// A compression mode with its chunk size: encodes a slice into [`Codec::encoded_bytes`] bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Codec {
    pub mode: GradCompression,
    /// Elements per scale (`int8`, `onebit`).
    pub chunk_elems: usize,
}

impl Codec {
    pub fn new(mode: GradCompression, chunk_elems: usize) -> Result<Self> {
        if chunk_elems == 0 {
            bail!("--grad-compression-chunk 0: a chunk needs at least one element");
        }
        Ok(Codec { mode, chunk_elems })
    }

    /// Pairs `topk` keeps of `n` elements: at least one of a non-empty slice.
    fn kept(fraction: f32, n: usize) -> usize {
        if n == 0 { 0 } else { ((fraction as f64 * n as f64).ceil() as usize).clamp(1, n) }
    }

    /// Bytes on the wire for a slice of `n` elements (a multiple of 4, so chunks stay word-aligned).
    pub fn encoded_bytes(&self, n: usize) -> usize {
        let chunks = n.div_ceil(self.chunk_elems);
        let bytes = match self.mode {
            GradCompression::None => 4 * n,
            GradCompression::Bf16 => 2 * n,
            GradCompression::Int8 => 4 * chunks + n,
            GradCompression::OneBit => 4 * chunks + n.div_ceil(8),
            GradCompression::TopK(f) => 8 * Self::kept(f, n),
        };
        bytes.next_multiple_of(4)
    }

    /// Writes `x` encoded into `out` (`encoded_bytes(x.len())` long).
    pub fn encode(&self, x: &[f32], out: &mut [u8]) {
        assert_eq!(out.len(), self.encoded_bytes(x.len()), "encode: output length");
        out.fill(0);
        match self.mode {
            GradCompression::None => out.copy_from_slice(bytemuck::cast_slice(x)),
            GradCompression::Bf16 => {
                for (o, v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
            GradCompression::Int8 => {
                let (scales, codes) = out.split_at_mut(4 * x.len().div_ceil(self.chunk_elems));
                for ((chunk, s), q) in x.chunks(self.chunk_elems).zip(scales.chunks_exact_mut(4)).zip(codes.chunks_mut(self.chunk_elems)) {
                    let scale = chunk.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    s.copy_from_slice(&scale.to_le_bytes());
                    for (q, v) in q.iter_mut().zip(chunk) {
                        let step = if scale > 0.0 { (v / scale).round().clamp(-127.0, 127.0) } else { 0.0 };
                        *q = step as i8 as u8;
                    }
                }
            }
            GradCompression::OneBit => {
                let (scales, signs) = out.split_at_mut(4 * x.len().div_ceil(self.chunk_elems));
                for (chunk, s) in x.chunks(self.chunk_elems).zip(scales.chunks_exact_mut(4)) {
                    let mean = (chunk.iter().map(|v| v.abs() as f64).sum::<f64>() / chunk.len() as f64) as f32;
                    s.copy_from_slice(&mean.to_le_bytes());
                }
                // Bit j of byte b: element 8b + j is >= 0 (the signs need no scale, so no chunks).
                for (byte, eight) in signs.iter_mut().zip(x.chunks(8)) {
                    *byte = eight.iter().enumerate().fold(0u8, |b, (j, v)| b | (((*v >= 0.0) as u8) << j));
                }
            }
            GradCompression::TopK(f) => {
                let mut order: Vec<u32> = (0..x.len() as u32).collect();
                let k = Self::kept(f, x.len());
                // Larger magnitude first, then lower index: a total order, so the choice is the same
                // everywhere.
                let by_size = |a: &u32, b: &u32| x[*b as usize].abs().total_cmp(&x[*a as usize].abs()).then(a.cmp(b));
                if k < order.len() {
                    order.select_nth_unstable_by(k - 1, by_size);
                }
                let kept = &mut order[..k];
                kept.sort_unstable();
                for (pair, &i) in out.chunks_exact_mut(8).zip(kept.iter()) {
                    pair[..4].copy_from_slice(&i.to_le_bytes());
                    pair[4..].copy_from_slice(&x[i as usize].to_le_bytes());
                }
            }
        }
    }

    /// Writes into `out` the values `bytes` (from [`Codec::encode`] of `out.len()` elements) stand for.
    pub fn decode(&self, bytes: &[u8], out: &mut [f32]) {
        assert_eq!(bytes.len(), self.encoded_bytes(out.len()), "decode: input length");
        let word = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        match self.mode {
            // Byte by byte: a receive buffer of bytes need not be aligned for f32.
            GradCompression::None => out.iter_mut().zip(bytes.chunks_exact(4)).for_each(|(o, b)| *o = word(b)),
            GradCompression::Bf16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                }
            }
            GradCompression::Int8 => {
                let (scales, codes) = bytes.split_at(4 * out.len().div_ceil(self.chunk_elems));
                for ((o, s), q) in out.chunks_mut(self.chunk_elems).zip(scales.chunks_exact(4)).zip(codes.chunks(self.chunk_elems)) {
                    let scale = word(s);
                    o.iter_mut().zip(q).for_each(|(o, &q)| *o = q as i8 as f32 * scale);
                }
            }
            GradCompression::OneBit => {
                let (scales, signs) = bytes.split_at(4 * out.len().div_ceil(self.chunk_elems));
                for (o, s) in out.chunks_mut(self.chunk_elems).zip(scales.chunks_exact(4)) {
                    o.fill(word(s));
                }
                for (eight, byte) in out.chunks_mut(8).zip(signs) {
                    for (j, o) in eight.iter_mut().enumerate() {
                        if byte >> j & 1 == 0 {
                            *o = -*o;
                        }
                    }
                }
            }
            GradCompression::TopK(_) => {
                out.fill(0.0);
                for pair in bytes.chunks_exact(8) {
                    let i = u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]) as usize;
                    out[i] = word(&pair[4..]);
                }
            }
        }
    }

    /// Error feedback around [`Codec::encode`]: `x + residual` is encoded into `out`, and `residual`
    /// becomes what the encoding dropped of it (`x + residual - decoded`), to be sent with the next
    /// gradient of the same slice. `scratch` holds the decoded values (`x.len()` long).
    pub fn encode_with_feedback(&self, x: &[f32], residual: &mut [f32], out: &mut [u8], scratch: &mut [f32]) {
        match self.mode {
            GradCompression::Int8 | GradCompression::OneBit => self.encode_with_feedback_by_chunk(x, residual, out, scratch),
            _ => {
                residual.iter_mut().zip(x).for_each(|(r, v)| *r += v);
                self.encode(residual, out);
                self.decode(out, scratch);
                residual.iter_mut().zip(scratch.iter()).for_each(|(r, d)| *r -= d);
            }
        }
    }

    /// [`Codec::encode_with_feedback`] for the chunked codecs in one pass over memory: each chunk is
    /// summed, encoded, decoded into `scratch` and subtracted while it is in cache, with the very
    /// operations of `encode` and `decode` (the same bits; `tests::fused_feedback_equals_the_three_passes`).
    fn encode_with_feedback_by_chunk(&self, x: &[f32], residual: &mut [f32], out: &mut [u8], scratch: &mut [f32]) {
        assert_eq!(out.len(), self.encoded_bytes(x.len()), "encode: output length");
        out.fill(0);
        let ce = self.chunk_elems;
        let (scales, payload) = out.split_at_mut(4 * x.len().div_ceil(ce));
        let chunks = residual.chunks_mut(ce).zip(x.chunks(ce)).zip(scratch.chunks_mut(ce)).zip(scales.chunks_exact_mut(4));
        for (c, (((r, x), d), s)) in chunks.enumerate() {
            r.iter_mut().zip(x).for_each(|(r, v)| *r += v);
            match self.mode {
                GradCompression::Int8 => {
                    let scale = r.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    s.copy_from_slice(&scale.to_le_bytes());
                    for ((q, r), d) in payload[c * ce..c * ce + r.len()].iter_mut().zip(r.iter_mut()).zip(d.iter_mut()) {
                        let step = if scale > 0.0 { (*r / scale).round().clamp(-127.0, 127.0) } else { 0.0 };
                        *q = step as i8 as u8;
                        *d = (step as i8) as f32 * scale;
                        *r -= *d;
                    }
                }
                _ => {
                    let mean = (r.iter().map(|v| v.abs() as f64).sum::<f64>() / r.len() as f64) as f32;
                    s.copy_from_slice(&mean.to_le_bytes());
                    // Sign bits are numbered from the slice's start: a chunk not a multiple of 8 long
                    // shares bytes with its neighbours, so bits are or-ed in.
                    for (j, (r, d)) in r.iter_mut().zip(d.iter_mut()).enumerate() {
                        let i = c * ce + j;
                        let positive = *r >= 0.0;
                        payload[i / 8] |= (positive as u8) << (i % 8);
                        *d = if positive { mean } else { -mean };
                        *r -= *d;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn modes_parse_print_and_refuse_by_name() {
        for m in MODES {
            assert_eq!(m.to_string().parse::<GradCompression>().unwrap(), m);
        }
        assert_eq!("topk:1".parse::<GradCompression>().unwrap(), GradCompression::TopK(1.0));
        for bad in ["zip", "topk", "topk:0", "topk:1.5", "topk:-0.1", "topk:x", "int4"] {
            let err = bad.parse::<GradCompression>().unwrap_err().to_string();
            assert!(err.contains("--grad-compression") && err.contains(bad), "{bad}: {err}");
        }
        assert!(Codec::new(GradCompression::Int8, 0).is_err());
    }

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

    /// The one-pass error feedback of the chunked codecs gives the bits of encode, decode and subtract.
    #[test]
    fn fused_feedback_equals_the_three_passes() {
        for mode in [GradCompression::Int8, GradCompression::OneBit] {
            for (n, chunk) in [(1usize, 64usize), (100, 7), (1000, 256), (4099, 64), (513, 1)] {
                let codec = Codec::new(mode, chunk).unwrap();
                let (x, r0) = (random(n as u64 + 3, n), random(n as u64 + 5, n));
                let mut fused = (r0.clone(), vec![0u8; codec.encoded_bytes(n)], vec![0.0f32; n]);
                codec.encode_with_feedback(&x, &mut fused.0, &mut fused.1, &mut fused.2);
                let mut r = r0.clone();
                r.iter_mut().zip(&x).for_each(|(r, v)| *r += v);
                let mut bytes = vec![0u8; codec.encoded_bytes(n)];
                codec.encode(&r, &mut bytes);
                let mut d = vec![0.0f32; n];
                codec.decode(&bytes, &mut d);
                r.iter_mut().zip(&d).for_each(|(r, d)| *r -= d);
                assert_eq!(fused.1, bytes, "{mode} n={n} chunk={chunk}: bytes");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fused.0), bits(&r), "{mode} n={n} chunk={chunk}: residual");
                assert_eq!(bits(&fused.2), bits(&d), "{mode} n={n} chunk={chunk}: decoded");
            }
        }
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
                codec.encode_with_feedback(&g, &mut residual, &mut bytes, &mut decoded);
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
}
