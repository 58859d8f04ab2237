//! The checks only the gpu device has: every kernel compiled on the adapter (first, so a kernel the
//! driver refuses is named with its error; the attention variants with their decode kernel), every
//! variant of the fp32 matmul and of the training attention kernels against the twin, and the f32 -> f16 rounding kernel bit for bit.

use anyhow::Result;

use super::{Check, CheckResult, Size, Tolerance, check_matmul, random, upload};
use crate::device::{GpuDevice, HalfFormat};
use zerostream_shaders::{self as shaders, AttentionPass, AttentionTile, MatmulTile};

/// Creates the pipeline of every entry point of every kernel the adapter can run (the cooperative-
/// matrix matmul only where it has what it needs): a case per kernel, the refusals in words.
pub fn check_compile(dev: &GpuDevice) -> Result<Vec<CheckResult>> {
    let check = Check::new("compile", Tolerance::Bits);
    let (mut kernels, mut entry_points, mut refused) = (0, 0, Vec::new());
    let mut variants: Vec<shaders::Kernel> = dev.matmul_variants().iter().map(MatmulTile::kernel).collect();
    variants.extend(
        dev.attention_variants().iter().flat_map(|t| AttentionPass::ALL.map(|p| t.kernel(p)).into_iter().chain([t.decode_kernel()])),
    );
    let listed = shaders::ALL.iter().filter(|k| k.name != shaders::MATMUL_COOP.name || dev.has_coop_matmul());
    for kernel in listed.chain(&variants) {
        kernels += 1;
        match dev.compile(*kernel) {
            Ok(n) => entry_points += n,
            Err(e) => refused.push(format!("{}.wgsl: {e}", kernel.name)),
        }
    }
    let mut result = check.finish();
    result.cases = kernels;
    result.failed_cases = refused.len();
    result.note = Some(format!("{kernels} kernels, {entry_points} entry points compiled"));
    if !refused.is_empty() {
        result.error = Some(format!("the adapter refused {}: {}", refused.len(), refused.join("; ")));
    }
    Ok(vec![result])
}

/// Puts the device's matmul and attention back on their tuning tables when dropped (also when a check
/// panics).
struct Unforced<'a>(&'a GpuDevice);

impl Drop for Unforced<'_> {
    fn drop(&mut self) {
        let _ = self.0.force_matmul_variant(None);
        let _ = self.0.force_attention_variant(None);
    }
}

/// One variant of the fp32 matmul (`MatmulTile`), forced for every product, in every layout and with a
/// 16-bit B, against the twin.
pub fn check_matmul_variant(dev: &GpuDevice, variant: MatmulTile, size: Size) -> Result<Vec<CheckResult>> {
    dev.force_matmul_variant(Some(variant))?;
    let _unforced = Unforced(dev);
    check_matmul(dev, &format!("matmul {variant}"), size)
}

/// One variant of the training attention kernels (`AttentionTile`), forced for every call, forward and
/// backward against the twin (the cases of the `attention_forward` and `attention_backward` checks).
pub fn check_attention_variant(dev: &GpuDevice, variant: AttentionTile, size: Size) -> Result<Vec<CheckResult>> {
    dev.force_attention_variant(Some(variant))?;
    let _unforced = Unforced(dev);
    let mut results = super::attention::check_forward(dev, &format!("attention_forward {variant}"), size)?;
    results.extend(super::attention::check_backward(dev, &format!("attention_backward {variant}"), size)?);
    Ok(results)
}

/// `cast_f32_to_f16.wgsl` (`common/f16_bits.wgsl`, which `matmul_coop.wgsl` rounds its inputs with)
/// against the `half` crate bit for bit: ties to even, past the largest f16 (infinity), the subnormal
/// range and its ties, signed zeros, infinities.
pub fn check_cast_to_f16(dev: &GpuDevice, size: Size) -> Result<Vec<CheckResult>> {
    let mut check = Check::new("cast_f32_to_f16", Tolerance::Bits);
    let p = |e: i32| 2f32.powi(e);
    let edges = [
        70000.0,
        1e-8,
        1.0 + 1.0 / 2048.0,
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        p(-25),
        3.0 * p(-25),
        p(-14) - p(-26),
        -1.5 * p(-24),
        1e-30,
        -0.0,
        p(-25) * 1.000001,
        p(-14),
        -p(-15) * 1.0005,
        2049.0,
        2051.0,
        -1e-7,
    ];
    for &n in size.pick(&[1usize, 63, 65, 4097, 40_001][..], &[1, 63, 65, 4097][..]) {
        let mut x = random(n as u64, n, 100.0);
        x.iter_mut().zip(edges).for_each(|(v, e)| *v = e);
        let words = dev.upload_words(&vec![0u32; n.div_ceil(2)], "selftest halves")?;
        dev.cast_f32_to_f16(&words, &upload(dev, &x)?, n);
        let got: Vec<u16> = dev.read_words(&words).iter().flat_map(|w| [*w as u16, (*w >> 16) as u16]).take(n).collect();
        let mut want = vec![0u16; n];
        crate::ops::elementwise::cast_f32_to_f16(&mut want, &x);
        // Compared as the f32 values of the halves: the same bits, and readable when they differ.
        let wide = |h: &[u16]| -> Vec<f32> { h.iter().map(|&b| HalfFormat::F16.to_f32(b)).collect() };
        check.compare(&n.to_string(), &wide(&got), &wide(&want));
    }
    Ok(vec![check.finish()])
}
