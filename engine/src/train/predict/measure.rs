//! What `plan --measure` times (see [`super`] for the model it feeds): the device on two cuts of the
//! run's model, the update on the run's threads, and the drive swept as the update sweeps the state.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zerostream_checkpoints::TokenFile;
use zerostream_offload::adam::{AdamConfig, AdamW, DEFAULT_CHUNK_ELEMS, Grads, MomentNoise, Moments, ParamCopy};
use zerostream_offload::{IoEngine, Layerwise, NvmeDir, Stored, Tier};

use super::super::config::{AdamState, TrainConfig};
use super::super::plan::Placement;
use super::super::{ModelSource, Trainer};
use super::LinkRates;
use crate::device::Backend;
use crate::model::Model;

/// Times the links of a run of `model` with `train` (laid out as `placement`) on `dev`, the drive in
/// `drive_dirs` (none: not timed).
pub fn measure<D: Backend>(
    dev: &D,
    model: &Model,
    train: &TrainConfig,
    placement: &Placement,
    drive_dirs: &[PathBuf],
) -> Result<LinkRates> {
    let start = Instant::now();
    // A rank's slice of a block's group: what the sweep moves at a time.
    let lens = &placement.group_lens;
    let largest = lens.iter().skip(1).max().or(lens.first()).copied().unwrap_or(0);
    let sharding = crate::train::Sharding { rank: 0, world: placement.world_size.max(1), stage: placement.zero_stage };
    let group_elems = sharding.group(largest).slice_len();
    // A block's time is the difference between two cuts, as many blocks apart as 2 GiB of state in
    // RAM holds (at least 4: a block must stand out of the step-to-step noise even where it is a
    // small part of the head's time); a small model is timed whole.
    let block_elems = lens.iter().skip(1).max().copied().unwrap_or(1).max(1);
    let blocks_in_2gib = (2usize << 30) / (MAX_BYTES_PER_PARAM * block_elems);
    let extra_blocks = model.n_layer().min(blocks_in_2gib.max(4)).max(1) - 1;
    let one = measure_device(dev, model, train, 1)?;
    let more = if extra_blocks > 0 { measure_device(dev, model, train, 1 + extra_blocks)? } else { one.clone() };
    // Noise can make the difference negative on tiny models: a block costs at least nothing.
    let block_s = if extra_blocks > 0 { ((more.device_s - one.device_s) / extra_blocks as f64).max(0.0) } else { one.device_s / 2.0 };
    let head_s = (one.device_s - block_s).max(0.0);
    let block_forward_s =
        if extra_blocks > 0 { ((more.forward_s - one.forward_s) / extra_blocks as f64).max(0.0) } else { one.forward_s / 2.0 };
    let head_forward_s = (one.forward_s - block_forward_s).max(0.0);
    // The drive last: the writes it leaves for the kernel to flush would slow what comes after.
    let adam_gparams_per_s = measure_adam(train);
    let (drive_gbps, drive_cpu_share) = match drive_dirs.is_empty() {
        true => (None, 0.0),
        false => {
            let (gbps, share) = measure_drive(drive_dirs, train, group_elems)?;
            (Some(gbps), share)
        }
    };
    let extra_upload_s = more.upload_s - one.upload_s;
    let upload_gbps = if extra_upload_s > 0.0 {
        more.upload_bytes.saturating_sub(one.upload_bytes) as f64 / extra_upload_s / 1e9
    } else {
        more.upload_bytes as f64 / more.upload_s.max(1e-9) / 1e9
    };
    Ok(LinkRates {
        drive_gbps,
        drive_cpu_share,
        adam_gparams_per_s,
        block_s,
        head_s,
        block_forward_s,
        head_forward_s,
        upload_gbps,
        measuring_s: start.elapsed().as_secs_f64(),
    })
}

/// One group of `measure_drive`'s stand-in optimizer state, on the drive.
struct Group {
    master: Stored,
    /// The optimizer's moments (m and v; LARS's m alone).
    moments: Vec<Stored>,
}

impl Group {
    fn all(&mut self) -> Vec<&mut Stored> {
        std::iter::once(&mut self.master).chain(self.moments.iter_mut()).collect()
    }

