//! `zerostream bench adam`: the CPU update (AdamW, or with `--optimizer` LAMB's or LARS's two passes)
//! in parameters per second, against the machine's memory bandwidth (a triad) measured in the same run.

use std::time::Instant;

use anyhow::{Result, bail};
use half::{bf16, f16};
use rayon::prelude::*;
use zerostream_offload::adam::{self, AdamConfig, AdamW, DEFAULT_CHUNK_ELEMS, Grads, MomentNoise, Moments, ParamCopy};

use crate::train::{AdamState, Optimizer, TrainConfig};
use zerostream_offload::{Layerwise, membw};

/// Precision of the gradients fed to the update and of the parameter copy it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HalfOrFull {
    F32,
    F16,
    Bf16,
}

impl std::fmt::Display for HalfOrFull {
    /// As the flags take it: f32, f16, bf16.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HalfOrFull::F32 => "f32",
            HalfOrFull::F16 => "f16",
            HalfOrFull::Bf16 => "bf16",
        })
    }
}

#[derive(Clone, Debug)]
pub struct AdamBenchConfig {
    pub params: usize,
    pub threads: usize,
    pub grad: HalfOrFull,
    /// The 16-bit copy written for the GPU; `F32` means none.
    pub copy: HalfOrFull,
    /// The moments' format (`train --adam-state`).
    pub moments: AdamState,
    /// The update rule (`train --optimizer`).
    pub optimizer: Optimizer,
    pub reps: usize,
    /// Say on stderr what it is doing (allocating, measuring the triad); off under `--quiet`.
    pub progress: bool,
}

impl AdamBenchConfig {
    fn say(&self, line: std::fmt::Arguments<'_>) {
        if self.progress {
            eprintln!("{line}");
        }
    }
}

#[derive(Clone, Debug)]
pub struct AdamBenchReport {
    pub params: usize,
    pub threads: usize,
    pub isa: &'static str,
    pub grad: HalfOrFull,
    pub copy: HalfOrFull,
    pub moments: AdamState,
    pub optimizer: Optimizer,
    pub seconds_per_step: f64,
    pub gparams_per_s: f64,
    pub bytes_per_param: usize,
    pub adam_gbps: f64,
    pub triad_gbps: f64,
}

impl AdamBenchReport {
    pub fn fraction_of_triad(&self) -> f64 {
        self.adam_gbps / self.triad_gbps
    }

    /// Why the update can come out above the triad, said wherever it does: the triad is a
    /// measurement of streaming from RAM, not a bound on state that fits in the caches; state larger
    /// than any CPU's caches came out above it another way.
    pub fn above_triad_because(&self) -> String {
        /// Past the largest last-level caches made (about 1.1 GiB on AMD's 3D V-Cache EPYCs).
        const LARGER_THAN_ANY_CACHE_BYTES: usize = 3 << 29;
        let state_bytes = self.bytes_per_param * self.params;
        let state_mib = state_bytes as f64 / 1048576.0;
        if state_bytes > LARGER_THAN_ANY_CACHE_BYTES {
            return format!(
                "the update's {state_mib:.0} MiB of state streams from RAM too: it reads more than it writes, which RAM serves \
                 faster than the triad's two reads per write, or the bandwidth changed between the two timings (a shared machine)"
            );
        }
        format!(
            "the update's {state_mib:.0} MiB of state may sit in this CPU's caches, where the triad's arrays are sized to stream from RAM: \
             raise --params past the cache to measure RAM"
        )
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "params": self.params, "threads": self.threads, "isa": self.isa,
            "grad": format!("{:?}", self.grad).to_lowercase(), "copy": format!("{:?}", self.copy).to_lowercase(),
            "adam_state": self.moments.name(), "optimizer": self.optimizer.name(),
            "seconds_per_step": self.seconds_per_step, "gparams_per_s": self.gparams_per_s,
            "bytes_per_param": self.bytes_per_param, "adam_gbps": self.adam_gbps,
            "triad_gbps": self.triad_gbps, "fraction_of_triad": self.fraction_of_triad(),
        });
        if self.fraction_of_triad() > 1.0 {
            v["above_triad_because"] = self.above_triad_because().into();
        }
        v
    }
}

/// The most bytes of RAM `bench adam` allocates per parameter, whatever its options.
const BENCH_BYTES_PER_PARAM: u64 = 28;

