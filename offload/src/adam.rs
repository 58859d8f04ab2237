//! AdamW over one shard of fp32 master parameters, in one pass over memory.
//!
//! The update is memory-bound (as the trainer calls it, with its f32 gradient accumulator in and fp32
//! moments: 30 bytes per parameter with a 16-bit working copy out, 32 with an f32 one; 8 fewer with bf16
//! moments; [`bytes_per_param`]), so everything happens in a single sweep: unscale the gradient, decay,
//! update the moments, step, and write the working copy for the GPU. The arithmetic follows PyTorch's
//! single-tensor AdamW operation by operation, so results agree with `torch.optim.AdamW` to rounding:
//!
//! ```text
//! g     = grad * grad_scale                 (loss-scale unscaling x clip coefficient x 1/micro-batches)
//! p     = p * (1 - lr * wd)                 (decoupled weight decay)
//! m     = m + (1 - beta1) * (g - m)         (first moment, PyTorch's lerp)
//! v     = beta2 * v + (1 - beta2) * g * g   (second moment)
//! m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)
//! p     = p - lr * m_hat / (sqrt(v_hat) + eps)
//!        = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//! ```
//!
//! With the variance frozen after step F (1-bit Adam's, `AdamConfig::variance_frozen_after`), the
//! steps past F keep v and its bias correction 1 - beta2^F as they were; the loop is unchanged, only
//! its scalars ([`second_moment`]).
//!
//! One binary serves every CPU: the same loop is compiled for AVX-512, AVX2+FMA and the baseline (NEON
//! is the baseline on aarch64), and the widest one the CPU has is chosen at run time. No FMA is ever
//! contracted, so every instruction set gives bit-identical results, and so does every thread count.
//!
//! The moments are fp32 (PyTorch's state, exactly) or, with `--adam-state bf16`, bf16: widened to f32
//! for the same update, which steps the parameter with the unrounded moments, then stored rounded
//! stochastically ([`rounding`]), 4 bytes per parameter fewer to keep and move.

mod chunk;
mod isa;
mod reference;
pub(crate) mod rounding;

use chunk::{StepScalars, chunk_dispatch};
use half::{bf16, f16};
pub use isa::Isa;
use rayon::prelude::*;
pub use reference::{adamw_reference, adamw_reference_moments};
pub use rounding::NoiseKey;

/// AdamW's hyper-parameters. f64, as Python hands them to PyTorch: `1 - beta2` computed from an f32
/// 0.999 is off by 5e-5 relative, which the moments would carry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// 1-bit Adam's frozen variance: past this optimizer step the second moment stops changing (None:
    /// AdamW's, updated every step). At least 1: the variance it keeps is learned before it.
    pub variance_frozen_after: Option<u64>,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, variance_frozen_after: None }
    }
}

/// The gradient of a shard, in whichever precision the GPU produced it.
#[derive(Clone, Copy, Debug)]
pub enum Grads<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl Grads<'_> {
    pub fn len(&self) -> usize {
        match self {
            Grads::F32(g) => g.len(),
            Grads::F16(g) => g.len(),
            Grads::Bf16(g) => g.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes per element.
    pub fn elem_bytes(&self) -> usize {
        match self {
            Grads::F32(_) => 4,
            _ => 2,
        }
    }
    /// Whether every gradient is finite (a step with an inf or NaN must be skipped by the caller).
    pub fn all_finite(&self) -> bool {
        match self {
            Grads::F32(g) => g.par_iter().all(|x| x.is_finite()),
            Grads::F16(g) => g.par_iter().all(|x| x.is_finite()),
            Grads::Bf16(g) => g.par_iter().all(|x| x.is_finite()),
        }
    }
}

/// Where a copy of the updated parameters goes (for example a mapped GPU staging buffer, or the
/// trainer's working copy), if anywhere: 16-bit, or f32 (the same values, written in the update's pass
/// instead of a second pass over the parameters).
#[derive(Debug)]
pub enum ParamCopy<'a> {
    None,
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    Bf16(&'a mut [bf16]),
}

impl ParamCopy<'_> {
    pub fn elem_bytes(&self) -> usize {
        match self {
            ParamCopy::None => 0,
            ParamCopy::F32(_) => 4,
            _ => 2,
        }
    }
}