    /// The run's update rule over this group, paged in: AdamW, or LAMB's and LARS's two passes.
    fn update(&mut self, k: usize, pass: u64, train: &TrainConfig, layerwise: Option<&Layerwise>, adam: &AdamW, grads: &[f32]) {
        let p = self.master.data_mut().as_mut_slice::<f32>();
        let (m, rest) = self.moments.split_first_mut().expect("a first moment");
        let (m, v) = (m.data_mut(), rest.first_mut().map(|v| v.data_mut()));
        if let Some(opt) = layerwise {
            let (m, mut none) = (m.as_mut_slice::<f32>(), Vec::new());
            let v = match v {
                Some(v) => v.as_mut_slice::<f32>(),
                None => none.as_mut_slice(),
            };
            let trust = opt.trust_ratio(opt.measure(p, m, v, grads, pass, 1.0, true, 0).total(), true);
            opt.apply(p, m, v, grads, ParamCopy::None, pass, 1.0, true, trust);
            return;
        }
        let v = v.expect("AdamW's second moment");
        let moments = match train.adam_state {
            AdamState::Fp32 => Moments::F32 { m: m.as_mut_slice(), v: v.as_mut_slice() },
            AdamState::Bf16 => Moments::Bf16 {
                m: bytemuck::cast_slice_mut(m.as_mut_slice::<u16>()),
                v: bytemuck::cast_slice_mut(v.as_mut_slice::<u16>()),
                noise: MomentNoise::new(0, pass, k as u64, 0),
            },
        };
        adam.step_moments(p, moments, Grads::F32(grads), ParamCopy::None, pass, 1.0, true);
    }
}

/// The update's sweep, rehearsed on the drive: 8 groups of the run's largest group size (at most 32M
/// parameters each) of master weights and moments in the run's format, on `dirs`
/// (`.zerostream-measure` subdirectories, striped as the run's state is, removed afterwards), swept
/// three times by the trainer's own pipeline (read ahead, the run's update, write back); the last two sweeps'
/// bytes read and written per second. Gigabytes, not a burst: a drive (or a virtual disk's host cache) runs far
/// faster for a moment than for a sweep's minutes, and the sweep's three stages set its pace as much
/// as the drive does.
fn measure_drive(dirs: &[PathBuf], train: &TrainConfig, group_elems: usize) -> Result<(f64, f64)> {
    const PASSES: u64 = 3;
    let subdirs: Vec<PathBuf> = dirs.iter().map(|d| d.join(".zerostream-measure")).collect();
    let result = (|| -> Result<(f64, f64)> {
        let io = IoEngine::new(train.io).context("--io-engine/--block-size/--queue-depth")?;
        let nvme = NvmeDir::striped(&subdirs, io, train.verify, 0)?;
        let n = group_elems.clamp(1 << 20, 32 << 20);
        let moment_bytes = train.adam_state.moment_bytes();
        let new = |name: &str, bytes: usize| -> Result<Stored> {
            let mut t = Stored::new(name, bytes, Tier::Nvme, Some(&nvme))?;
            t.page_in_zeroed(Some(&nvme));
            t.page_out(Some(&nvme), true)?;
            Ok(t)
        };
        let mut groups = (0..8)
            .map(|k| {
                let moments =
                    train.optimizer.moment_names().iter().map(|m| new(&format!("g{k}.{m}"), moment_bytes * n)).collect::<Result<_>>()?;
                Ok(Group { master: new(&format!("g{k}.master"), 4 * n)?, moments })
            })
            .collect::<Result<Vec<_>>>()?;
        // The run's update rule: AdamW, or LAMB's and LARS's two passes (fp32 moments).
        let layerwise = super::super::layerwise_config(train).map(|config| Layerwise::new(config, train.adam_threads));
        let adam = AdamW::new(adam_config(train), train.adam_threads, DEFAULT_CHUNK_ELEMS);
        let grads = vec![1e-3f32; n];
        let nv = &nvme;
        let (mut timed, mut cpu_start) = (None, None);
        for pass in 1..=PASSES {
            if pass == 2 {
                timed = Some(Instant::now()); // the first pass writes the files' first bytes
                cpu_start = super::super::report::process_cpu_seconds();
            }
            let load = |g: &mut Group| Stored::page_in_all(&mut g.all(), Some(nv));
            let store = |g: &mut Group| Stored::page_out_all(&mut g.all(), Some(nv), true);
            let compute = |k: usize, g: &mut Group| {
                g.update(k, pass, train, layerwise.as_ref(), &adam, &grads);
                Ok(())
            };
            groups = zerostream_offload::pipelined_sweep(groups, load, compute, store)?;
        }
        let moved = (PASSES - 1) as usize * 2 * groups.len() * n * train.state_bytes_per_param();
        let wall_s = timed.expect("at least two passes").elapsed().as_secs_f64();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // Unknown off Linux: taken as all of them, the cautious side.
        let cpu_share = match (cpu_start, super::super::report::process_cpu_seconds()) {
            (Some(a), Some(b)) => ((b - a) / (wall_s * cores)).clamp(0.0, 1.0),
            _ => 1.0,
        };
        Ok((moved as f64 / wall_s / 1e9, cpu_share))
    })();
    for d in &subdirs {
        let _ = std::fs::remove_dir_all(d);
    }
    result.context("timing the drive (plan --measure)")
}

fn adam_config(train: &TrainConfig) -> AdamConfig {
    let variance_frozen_after = super::super::variance_frozen_after(train);
    AdamConfig {
        lr: train.lr.peak,
        beta1: train.beta1,
        beta2: train.beta2,
        eps: train.eps,
        weight_decay: train.weight_decay,
        variance_frozen_after,
    }
}