/// Best-of-`reps` AdamW step time over `params` parameters, and the triad bandwidth on the same threads.
pub fn bench_adam(cfg: &AdamBenchConfig) -> Result<AdamBenchReport> {
    if cfg.params == 0 || cfg.reps == 0 {
        bail!("--params and --reps must be positive");
    }
    if cfg.threads > zerostream_offload::MAX_THREADS {
        bail!("--threads {}: at most {} (0: one per core)", cfg.threads, zerostream_offload::MAX_THREADS);
    }
    // At most: master weights, two fp32 moments and the f32 gradient held while the triad's three f32
    // arrays are measured; besides, the gradient in f16 and bf16 and a 16-bit copy.
    let need_bytes = (cfg.params as u64).saturating_mul(BENCH_BYTES_PER_PARAM);
    crate::train::refuse_past_available_ram(
        need_bytes,
        &format!("bench adam --params {} ({BENCH_BYTES_PER_PARAM} bytes a parameter)", cfg.params),
    )?;
    if cfg.optimizer != Optimizer::Adamw {
        return bench_layerwise(cfg);
    }
    let adam = AdamW::new(AdamConfig::default(), cfg.threads, DEFAULT_CHUNK_ELEMS);
    let n = cfg.params;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(adam.threads()).build()?;
    cfg.say(format_args!("bench adam: {n} parameters, {} threads, {} instructions; allocating...", adam.threads(), adam.isa().name()));
    // First touch on the benchmark's own threads.
    let filled = |value: f32| -> Vec<f32> {
        pool.install(|| {
            let mut v = vec![0.0f32; n];
            v.par_chunks_mut(DEFAULT_CHUNK_ELEMS).for_each(|c| c.fill(value));
            v
        })
    };
    let p_init = filled(0.5);
    let mut p = p_init;
    let bf16_moments = cfg.moments == AdamState::Bf16;
    let (mut m, mut v) = if bf16_moments { (Vec::new(), Vec::new()) } else { (filled(0.0), filled(0.0)) };
    let mut moments16: [Vec<bf16>; 2] =
        std::array::from_fn(|_| if bf16_moments { pool.install(|| vec![bf16::ZERO; n]) } else { Vec::new() });
    let g32 = filled(1e-3);
    let g16: Vec<f16> = pool.install(|| g32.par_iter().map(|x| f16::from_f32(*x)).collect());
    let gb16: Vec<bf16> = pool.install(|| g32.par_iter().map(|x| bf16::from_f32(*x)).collect());
    let mut copy = CopyBuffers::new(cfg.copy, n);
    let grads = match cfg.grad {
        HalfOrFull::F32 => Grads::F32(&g32),
        HalfOrFull::F16 => Grads::F16(&g16),
        HalfOrFull::Bf16 => Grads::Bf16(&gb16),
    };
    let best = best_step_seconds(cfg.reps, |step| {
        let [m16, v16] = &mut moments16;
        let moments = if bf16_moments {
            Moments::Bf16 { m: m16, v: v16, noise: MomentNoise::new(0, step, 0, 0) }
        } else {
            Moments::F32 { m: &mut m, v: &mut v }
        };
        let start = Instant::now();
        adam.step_moments(&mut p, moments, grads, copy.param_copy(), step, 1.0, true);
        start.elapsed().as_secs_f64()
    });
    cfg.say(format_args!("bench adam: measuring memory bandwidth (triad)..."));
    drop((g16, gb16, copy));
    let triad = membw::triad_gbps(&pool, n.max(1 << 24), cfg.reps.max(3));
    let copy_bytes = if cfg.copy == HalfOrFull::F32 { 0 } else { 2 };
    // bf16 moments: 2 of the 4 bytes of each moment, read and written.
    let bytes_per_param = adam::bytes_per_param(grads_elem_bytes(cfg.grad), copy_bytes) - if bf16_moments { 8 } else { 0 };
    Ok(report(cfg, (adam.threads(), adam.isa().name()), best, bytes_per_param, triad))
}

