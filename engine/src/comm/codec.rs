//! The codecs behind `--grad-compression` and `--param-compression`: a slice of f32 values to bytes
//! for the wire and back, with the error feedback folded into the encoding pass
//! ([`Codec::encode_with_feedback`]: what a codec drops from a gradient slice is added into the next
//! gradient sent for that slice, so nothing is lost, only delayed: 1-bit SGD, Seide et al. 2014;
//! error-feedback SGD, Karimireddy et al. 2019). The modes ([`GradCompression`]) are here too; their
//! defaults and `--param-compression` are in `compress.rs`.
//!
//! Each codec's output has a size fixed by the slice's length alone, so the exchange stays one
//! all-to-all of equal chunks; encoding and decoding are pure functions of their input, so every rank
//! and both transports decode the same values and the rank-order sum stays deterministic.
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
    /// gradient of the same slice. bf16 does it in one pass, int8 and onebit in one pass per chunk
    /// while it is in cache.
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
            // One pass, the same operations per element as the three below.
            GradCompression::Bf16 => out
                .par_chunks_mut(2 * ELEMS_PER_TASK)
                .zip(residual.par_chunks_mut(ELEMS_PER_TASK).zip(x.par_chunks(ELEMS_PER_TASK)))
                .for_each(|(o, (r, x))| {
                    for ((o, r), v) in o.chunks_exact_mut(2).zip(r).zip(x) {
                        *r += v;
                        let sent = half::bf16::from_f32(*r);
                        o.copy_from_slice(&sent.to_bits().to_le_bytes());
                        *r -= sent.to_f32();
                    }
                }),
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
mod tests;
