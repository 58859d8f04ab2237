//! The settings of compressed exchange: [`DEFAULT_CHUNK_ELEMS`], the elements per scale of
//! `--grad-compression int8` and `onebit` unless `--grad-compression-chunk` says otherwise (and why
//! that many), and `--param-compression` for the working copy's all-gather ([`ParamCompression`], at
//! [`PARAM_CHUNK_ELEMS`] per scale). The codecs themselves, their modes ([`GradCompression`],
//! re-exported here) and the error feedback are in `codec.rs`.

pub use super::codec::{Codec, GradCompression};

/// Elements per scale of `int8` and `onebit` unless `--grad-compression-chunk` says otherwise: a
/// scale's 4 bytes add a quarter to a 1-bit chunk (25.6x fewer bytes than f32, not 32x), and in
/// exchange a chunk spans few rows of a matrix, so rows of very different size (an embedding's rare
/// and common tokens) share a scale less often. Measured (benches/results/2026-11-26-grad-compression.md,
/// 2026-11-26-codecs.md): onebit's loss after 300 steps of a small GPT-2 was 32% above `none`'s
/// with 2048, 3.3% with 256 and 3.6% with 128; of a small Llama 22%, 7.4%, 1.9% (64: 3.3%); with
/// 100 uncompressed steps first, 128 gave +1.2% (GPT-2) and +1.6% (Llama), 256 +1.5% and +2.1%.
pub const DEFAULT_CHUNK_ELEMS: usize = 128;

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
    /// A scale max|x|/127 per 256 elements and a byte per element.
    Int8,
}

/// Elements per scale of `--param-compression int8` (its help says 256: `ParamCompression::Int8`).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_print_and_refuse_by_name() {
        let modes =
            [GradCompression::None, GradCompression::Bf16, GradCompression::Int8, GradCompression::OneBit, GradCompression::TopK(0.1)];
        for m in modes {
            assert_eq!(m.to_string().parse::<GradCompression>().unwrap(), m);
        }
        assert_eq!("topk:1".parse::<GradCompression>().unwrap(), GradCompression::TopK(1.0));
        for bad in ["zip", "topk", "topk:0", "topk:1.5", "topk:-0.1", "topk:x", "int4"] {
            let err = bad.parse::<GradCompression>().unwrap_err().to_string();
            assert!(err.contains("--grad-compression") && err.contains(bad), "{bad}: {err}");
        }
        assert!(Codec::new(GradCompression::Int8, 0).is_err());
    }
}