/// The report of a run of `cfg` on `threads` with `isa`: its best step time, the bytes a parameter
/// moves, and the triad beside it.
fn report(
    cfg: &AdamBenchConfig,
    (threads, isa): (usize, &'static str),
    best: f64,
    bytes_per_param: usize,
    triad_gbps: f64,
) -> AdamBenchReport {
    let n = cfg.params;
    AdamBenchReport {
        params: n,
        threads,
        isa,
        grad: cfg.grad,
        copy: cfg.copy,
        moments: cfg.moments,
        optimizer: cfg.optimizer,
        seconds_per_step: best,
        gparams_per_s: n as f64 / best / 1e9,
        bytes_per_param,
        adam_gbps: (bytes_per_param * n) as f64 / best / 1e9,
        triad_gbps,
    }
}

/// [`bench_adam`] for LAMB and LARS: per step, the norms pass, the trust ratio and the step pass over
/// one tensor of `params` elements (f32 gradients and fp32 state, as the trainer runs them).
fn bench_layerwise(cfg: &AdamBenchConfig) -> Result<AdamBenchReport> {
    let name = cfg.optimizer.name();
    if cfg.grad != HalfOrFull::F32 {
        bail!("bench adam --optimizer {name} reads f32 gradients, as the trainer's accumulator holds them: add --grad f32");
    }
    if cfg.moments != AdamState::Fp32 {
        bail!("bench adam --optimizer {name} with --adam-state {}: the layer-wise optimizers keep fp32 state", cfg.moments.name());
    }
    let config =
        crate::train::layerwise_config(&TrainConfig { optimizer: cfg.optimizer, ..TrainConfig::default() }).expect("a layer-wise rule");
    let opt = Layerwise::new(config, cfg.threads);
    let n = cfg.params;
    cfg.say(format_args!("bench adam: {name}, {n} parameters, {} threads; allocating...", opt.threads()));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(opt.threads()).build()?;
    let filled = |value: f32, len: usize| -> Vec<f32> { pool.install(|| vec![value; len]) };
    let (mut p, grads, mut m) = (filled(0.5, n), filled(1e-3, n), filled(0.0, n));
    let mut v = filled(0.0, if config.moments() == 2 { n } else { 0 });
    let mut copy = CopyBuffers::new(cfg.copy, n);
    let best = best_step_seconds(cfg.reps, |step| {
        let start = Instant::now();
        let norms = opt.measure(&p, &mut m, &mut v, &grads, step, 1.0, true, 0).total();
        let trust = opt.trust_ratio(norms, true);
        opt.apply(&mut p, &mut m, &v, &grads, copy.param_copy(), step, 1.0, true, trust);
        start.elapsed().as_secs_f64()
    });
    cfg.say(format_args!("bench adam: measuring memory bandwidth (triad)..."));
    drop(copy);
    let triad = membw::triad_gbps(&pool, n.max(1 << 24), cfg.reps.max(3));
    // Pass 1 reads p and g (LAMB also m and v, and writes them back); pass 2 reads p and the state
    // (LARS also g) and writes p (LARS also m), and the copy.
    let copy_bytes = if cfg.copy == HalfOrFull::F32 { 0 } else { 2 };
    let bytes_per_param = copy_bytes + if config.moments() == 2 { 16 + 8 + 12 + 4 } else { 8 + 12 + 8 };
    Ok(report(cfg, (opt.threads(), opt.isa().name()), best, bytes_per_param, triad))
}

/// The 16-bit copy of the parameters an update writes (`--copy`): a buffer of the chosen format, or none.
struct CopyBuffers {
    format: HalfOrFull,
    f16: Vec<f16>,
    bf16: Vec<bf16>,
}

impl CopyBuffers {
    fn new(format: HalfOrFull, n: usize) -> Self {
        let len = |f: HalfOrFull| if format == f { n } else { 0 };
        CopyBuffers { format, f16: vec![f16::ZERO; len(HalfOrFull::F16)], bf16: vec![bf16::ZERO; len(HalfOrFull::Bf16)] }
    }

    fn param_copy(&mut self) -> ParamCopy<'_> {
        match self.format {
            HalfOrFull::F32 => ParamCopy::None,
            HalfOrFull::F16 => ParamCopy::F16(&mut self.f16),
            HalfOrFull::Bf16 => ParamCopy::Bf16(&mut self.bf16),
        }
    }
}

/// The fastest of steps 2..=reps + 1, each timed by `step(step_number)` (the first faults pages in).
fn best_step_seconds(reps: usize, mut step: impl FnMut(u64) -> f64) -> f64 {
    (1..=reps as u64 + 1).map(|n| (n, step(n))).filter(|&(n, _)| n > 1).map(|(_, t)| t).fold(f64::INFINITY, f64::min)
}

fn grads_elem_bytes(g: HalfOrFull) -> usize {
    if g == HalfOrFull::F32 { 4 } else { 2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An update above the triad says why, in the JSON as `bench all` and the text do; one below does not.
    #[test]
    fn an_update_above_the_triad_says_why() {
        let report = |adam_gbps| AdamBenchReport {
            params: 1 << 20,
            threads: 2,
            isa: "scalar",
            grad: HalfOrFull::Bf16,
            copy: HalfOrFull::Bf16,
            moments: AdamState::Fp32,
            optimizer: Optimizer::Adamw,
            seconds_per_step: 1e-3,
            gparams_per_s: 1.0,
            bytes_per_param: 28,
            adam_gbps,
            triad_gbps: 50.0,
        };
        let above = report(60.0).to_json();
        assert!(above["above_triad_because"].as_str().is_some_and(|w| w.contains("28 MiB of state") && w.contains("--params")), "{above}");
        assert!(report(40.0).to_json().get("above_triad_because").is_none());
        // 2.6 GiB of state cannot sit in a cache: not told to raise --params.
        let large = AdamBenchReport { params: 100 << 20, ..report(60.0) }.above_triad_because();
        assert!(large.contains("2800 MiB of state streams from RAM too") && !large.contains("--params"), "{large}");
    }
}
