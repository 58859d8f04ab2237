//! The codecs behind `--grad-compression` and `--param-compression`: a slice of f32 values to bytes
//! for the wire and back, with the error feedback folded into the encoding pass.
//!
//! int8 and onebit work chunk by chunk (a scale per chunk), and every chunk's bytes depend on that
//! chunk alone, so runs of whole chunks are encoded and decoded on rayon's threads with the bits of
//! a sequential pass (`tests::runs_of_chunks_give_the_bits_of_one_chunk_at_a_time`).

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};
use rayon::prelude::*;

/// How gradients cross between ranks in the reduce-scatter.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum GradCompression {
    /// f32, exactly (4 bytes per element).
    #[default]
    None,
    /// Rounded to bfloat16, to nearest even (2 bytes per element).
    Bf16,
    /// Per chunk: a scale max|x|/127 and each element rounded to the nearest of -127..=127 steps of it,
    /// ties to even (1 byte per element plus 4 per chunk).
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

/// Chunks per parallel task of int8 and onebit: 16 Ki elements at the default chunk, enough that
/// rayon's scheduling is noise, few enough that a gradient group spreads over every thread.
const CHUNKS_PER_TASK: usize = 64;
// A run of onebit's chunks then starts on a whole byte of signs, whatever the chunk size.
const _: () = assert!(CHUNKS_PER_TASK.is_multiple_of(8));

/// Elements per parallel task of the element-wise codecs (none, bf16) and of topk's passes.
const ELEMS_PER_TASK: usize = 1 << 14;

/// What a decoded value does to the element it lands on: [`Codec::decode`], [`Codec::decode_add`],
/// and the error feedback's subtraction.
const SET: u8 = 0;
const ADD: u8 = 1;
const SUB: u8 = 2;

#[inline(always)]
fn apply<const OP: u8>(o: &mut f32, v: f32) {
    match OP {
        SET => *o = v,
        ADD => *o += v,
        _ => *o -= v,
    }
}

