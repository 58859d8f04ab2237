//! AdamW's reference: one element at a time, in PyTorch's operation order, the oracle the fast path
//! (every instruction set, every thread count) is tested against bit for bit.

use half::{bf16, f16};

use super::chunk::{StepScalars, update};
use super::rounding::{bf16_from_f32, bf16_stochastic, bf16_to_f32};
use super::{AdamConfig, Grads, Moments, ParamCopy};

/// The reference: one element at a time, no chunks, no threads. Kept beside the fast path as the oracle
/// the tests compare it with.
#[allow(clippy::too_many_arguments, reason = "the fast path's arguments, one for one, so the two read side by side")]
pub fn adamw_reference(
    params: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    grads: Grads<'_>,
    copy: ParamCopy<'_>,
    cfg: &AdamConfig,
    step: u64,
    grad_scale: f32,
    decay_this_tensor: bool,
) {
    adamw_reference_moments(params, Moments::F32 { m, v }, grads, copy, cfg, step, grad_scale, decay_this_tensor)
}

/// [`adamw_reference`] over moments of either format.
#[allow(clippy::too_many_arguments, reason = "the fast path's arguments, one for one, so the two read side by side")]
pub fn adamw_reference_moments(
    params: &mut [f32],
    moments: Moments<'_>,
    grads: Grads<'_>,
    copy: ParamCopy<'_>,
    cfg: &AdamConfig,
    step: u64,
    grad_scale: f32,
    decay_this_tensor: bool,
) {
    let k = StepScalars::new(cfg, step, grad_scale, decay_this_tensor);
    let mut copy = copy;
    let mut moments = moments;
    for i in 0..params.len() {
        let g = match grads {
            Grads::F32(g) => g[i],
            Grads::F16(g) => g[i].to_f32(),
            Grads::Bf16(g) => bf16_to_f32(g[i]),
        };
        match &mut moments {
            Moments::F32 { m, v } => update(&mut params[i], &mut m[i], &mut v[i], g, &k),
            Moments::Bf16 { m, v, noise } => {
                let (mut m32, mut v32) = (bf16_to_f32(m[i]), bf16_to_f32(v[i]));
                update(&mut params[i], &mut m32, &mut v32, g, &k);
                let at = noise.first_index + i as u32;
                m[i] = bf16::from_bits(bf16_stochastic(m32, noise.m.noise(at)));
                v[i] = bf16::from_bits(bf16_stochastic(v32, noise.v.noise(at)));
            }
        }
        match &mut copy {
            ParamCopy::None => {}
            ParamCopy::F32(out) => out[i] = params[i],
            ParamCopy::F16(out) => out[i] = f16::from_f32(params[i]),
            ParamCopy::Bf16(out) => out[i] = bf16_from_f32(params[i]),
        }
    }
}
