//! The checks only the gpu device has: every kernel compiled on the adapter (first, so a kernel the
//! driver refuses is named with its error; the attention variants with their decode kernel), every
//! variant of the fp32 matmul and of the training attention kernels against the twin, every variant of the
//! cooperative-matrix matmul against the twin and bit for bit against its default, and the f32 -> f16
//! rounding kernel bit for bit.

use anyhow::Result;

use super::{Check, CheckResult, Size, Tolerance, check_matmul, check_matmul_f16_inputs, random, upload};
use crate::device::{Backend, GpuDevice, HalfFormat, MatmulInputs, MatmulShape, Operand};
use zerostream_shaders::{self as shaders, AttentionTile, CoopTile, MatmulTile};

/// Creates the pipeline of every entry point of every kernel the adapter can run (the cooperative-
/// matrix matmul only where it has what it needs): a case per kernel, the refusals in words.
pub fn check_compile(dev: &GpuDevice) -> Result<Vec<CheckResult>> {
    let check = Check::new("compile", Tolerance::Bits);
    let (mut kernels, mut entry_points, mut refused) = (0, 0, Vec::new());
    let mut variants: Vec<shaders::Kernel> = dev.matmul_variants().iter().map(MatmulTile::kernel).collect();
    variants.extend(dev.attention_variants().iter().flat_map(AttentionTile::kernels));
    variants.extend(dev.coop_variants().iter().map(CoopTile::kernel));
    for kernel in shaders::ALL.iter().chain(&variants) {
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
        let _ = self.0.force_coop_variant(None);
        let _ = self.0.set_matmul_inputs(MatmulInputs::F32);
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
/// backward against the twin, and bit for bit against the default variant's (the cases of the
/// `attention_forward` and `attention_backward` checks).
pub fn check_attention_variant(dev: &GpuDevice, variant: AttentionTile, size: Size) -> Result<Vec<CheckResult>> {
    dev.force_attention_variant(Some(variant))?;
    let _unforced = Unforced(dev);
    let mut results = super::attention::check_forward(dev, &format!("attention_forward {variant}"), size)?;
    results.extend(super::attention::check_backward(dev, &format!("attention_backward {variant}"), size)?);
    if variant != AttentionTile::DEFAULT {
        // Every variant sums in the same order; a driver that contracts a multiply and an add in one
        // variant's code and not in another's would show here (and a tuner would pass it over).
        let mut same = Check::new(&format!("attention {variant} = {}'s bits", AttentionTile::DEFAULT), Tolerance::Bits);
        let got = super::attention::outputs(dev, size)?;
        dev.force_attention_variant(Some(AttentionTile::DEFAULT))?;
        for ((name, got), (_, want)) in got.iter().zip(&super::attention::outputs(dev, size)?) {
            same.compare(name, got, want);
        }
        results.push(same.finish());
    }
    Ok(results)
}

/// One variant of the cooperative-matrix matmul (`CoopTile`), forced for every product: against the twin
/// in every layout and with a 16-bit B, and bit for bit against the default of its cooperative size (every
/// variant of one size sums each element in the same order, so a tuner's choice never changes a result).
pub fn check_coop_variant(dev: &GpuDevice, variant: CoopTile, size: Size) -> Result<Vec<CheckResult>> {
    let _unforced = Unforced(dev);
    dev.force_coop_variant(Some(variant))?;
    let mut results = check_matmul_f16_inputs(dev, &format!("matmul_coop {variant}"), size)?;
    let mut same = Check::new(&format!("matmul_coop {variant} = c{}'s default", variant.coop), Tolerance::Bits);
    dev.set_matmul_inputs(MatmulInputs::F16)?;
    for (i, &(m, n, k)) in [(1, 1, 1), (63, 65, 17), (130, 200, 96), (17, 129, 300), (257, 70, 64)].iter().enumerate() {
        let seed = 7000 + 10 * i as u64;
        let (a, b, c0) = (random(seed, m * k, 1.0), random(seed + 1, k * n, 1.0), random(seed + 2, m * n, 1.0));
        let shapes = [
            MatmulShape::row_major(m, n, k),
            MatmulShape { a: Operand::transposed(m), b: Operand::transposed(k), ..MatmulShape::row_major(m, n, k) },
        ];
        for (layout, s) in ["nn", "tt"].iter().zip(shapes) {
            let run = |tile: CoopTile| -> Result<Vec<f32>> {
                dev.force_coop_variant(Some(tile))?;
                let c = upload(dev, &c0)?;
                dev.matmul(&c, &upload(dev, &a)?, &upload(dev, &b)?, None, &s, true);
                Ok(dev.read(&c))
            };
            let (got, want) = (run(variant)?, run(CoopTile::default_for(variant.coop))?);
            same.compare(&format!("{m}x{n}x{k} {layout} accumulate"), &got, &want);
        }
    }
    results.push(same.finish());
    Ok(results)
}

/// Products whose packed operands outgrow the 64 MiB scratch (A's rows, then B's columns), which the
/// device cuts into pieces that fit: with `variant` (a packing one), bit for bit against the staged
/// default, which packs nothing. Vocabulary chunks and GPT-2 1.5B's MLP are this size.
pub fn check_coop_packed_pieces(dev: &GpuDevice, variant: CoopTile) -> Result<Vec<CheckResult>> {
    let _unforced = Unforced(dev);
    dev.set_matmul_inputs(MatmulInputs::F16)?;
    let mut same = Check::new(&format!("matmul_coop {variant} in scratch-sized pieces = c{}'s default", variant.coop), Tolerance::Bits);
    // 4100 x 8200 and 8200 x 4100 halves each pass 32 Mi halves by a little; ragged against every tile.
    for (i, &(m, n, k)) in [(4100, 72, 8200), (72, 4100, 8200)].iter().enumerate() {
        let seed = 7100 + 10 * i as u64;
        let (a, b, bias, c0) =
            (random(seed, m * k, 1.0), random(seed + 1, k * n, 1.0), random(seed + 2, n, 1.0), random(seed + 3, m * n, 1.0));
        let (ta, tb, tbias) = (upload(dev, &a)?, upload(dev, &b)?, upload(dev, &bias)?);
        let s = MatmulShape::row_major(m, n, k);
        let run = |tile: CoopTile| -> Result<Vec<f32>> {
            dev.force_coop_variant(Some(tile))?;
            let c = upload(dev, &c0)?;
            dev.matmul(&c, &ta, &tb, Some(&tbias), &s, true);
            Ok(dev.read(&c))
        };
        let (got, want) = (run(variant)?, run(CoopTile::default_for(variant.coop))?);
        same.compare(&format!("{m}x{n}x{k} bias accumulate"), &got, &want);
    }
    Ok(vec![same.finish()])
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

/// Turns `--copy-queue` off again when dropped; not while a panic unwinds (turning it off waits for
/// the device, whose failure would panic again and abort the whole selftest rather than fail one check).
struct RouteOff<'a>(&'a GpuDevice);

impl Drop for RouteOff<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = self.0.set_copy_queue(false);
        }
    }
}