/// The update's rate in Gparams/s (1e9 parameters a second), the best of steps 2 to 4 over 8M
/// parameters (one tensor) with the run's optimizer and moments, f32 gradients in and a bf16 working
/// copy out whatever the run's precision: AdamW's one pass, or LAMB's and LARS's two (norms, then the step).
fn measure_adam(train: &TrainConfig) -> f64 {
    let n = 8 << 20;
    let (mut p, grads) = (vec![0.5f32; n], vec![1e-3f32; n]);
    let (mut m32, mut v32) = (vec![0.0f32; n], vec![0.0f32; n]);
    let mut copy = vec![bf16::ZERO; n];
    let mut best = f64::INFINITY;
    let mut time = |step: u64, t: f64| {
        if step > 1 {
            best = best.min(t); // the first step faults the pages in
        }
    };
    if let Some(config) = super::super::layerwise_config(train) {
        let opt = Layerwise::new(config, train.adam_threads);
        if config.moments() == 1 {
            v32 = Vec::new();
        }
        for step in 1..=4u64 {
            let start = Instant::now();
            let norms = opt.measure(&p, &mut m32, &mut v32, &grads, step, 1.0, true, 0).total();
            let trust = opt.trust_ratio(norms, true);
            opt.apply(&mut p, &mut m32, &v32, &grads, ParamCopy::Bf16(&mut copy), step, 1.0, true, trust);
            time(step, start.elapsed().as_secs_f64());
        }
    } else {
        let adam = AdamW::new(adam_config(train), train.adam_threads, DEFAULT_CHUNK_ELEMS);
        let (mut m16, mut v16) = (vec![bf16::ZERO; n], vec![bf16::ZERO; n]);
        for step in 1..=4u64 {
            let moments = match train.adam_state {
                AdamState::Fp32 => Moments::F32 { m: &mut m32, v: &mut v32 },
                AdamState::Bf16 => Moments::Bf16 { m: &mut m16, v: &mut v16, noise: MomentNoise::new(0, step, 0, 0) },
            };
            let start = Instant::now();
            adam.step_moments(&mut p, moments, Grads::F32(&grads), ParamCopy::Bf16(&mut copy), step, 1.0, true);
            time(step, start.elapsed().as_secs_f64());
        }
    }
    n as f64 / best / 1e9
}

#[derive(Clone)]
struct DeviceTiming {
    /// Kernels and transfers, per step, and of them those before the vocabulary head.
    device_s: f64,
    forward_s: f64,
    upload_s: f64,
    upload_bytes: u64,
}

/// Bytes a parameter of a device cut holds in RAM: master weights, moments, gradient, working copy.
const MAX_BYTES_PER_PARAM: usize = 20;

/// Steps of each cut: a warm-up and three timed.
const DEVICE_STEPS: u64 = 4;

/// The device thread's time per step (the fastest of three after a warm-up) on `layers` blocks of
/// `model`, every kind of state in RAM.
fn measure_device<D: Backend>(dev: &D, model: &Model, train: &TrainConfig, layers: usize) -> Result<DeviceTiming> {
    let cut = model.with_layers(layers);
    let tc = TrainConfig {
        steps: DEVICE_STEPS,
        offload_optimizer: Tier::Ram,
        offload_gradients: None,
        offload_params: Tier::Ram,
        nvme_dirs: Vec::new(),
        sequential: false,
        ..train.clone()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(train.seed);
    let vocab = cut.vocab_size() as u32;
    // Enough windows for a few steps' micro-batches; past them the data wraps round, which times the same.
    let windows = tc.grad_accum.min(8) * 8;
    let tokens: Vec<u32> = (0..(tc.batch * tc.seq_len + 1) * windows).map(|_| rng.random_range(0..vocab)).collect();
    let data = TokenFile::from_ids("plan --measure", &tokens);
    let mut trainer = Trainer::new(dev, &ModelSource::Random { model: cut, seed: train.seed }, tc)
        .with_context(|| format!("timing the device on {} of the model", crate::words::counted(layers as u64, "block")))?;
    trainer.sync_forward = true;
    // The fastest of three steps after a warm-up: noise only adds.
    let mut best = DeviceTiming { device_s: f64::INFINITY, forward_s: 0.0, upload_s: 0.0, upload_bytes: 0 };
    for step in 0..DEVICE_STEPS {
        let r = trainer.train_step(&data)?;
        let device_s = r.compute_s + r.upload_s + r.download_s;
        if step > 0 && device_s < best.device_s {
            best = DeviceTiming { device_s, forward_s: r.forward_device_s, upload_s: r.upload_s, upload_bytes: r.upload_bytes };
        }
    }
    trainer.finish()?;
    Ok(best)
}