/// A slice's AdamW moments: fp32, or bf16 with the random streams their rounding draws from.
#[derive(Debug)]
pub enum Moments<'a> {
    F32 { m: &'a mut [f32], v: &'a mut [f32] },
    Bf16 { m: &'a mut [bf16], v: &'a mut [bf16], noise: MomentNoise },
}

/// Where bf16 moments draw their rounding noise: each moment's stream for this step and group, and
/// the group index of the slice's first element (the noise follows the element, not the slice).
#[derive(Clone, Copy, Debug)]
pub struct MomentNoise {
    pub m: NoiseKey,
    pub v: NoiseKey,
    pub first_index: u32,
}

impl MomentNoise {
    /// The streams of `group`'s moments at AdamW step `step`, for a slice starting at element
    /// `first_index` of the group.
    pub fn new(seed: u64, step: u64, group: u64, first_index: usize) -> Self {
        let first_index = u32::try_from(first_index).expect("a parameter group holds fewer than 2^32 elements");
        MomentNoise { m: NoiseKey::new(seed, step, group, 0), v: NoiseKey::new(seed, step, group, 1), first_index }
    }
    fn advanced(self, elems: usize) -> Self {
        MomentNoise { first_index: self.first_index + elems as u32, ..self }
    }
}

impl<'a> Moments<'a> {
    pub fn len(&self) -> usize {
        match self {
            Moments::F32 { m, .. } => m.len(),
            Moments::Bf16 { m, .. } => m.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn lens_agree(&self) -> bool {
        match self {
            Moments::F32 { m, v } => m.len() == v.len(),
            Moments::Bf16 { m, v, .. } => m.len() == v.len(),
        }
    }
    /// The moments cut into chunks of `elems` elements, each bf16 chunk with its own first index.
    fn chunks(self, elems: usize) -> Vec<Moments<'a>> {
        match self {
            Moments::F32 { m, v } => m.chunks_mut(elems).zip(v.chunks_mut(elems)).map(|(m, v)| Moments::F32 { m, v }).collect(),
            Moments::Bf16 { m, v, noise } => m
                .chunks_mut(elems)
                .zip(v.chunks_mut(elems))
                .enumerate()
                .map(|(c, (m, v))| Moments::Bf16 { m, v, noise: noise.advanced(c * elems) })
                .collect(),
        }
    }
}

/// Adam's bias corrections at `step` (from 1): 1 - beta1^step and 1 - beta2^step, in f64 as Python
/// computes `beta ** step`. Shared with LAMB (layerwise.rs).
pub(crate) fn bias_corrections(beta1: f64, beta2: f64, step: u64) -> (f64, f64) {
    (1.0 - beta1.powf(step as f64), 1.0 - beta2.powf(step as f64))
}

/// The second moment's scalars at `step`: beta2 and 1 - beta2 as f32, and its bias correction
/// 1 - beta2^step. Past `frozen_after` (F) they are 1, 0 and 1 - beta2^F: `v * 1 + (0 * g) * g` keeps
/// v's bits (v >= 0; only a non-finite g, which would poison v anyway, changes them), so v_hat stays
/// step F's. Shared with LAMB (layerwise.rs).
pub(crate) fn second_moment(beta2: f64, step: u64, frozen_after: Option<u64>) -> (f32, f32, f64) {
    match frozen_after {
        Some(frozen) if step > frozen => {
            assert!(frozen >= 1, "the variance frozen before the first step would stay zero");
            (1.0, 0.0, 1.0 - beta2.powf(frozen as f64))
        }
        _ => (beta2 as f32, (1.0 - beta2) as f32, 1.0 - beta2.powf(step as f64)),
    }
}

/// The fast AdamW: a rayon pool of a chosen size, chunks of a chosen length, the widest instruction set.
pub struct AdamW {
    pub config: AdamConfig,
    pool: rayon::ThreadPool,
    chunk_elems: usize,
    isa: Isa,
}

/// The most threads an update's pool may have (`--adam-threads`, `bench adam --threads`): more than any
/// machine's cores, and few enough that making them cannot exhaust the process's threads.
pub const MAX_THREADS: usize = 1024;

/// Elements per task by default: 64 Ki elements keep a task's p, m, v (768 KiB) within L2 reach.
pub const DEFAULT_CHUNK_ELEMS: usize = 1 << 16;

impl AdamW {
    /// `threads` = 0 means one per core.
    pub fn new(config: AdamConfig, threads: usize, chunk_elems: usize) -> Self {
        Self::with_isa(config, threads, chunk_elems, Isa::detect())
    }

