//! The update of one chunk: the per-step scalars, the element update in PyTorch's operation order,
//! the loop over a chunk (fp32 or bf16 moments, any gradient and copy types), and its copies compiled
//! for AVX-512 and AVX2+FMA beside the baseline, one chosen per update at run time.

use half::f16;
use half::slice::HalfFloatSliceExt;

#[cfg(target_arch = "x86_64")]
use super::rounding::store_bf16_streaming;
use super::rounding::{bf16_from_f32, bf16_to_f32, round_stochastic_into, widen_into};
use super::{AdamConfig, Grads, Isa, Moments, ParamCopy, bias_corrections, second_moment};

/// The per-step scalars, computed once (in f64, as Python computes them for PyTorch) and rounded to f32.
#[derive(Clone, Copy, Debug)]
pub(super) struct StepScalars {
    grad_scale: f32,
    decay: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    step_size: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
}

impl StepScalars {
    pub(super) fn new(cfg: &AdamConfig, step: u64, grad_scale: f32, decay_this_tensor: bool) -> Self {
        assert!(step >= 1, "AdamW steps count from 1");
        let (lr, b1, b2) = (cfg.lr, cfg.beta1, cfg.beta2);
        let wd = if decay_this_tensor { cfg.weight_decay } else { 0.0 };
        let (bias_correction1, _) = bias_corrections(b1, b2, step);
        let (beta2, one_minus_beta2, bias_correction2) = second_moment(b2, step, cfg.variance_frozen_after);
        StepScalars {
            grad_scale,
            decay: (1.0 - lr * wd) as f32,
            one_minus_beta1: (1.0 - b1) as f32,
            beta2,
            one_minus_beta2,
            step_size: (lr / bias_correction1) as f32,
            bias_correction2_sqrt: bias_correction2.sqrt() as f32,
            eps: cfg.eps as f32,
        }
    }
}

/// One element of the update, exactly in PyTorch's operation order.
#[inline(always)]
pub(super) fn update(p: &mut f32, m: &mut f32, v: &mut f32, grad: f32, k: &StepScalars) {
    let g = grad * k.grad_scale;
    *p *= k.decay;
    // PyTorch's vectorised lerp is one fused multiply-add: m + w * (g - m) rounded once.
    *m = k.one_minus_beta1.mul_add(g - *m, *m);
    // mul_(beta2) then addcmul_, whose vectorised loop PyTorch's compiler fuses into one multiply-add.
    *v = (k.one_minus_beta2 * g).mul_add(g, *v * k.beta2);
    let denom = v.sqrt() / k.bias_correction2_sqrt + k.eps;
    *p += (-k.step_size * *m) / denom;
}

/// The loop body, generic over gradient and copy types; inlined into each instruction-set variant.
/// With `streaming_copy` (x86 with AVX2) the bf16 copy is written in a second pass over the chunk,
/// while it is still in cache, with non-temporal stores.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // only x86 has the streaming copy
fn chunk_body(
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    grads: Grads<'_>,
    copy: &mut ParamCopy<'_>,
    k: &StepScalars,
    streaming_copy: bool,
) {
    let n = p.len();
    let (m, v) = (&mut m[..n], &mut v[..n]);
    macro_rules! sweep {
        ($g:expr, $conv:expr, $store:expr) => {{
            let g = &$g[..n];
            for i in 0..n {
                update(&mut p[i], &mut m[i], &mut v[i], $conv(g[i]), k);
                $store(i, p[i]);
            }
        }};
    }
    match (grads, copy) {
        #[cfg(target_arch = "x86_64")]
        (Grads::Bf16(g), ParamCopy::Bf16(out)) if streaming_copy => {
            sweep!(g, bf16_to_f32, |_, _| ());
            // SAFETY: only requested by the AVX2 and AVX-512 variants, whose CPUs have AVX2.
            unsafe { store_bf16_streaming(p, &mut out[..n]) }
        }
        #[cfg(target_arch = "x86_64")]
        (Grads::F32(g), ParamCopy::Bf16(out)) if streaming_copy => {
            sweep!(g, |x: f32| x, |_, _| ());
            // SAFETY: as above.
            unsafe { store_bf16_streaming(p, &mut out[..n]) }
        }
        (Grads::Bf16(g), ParamCopy::Bf16(out)) => {
            let out = &mut out[..n];
            sweep!(g, bf16_to_f32, |i: usize, x: f32| out[i] = bf16_from_f32(x))
        }
        (Grads::Bf16(g), ParamCopy::None) => sweep!(g, bf16_to_f32, |_, _| ()),
        (Grads::F32(g), ParamCopy::None) => sweep!(g, |x: f32| x, |_, _| ()),
        (Grads::F32(g), ParamCopy::F32(out)) => {
            let out = &mut out[..n];
            sweep!(g, |x: f32| x, |i: usize, x: f32| out[i] = x)
        }
        (Grads::F32(g), ParamCopy::Bf16(out)) => {
            let out = &mut out[..n];
            sweep!(g, |x: f32| x, |i: usize, x: f32| out[i] = bf16_from_f32(x))
        }
        // The f16 copy in a second pass over the chunk, still in cache, by the `half` crate's slice
        // conversion: 8 at a time where the CPU has F16C (checked once per chunk), the same bits as its
        // element-wise `f16::from_f32` (nearest even). Element by element, with the feature checked
        // for every one, the update ran at 0.27 Gparam/s here against 1.36 with a bf16 copy.
        (Grads::F32(g), ParamCopy::F16(out)) => {
            sweep!(g, |x: f32| x, |_, _| ());
            out[..n].convert_from_f32_slice(p);
        }
        (Grads::Bf16(g), ParamCopy::F16(out)) => {
            sweep!(g, bf16_to_f32, |_, _| ());
            out[..n].convert_from_f32_slice(p);
        }
        // f16 gradients (`bench adam --grad f16` only: training reads f32 or bf16 ones) go through the
        // `half` crate element by element: correct, not a fast path.
        (grads, copy) => {
            for i in 0..n {
                let gi = match grads {
                    Grads::F32(g) => g[i],
                    Grads::F16(g) => g[i].to_f32(),
                    Grads::Bf16(g) => bf16_to_f32(g[i]),
                };
                update(&mut p[i], &mut m[i], &mut v[i], gi, k);
                match copy {
                    ParamCopy::None => {}
                    ParamCopy::F32(out) => out[i] = p[i],
                    ParamCopy::F16(out) => out[i] = f16::from_f32(p[i]),
                    ParamCopy::Bf16(out) => out[i] = bf16_from_f32(p[i]),
                }
            }
        }
    }
}