/// `y` rounded to the nearest integer in -127..=127 (ties to even; NaN, from an infinite value in
/// the chunk, to 0), without a call to libm's `roundf`, so the loop vectorises: adding 1.5 * 2^23
/// leaves the rounded integer in the sum's low mantissa bits (exact for |y| < 2^22).
#[inline(always)]
fn int8_step(y: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let y = if y.is_nan() { 0.0 } else { y.clamp(-127.0, 127.0) };
    ((y + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32) as i8
}

/// Sum of |x| in f64, over eight interleaved lanes added in a fixed order at the end: the same bits
/// on every machine, and a loop the compiler vectorises (one running sum would be a chain of
/// dependent adds).
#[inline(always)]
fn sum_abs(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut eights = x.chunks_exact(8);
    for e in &mut eights {
        for (l, v) in lanes.iter_mut().zip(e) {
            *l += v.abs() as f64;
        }
    }
    for (l, v) in lanes.iter_mut().zip(eights.remainder()) {
        *l += v.abs() as f64;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// The indices of the `k` largest magnitudes of `x`, in increasing order, ties going to the lower
/// index: the first `k` of the order "magnitude down, then index up", a total order, so the choice is
/// the same everywhere. Magnitudes are compared as bits (for non-negative floats, NaN included, the
/// bits order as `total_cmp` does). The k-th largest is found by a histogram of the magnitudes' top
/// bits (one parallel pass), then selection among the few in its bin; one more pass keeps everything
/// above it and the lowest-indexed of those equal to it.
fn topk_indices(x: &[f32], k: usize) -> Vec<u32> {
    const SHIFT: u32 = 16;
    const BINS: usize = 1 << (31 - SHIFT);
    if k == 0 {
        return Vec::new();
    }
    let magnitude = |v: &f32| v.to_bits() & 0x7fff_ffff;
    let histogram = x
        .par_chunks(ELEMS_PER_TASK)
        .fold(
            || vec![0usize; BINS],
            |mut h, c| {
                c.iter().for_each(|v| h[(magnitude(v) >> SHIFT) as usize] += 1);
                h
            },
        )
        .reduce(
            || vec![0usize; BINS],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                a
            },
        );
    // The bin of the k-th largest, and how many lie in the bins above it.
    let (mut bin, mut above) = (BINS - 1, 0);
    while above + histogram[bin] < k {
        above += histogram[bin];
        bin -= 1;
    }
    let mut candidates: Vec<u32> = x.par_iter().map(magnitude).filter(|m| (m >> SHIFT) as usize == bin).collect();
    let rank = candidates.len() - (k - above); // ascending position of the k-th largest
    let threshold = *candidates.select_nth_unstable(rank).1;
    let mut ties = k - above - candidates.iter().filter(|&&m| m > threshold).count();
    // Per task, in index order: the indices above the threshold, and those equal to it; then, in
    // task order, every index above and the ties while they last.
    let parts: Vec<(Vec<u32>, Vec<u32>)> = x
        .par_chunks(ELEMS_PER_TASK)
        .enumerate()
        .map(|(t, c)| {
            let (mut over, mut equal) = (Vec::new(), Vec::new());
            for (j, m) in c.iter().map(magnitude).enumerate() {
                let i = (t * ELEMS_PER_TASK + j) as u32;
                if m > threshold {
                    over.push(i);
                } else if m == threshold {
                    equal.push(i);
                }
            }
            (over, equal)
        })
        .collect();
    let mut kept = Vec::with_capacity(k);
    for (over, equal) in parts {
        let take = equal.len().min(ties);
        ties -= take;
        let start = kept.len();
        kept.extend(over);
        kept.extend_from_slice(&equal[..take]);
        kept[start..].sort_unstable();
    }
    kept
}

/// A little-endian f32 from bytes that need not be aligned (a receive buffer of bytes).
#[inline(always)]
fn word(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
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

    /// Elements in one run of chunks coded by one task.
    fn run_elems(&self) -> usize {
        CHUNKS_PER_TASK * self.chunk_elems
    }

    /// The int8 or onebit codes of a slice of `n` elements split into runs of [`CHUNKS_PER_TASK`]
    /// chunks: each run's scales and payload, which no other run touches (a run starts at a multiple
    /// of 64 elements, so on a byte of onebit's signs even where chunks share bytes).
    fn runs_mut<'a>(&self, out: &'a mut [u8], n: usize) -> impl IndexedParallelIterator<Item = (&'a mut [u8], &'a mut [u8])> {
        let (scales, payload) = out.split_at_mut(4 * n.div_ceil(self.chunk_elems));
        scales.par_chunks_mut(4 * CHUNKS_PER_TASK).zip(payload.par_chunks_mut(self.payload_bytes_per_run()))
    }

    /// [`Codec::runs_mut`] of received bytes.
    fn runs<'a>(&self, bytes: &'a [u8], n: usize) -> impl IndexedParallelIterator<Item = (&'a [u8], &'a [u8])> {
        let (scales, payload) = bytes.split_at(4 * n.div_ceil(self.chunk_elems));
        scales.par_chunks(4 * CHUNKS_PER_TASK).zip(payload.par_chunks(self.payload_bytes_per_run()))
    }

    fn payload_bytes_per_run(&self) -> usize {
        if self.mode == GradCompression::Int8 { self.run_elems() } else { self.run_elems() / 8 }
    }

    /// Writes `x` encoded into `out` (`encoded_bytes(x.len())` long).
    pub fn encode(&self, x: &[f32], out: &mut [u8]) {
        assert_eq!(out.len(), self.encoded_bytes(x.len()), "encode: output length");
        out.fill(0);
        match self.mode {
            GradCompression::None => out
                .par_chunks_mut(4 * ELEMS_PER_TASK)
                .zip(x.par_chunks(ELEMS_PER_TASK))
                .for_each(|(o, x)| o.copy_from_slice(bytemuck::cast_slice(x))),
            GradCompression::Bf16 => out.par_chunks_mut(2 * ELEMS_PER_TASK).zip(x.par_chunks(ELEMS_PER_TASK)).for_each(|(o, x)| {
                for (o, v) in o.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
                }
            }),
            GradCompression::Int8 | GradCompression::OneBit => {
                let n = x.len();
                self.runs_mut(out, n).zip(x.par_chunks(self.run_elems())).for_each(|((s, p), x)| self.encode_run(x, s, p))
            }
            GradCompression::TopK(f) => {
                let kept = topk_indices(x, Self::kept(f, x.len()));
                for (pair, &i) in out.chunks_exact_mut(8).zip(kept.iter()) {
                    pair[..4].copy_from_slice(&i.to_le_bytes());
                    pair[4..].copy_from_slice(&x[i as usize].to_le_bytes());
                }
            }
        }
    }

    /// Writes into `out` the values `bytes` (from [`Codec::encode`] of `out.len()` elements) stand for.
    pub fn decode(&self, bytes: &[u8], out: &mut [f32]) {
        self.decode_op::<SET>(bytes, out);
    }

    /// Adds into `out` the values `bytes` stand for: the bits of [`Codec::decode`] followed by an
    /// element-wise `+=`, without the decoded copy.
    pub fn decode_add(&self, bytes: &[u8], out: &mut [f32]) {
        self.decode_op::<ADD>(bytes, out);
    }

    fn decode_op<const OP: u8>(&self, bytes: &[u8], out: &mut [f32]) {
        assert_eq!(bytes.len(), self.encoded_bytes(out.len()), "decode: input length");
        match self.mode {
            GradCompression::None => out
                .par_chunks_mut(ELEMS_PER_TASK)
                .zip(bytes.par_chunks(4 * ELEMS_PER_TASK))
                .for_each(|(o, b)| o.iter_mut().zip(b.chunks_exact(4)).for_each(|(o, b)| apply::<OP>(o, word(b)))),
            GradCompression::Bf16 => out.par_chunks_mut(ELEMS_PER_TASK).zip(bytes.par_chunks(2 * ELEMS_PER_TASK)).for_each(|(o, b)| {
                for (o, b) in o.iter_mut().zip(b.chunks_exact(2)) {
                    apply::<OP>(o, half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32());
                }
            }),
            GradCompression::Int8 | GradCompression::OneBit => {
                let n = out.len();
                out.par_chunks_mut(self.run_elems()).zip(self.runs(bytes, n)).for_each(|(o, (s, p))| self.decode_run::<OP>(s, p, o))
            }
            GradCompression::TopK(_) => {
                let pairs = bytes.chunks_exact(8).map(|p| (u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize, word(&p[4..])));
                match OP {
                    // Subtracting the 0.0 of an element not sent leaves it as it is: only the pairs'.
                    SUB => pairs.for_each(|(i, v)| out[i] -= v),
                    SET => {
                        out.par_chunks_mut(ELEMS_PER_TASK).for_each(|o| o.fill(0.0));
                        pairs.for_each(|(i, v)| out[i] = v);
                    }
                    // An element not sent gets `+= 0.0` (which turns -0.0 into +0.0). The pairs go
                    // first; the `+= 0.0` pass over all then changes a sent element only where its sum
                    // is -0.0 (-0.0 + -0.0), which is put back: each element ends as after one `+=`.
                    _ => {
                        let mut negative_zeros = Vec::new();
                        for (i, v) in pairs {
                            out[i] += v;
                            if out[i].to_bits() == (-0.0f32).to_bits() {
                                negative_zeros.push(i);
                            }
                        }
                        out.par_chunks_mut(ELEMS_PER_TASK).for_each(|o| o.iter_mut().for_each(|o| *o += 0.0));
                        negative_zeros.into_iter().for_each(|i| out[i] = -0.0);
                    }
                }
            }
        }
    }

    /// Error feedback around [`Codec::encode`]: `x + residual` is encoded into `out`, and `residual`
    /// becomes what the encoding dropped of it (`x + residual - decoded`), to be sent with the next
    /// gradient of the same slice. int8 and onebit do it in one pass per chunk while it is in cache.
    pub fn encode_with_feedback(&self, x: &[f32], residual: &mut [f32], out: &mut [u8]) {
        assert_eq!(out.len(), self.encoded_bytes(x.len()), "encode: output length");
        match self.mode {
            GradCompression::Int8 | GradCompression::OneBit => {
                out.fill(0);
                let run = self.run_elems();
                self.runs_mut(out, x.len())
                    .zip(residual.par_chunks_mut(run).zip(x.par_chunks(run)))
                    .for_each(|((s, p), (r, x))| self.feedback_run(x, r, s, p))
            }
            _ => {
                residual.par_iter_mut().zip(x).for_each(|(r, v)| *r += v);
                self.encode(residual, out);
                self.decode_op::<SUB>(out, residual);
            }
        }
    }

    /// Encodes a run of whole chunks starting at a chunk boundary (and, for onebit, a byte boundary
    /// of `payload`): one scale per chunk into `scales`, the codes into `payload`.
    fn encode_run(&self, x: &[f32], scales: &mut [u8], payload: &mut [u8]) {
        let ce = self.chunk_elems;
        for (c, (x, s)) in x.chunks(ce).zip(scales.chunks_exact_mut(4)).enumerate() {
            self.encode_chunk(x, c * ce, s, payload);
        }
    }

    /// [`Codec::encode_run`] of `x + residual`, leaving in `residual` what the codes drop.
    fn feedback_run(&self, x: &[f32], residual: &mut [f32], scales: &mut [u8], payload: &mut [u8]) {
        let ce = self.chunk_elems;
        for (c, ((r, x), s)) in residual.chunks_mut(ce).zip(x.chunks(ce)).zip(scales.chunks_exact_mut(4)).enumerate() {
            r.iter_mut().zip(x).for_each(|(r, v)| *r += v);
            self.encode_chunk(r, c * ce, s, payload);
            self.decode_chunk::<SUB>(c * ce, s, payload, r);
        }
    }

    /// Decodes a run of whole chunks (see [`Codec::encode_run`]) into `out` with `OP`.
    fn decode_run<const OP: u8>(&self, scales: &[u8], payload: &[u8], out: &mut [f32]) {
        let ce = self.chunk_elems;
        for (c, (o, s)) in out.chunks_mut(ce).zip(scales.chunks_exact(4)).enumerate() {
            self.decode_chunk::<OP>(c * ce, s, payload, o);
        }
    }

    /// One int8 or onebit chunk `x`, element `first` of its run: its scale into `scale`, its codes into
    /// `payload` (zeroed beforehand; sign bits are or-ed in, as a chunk not a multiple of 8 long
    /// shares bytes with its neighbours).
    fn encode_chunk(&self, x: &[f32], first: usize, scale: &mut [u8], payload: &mut [u8]) {
        if self.mode == GradCompression::Int8 {
            let s = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            scale.copy_from_slice(&s.to_le_bytes());
            // All-zero chunks (and those whose scale underflows) keep their zeroed codes.
            if s > 0.0 {
                for (q, v) in payload[first..first + x.len()].iter_mut().zip(x) {
                    *q = int8_step(v / s) as u8;
                }
            }
            return;
        }
        let mean = (sum_abs(x) / x.len() as f64) as f32;
        scale.copy_from_slice(&mean.to_le_bytes());
        // Bit j of byte b: element 8b + j of the run is >= 0.
        if first.is_multiple_of(8) {
            for (byte, eight) in payload[first / 8..].iter_mut().zip(x.chunks(8)) {
                *byte |= eight.iter().enumerate().fold(0u8, |b, (j, v)| b | (((*v >= 0.0) as u8) << j));
            }
        } else {
            for (j, v) in x.iter().enumerate() {
                payload[(first + j) / 8] |= ((*v >= 0.0) as u8) << ((first + j) % 8);
            }
        }
    }

    /// The values of one chunk (see [`Codec::encode_chunk`]) applied to `out` with `OP`.
    fn decode_chunk<const OP: u8>(&self, first: usize, scale: &[u8], payload: &[u8], out: &mut [f32]) {
        let s = word(scale);
        if self.mode == GradCompression::Int8 {
            out.iter_mut().zip(&payload[first..]).for_each(|(o, &q)| apply::<OP>(o, q as i8 as f32 * s));
        } else if first.is_multiple_of(8) {
            // A clear bit flips the scale's sign bit: exactly -s, without a branch.
            for (eight, &byte) in out.chunks_mut(8).zip(&payload[first / 8..]) {
                for (j, o) in eight.iter_mut().enumerate() {
                    let negative = (!(byte as u32) >> j & 1) << 31;
                    apply::<OP>(o, f32::from_bits(s.to_bits() ^ negative));
                }
            }
        } else {
            for (j, o) in out.iter_mut().enumerate() {
                let i = first + j;
                apply::<OP>(o, if payload[i / 8] >> (i % 8) & 1 == 1 { s } else { -s });
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
}