    /// As [`AdamW::new`] with an explicit instruction set, so that tests compare the builds. Panics if
    /// this CPU lacks it ([`Isa::available`]): the unsafe calls into its build rely on this check.
    pub fn with_isa(config: AdamConfig, threads: usize, chunk_elems: usize, isa: Isa) -> Self {
        isa.assert_available();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("building the AdamW thread pool");
        AdamW { config, pool, chunk_elems: chunk_elems.max(1), isa }
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// One AdamW step (`step` counts from 1) over a shard. `grad_scale` multiplies every gradient first;
    /// `decay_this_tensor` is false for biases and layer-norm parameters. Panics if lengths disagree.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &self,
        params: &mut [f32],
        m: &mut [f32],
        v: &mut [f32],
        grads: Grads<'_>,
        copy: ParamCopy<'_>,
        step: u64,
        grad_scale: f32,
        decay_this_tensor: bool,
    ) {
        self.step_moments(params, Moments::F32 { m, v }, grads, copy, step, grad_scale, decay_this_tensor)
    }

    /// [`AdamW::step`] with moments of either format.
    #[allow(clippy::too_many_arguments)]
    pub fn step_moments(
        &self,
        params: &mut [f32],
        moments: Moments<'_>,
        grads: Grads<'_>,
        copy: ParamCopy<'_>,
        step: u64,
        grad_scale: f32,
        decay_this_tensor: bool,
    ) {
        let n = params.len();
        assert!(moments.len() == n && moments.lens_agree() && grads.len() == n, "AdamW: p, m, v and grads must have the same length");
        let k = StepScalars::new(&self.config, step, grad_scale, decay_this_tensor);
        let (isa, ce) = (self.isa, self.chunk_elems);
        let grad_chunks: Vec<Grads<'_>> = match grads {
            Grads::F32(g) => g.chunks(ce).map(Grads::F32).collect(),
            Grads::F16(g) => g.chunks(ce).map(Grads::F16).collect(),
            Grads::Bf16(g) => g.chunks(ce).map(Grads::Bf16).collect(),
        };
        let copy_chunks: Vec<ParamCopy<'_>> = match copy {
            ParamCopy::None => (0..grad_chunks.len()).map(|_| ParamCopy::None).collect(),
            ParamCopy::F32(out) => {
                assert_eq!(out.len(), n, "AdamW: the copy must have one element per parameter");
                out.chunks_mut(ce).map(ParamCopy::F32).collect()
            }
            ParamCopy::F16(out) => {
                assert_eq!(out.len(), n, "AdamW: the 16-bit copy must have one element per parameter");
                out.chunks_mut(ce).map(ParamCopy::F16).collect()
            }
            ParamCopy::Bf16(out) => {
                assert_eq!(out.len(), n, "AdamW: the 16-bit copy must have one element per parameter");
                out.chunks_mut(ce).map(ParamCopy::Bf16).collect()
            }
        };
        let moment_chunks = moments.chunks(ce);
        self.pool.install(|| {
            params
                .par_chunks_mut(ce)
                .zip(moment_chunks.into_par_iter())
                .zip(grad_chunks.into_par_iter().zip(copy_chunks.into_par_iter()))
                .for_each(|((p, mut mv), (g, mut c))| chunk_dispatch(isa, p, &mut mv, g, &mut c, &k));
        });
    }

    /// [`AdamW::step`] unless a gradient is not finite; returns whether the step was taken. A skipped
    /// step leaves p, m and v untouched (the caller halves its loss scale and moves on).
    #[allow(clippy::too_many_arguments)]
    pub fn step_if_finite(
        &self,
        params: &mut [f32],
        m: &mut [f32],
        v: &mut [f32],
        grads: Grads<'_>,
        copy: ParamCopy<'_>,
        step: u64,
        grad_scale: f32,
        decay_this_tensor: bool,
    ) -> bool {
        if !self.pool.install(|| grads.all_finite()) {
            return false;
        }
        self.step(params, m, v, grads, copy, step, grad_scale, decay_this_tensor);
        true
    }
}

/// Bytes moved per parameter by one step with these gradient and copy types and fp32 moments (read
/// grad and p, m, v; write p, m, v and the copy).
pub fn bytes_per_param(grad_bytes: usize, copy_bytes: usize) -> usize {
    grad_bytes + 12 + 12 + copy_bytes
}