std::thread_local! {
    /// Each AdamW thread's f32 copies of a chunk of bf16 moments (reused: a chunk's 512 KiB would
    /// otherwise be mapped and unmapped, page faults and all, for every chunk).
    static WIDENED: std::cell::RefCell<Widened> = const { std::cell::RefCell::new(Widened { m: Vec::new(), v: Vec::new() }) };
}

/// f32 scratch for a chunk of bf16 moments.
struct Widened {
    m: Vec<f32>,
    v: Vec<f32>,
}

/// One chunk with moments of either format: fp32 ones are updated in place; bf16 ones are widened
/// into f32 scratch, updated by the same body and rounded back stochastically.
#[inline(always)]
fn chunk_moments(
    p: &mut [f32],
    moments: &mut Moments<'_>,
    scratch: &mut Widened,
    grads: Grads<'_>,
    copy: &mut ParamCopy<'_>,
    k: &StepScalars,
    streaming_copy: bool,
) {
    match moments {
        Moments::F32 { m, v } => chunk_body(p, m, v, grads, copy, k, streaming_copy),
        Moments::Bf16 { m, v, noise } => {
            let n = p.len();
            widen_into(&mut scratch.m, &m[..n]);
            widen_into(&mut scratch.v, &v[..n]);
            chunk_body(p, &mut scratch.m, &mut scratch.v, grads, copy, k, streaming_copy);
            round_stochastic_into(&mut m[..n], &scratch.m, noise.m, noise.first_index);
            round_stochastic_into(&mut v[..n], &scratch.v, noise.v, noise.first_index);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn chunk_avx512(
    p: &mut [f32],
    moments: &mut Moments<'_>,
    scratch: &mut Widened,
    grads: Grads<'_>,
    copy: &mut ParamCopy<'_>,
    k: &StepScalars,
) {
    chunk_moments(p, moments, scratch, grads, copy, k, true)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn chunk_avx2(
    p: &mut [f32],
    moments: &mut Moments<'_>,
    scratch: &mut Widened,
    grads: Grads<'_>,
    copy: &mut ParamCopy<'_>,
    k: &StepScalars,
) {
    chunk_moments(p, moments, scratch, grads, copy, k, true)
}

pub(super) fn chunk_dispatch(
    isa: Isa,
    p: &mut [f32],
    moments: &mut Moments<'_>,
    grads: Grads<'_>,
    copy: &mut ParamCopy<'_>,
    k: &StepScalars,
) {
    // The scratch is borrowed here, outside the instruction-set variants: a closure passed to
    // `LocalKey::with` would be compiled without their target features (and mul_add become calls).
    WIDENED.with_borrow_mut(|scratch| match isa {
        // SAFETY: an `AdamW` holds only an instruction set this CPU has (checked in `with_isa`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { chunk_avx512(p, moments, scratch, grads, copy, k) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { chunk_avx2(p, moments, scratch, grads, copy, k) },
        _ => chunk_moments(p, moments, scratch, grads, copy, k, false),
    })
}