/// `--copy-queue`'s order between wgpu's queue and the copy queue (`gpu/copy_route.rs`), bit for bit
/// against the sums made on the host. Rounds run in flight together, none waited for before the
/// last is issued: each writes new values into one pinned buffer (after the copy out of it for the
/// round before), uploads them from it on the copy queue into the same tensor x (after the kernels
/// of the round before have read x), adds a constant to x on wgpu's queue (several times over, so
/// the kernels read x for longer) into the round's own output, and starts that output's read-back
/// into pinned memory on the copy queue (after the kernels). A copy that ran out of order shows as
/// another round's values. On lavapipe wgpu's own queue stands in, so only a real second queue tests
/// the order itself; everywhere the copies, semaphores and waits run, and every byte must take the
/// copy queue. Where the route is refused, the check says so (`not_checked` names why).
pub fn check_copy_queue(dev: &GpuDevice) -> Result<Vec<CheckResult>> {
    const ROUNDS: u64 = 4;
    const KERNELS_PER_ROUND: usize = 8;
    let mut check = Check::new("copy_queue order", Tolerance::Bits);
    // One word past 1 MiB: above the pinned-copy threshold, and ragged.
    let n = (1 << 18) + 3;
    let constant = random(9000, n, 1.0);
    dev.set_copy_queue(true)?;
    let _off = RouteOff(dev);
    let mut pinned = match dev.alloc_pinned(4 * n) {
        Ok(buf) => buf,
        Err(why) => {
            check.fail(format!("no pinned host memory for the uploads: {why}"));
            return Ok(vec![check.finish()]);
        }
    };
    // Made under the route, so each is ready for raw copies (cleared on wgpu's queue first).
    let (x, c) = (dev.alloc(n, "selftest copy-queue x")?, dev.alloc(n, "selftest copy-queue c")?);
    let outs = (0..ROUNDS).map(|_| dev.alloc(n, "selftest copy-queue out")).collect::<Result<Vec<_>>>()?;
    dev.write(&c, &constant);
    let before = dev.copy_queue_bytes();
    let mut rounds = Vec::new();
    for (round, out) in (0..ROUNDS).zip(&outs) {
        let values = random(9001 + round, n, 100.0);
        pinned.as_mut_slice::<f32>()[..n].copy_from_slice(&values);
        dev.write(&x, &pinned.as_slice::<f32>()[..n]);
        for _ in 0..KERNELS_PER_ROUND {
            dev.residual_forward(out, &x, &c);
        }
        let want: Vec<f32> = values.iter().zip(&constant).map(|(v, k)| v + k).collect();
        rounds.push((dev.begin_read(&[out]), want));
    }
    for (round, (pending, want)) in rounds.into_iter().enumerate() {
        let got = dev.finish_read(pending).pop().expect("one tensor read");
        check.compare(&format!("round {round}"), &got, &want);
    }
    let after = dev.copy_queue_bytes();
    let (up, down) = (after.0 - before.0, after.1 - before.1);
    let expected = ROUNDS * 4 * n as u64;
    if up != expected || down != expected {
        check.fail(format!("{up} bytes went up and {down} down on the copy queue; every round's {} should have", 4 * n));
    }
    Ok(vec![check.finish()])
}
