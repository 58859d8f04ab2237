//! `zerostream bench adam`: the CPU AdamW update in parameters per second, against the machine's memory
//! bandwidth (a triad) measured in the same run.

use std::time::Instant;

use anyhow::{Result, bail};
use half::{bf16, f16};
use rayon::prelude::*;
use zerostream_offload::adam::{self, AdamConfig, AdamW, DEFAULT_CHUNK_ELEMS, Grads, MomentNoise, Moments, ParamCopy};

use crate::train::AdamState;
use zerostream_offload::membw;

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
    pub reps: usize,
}

#[derive(Clone, Debug)]
pub struct AdamBenchReport {
    pub params: usize,
    pub threads: usize,
    pub isa: &'static str,
    pub grad: HalfOrFull,
    pub copy: HalfOrFull,
    pub moments: AdamState,
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
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "params": self.params, "threads": self.threads, "isa": self.isa,
            "grad": format!("{:?}", self.grad).to_lowercase(), "copy": format!("{:?}", self.copy).to_lowercase(),
            "adam_state": self.moments.name(),
            "seconds_per_step": self.seconds_per_step, "gparams_per_s": self.gparams_per_s,
            "bytes_per_param": self.bytes_per_param, "adam_gbps": self.adam_gbps,
            "triad_gbps": self.triad_gbps, "fraction_of_triad": self.fraction_of_triad(),
        })
    }
}

/// Best-of-`reps` AdamW step time over `params` parameters, and the triad bandwidth on the same threads.
pub fn bench_adam(cfg: &AdamBenchConfig) -> Result<AdamBenchReport> {
    if cfg.params == 0 || cfg.reps == 0 {
        bail!("--params and --reps must be positive");
    }
    let adam = AdamW::new(AdamConfig::default(), cfg.threads, DEFAULT_CHUNK_ELEMS);
    let n = cfg.params;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(adam.threads()).build()?;
    eprintln!("bench adam: {n} parameters, {} threads, {} instructions; allocating...", adam.threads(), adam.isa().name());
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
    let mut copy16 = vec![f16::ZERO; if cfg.copy == HalfOrFull::F16 { n } else { 0 }];
    let mut copyb16 = vec![bf16::ZERO; if cfg.copy == HalfOrFull::Bf16 { n } else { 0 }];
    let grads = match cfg.grad {
        HalfOrFull::F32 => Grads::F32(&g32),
        HalfOrFull::F16 => Grads::F16(&g16),
        HalfOrFull::Bf16 => Grads::Bf16(&gb16),
    };
    let mut best = f64::INFINITY;
    for step in 1..=cfg.reps as u64 + 1 {
        let copy = match cfg.copy {
            HalfOrFull::F32 => ParamCopy::None,
            HalfOrFull::F16 => ParamCopy::F16(&mut copy16),
            HalfOrFull::Bf16 => ParamCopy::Bf16(&mut copyb16),
        };
        let [m16, v16] = &mut moments16;
        let moments = if bf16_moments {
            Moments::Bf16 { m: m16, v: v16, noise: MomentNoise::new(0, step, 0, 0) }
        } else {
            Moments::F32 { m: &mut m, v: &mut v }
        };
        let start = Instant::now();
        adam.step_moments(&mut p, moments, grads, copy, step, 1.0, true);
        let t = start.elapsed().as_secs_f64();
        if step > 1 {
            best = best.min(t); // the first step faults pages in
        }
    }
    eprintln!("bench adam: measuring memory bandwidth (triad)...");
    drop((g16, gb16, copy16, copyb16));
    let triad = membw::triad_gbps(&pool, n.max(1 << 24), cfg.reps.max(3));
    let copy_bytes = if cfg.copy == HalfOrFull::F32 { 0 } else { 2 };
    // bf16 moments: 2 of the 4 bytes of each moment, read and written.
    let bytes_per_param = adam::bytes_per_param(grads_elem_bytes(cfg.grad), copy_bytes) - if bf16_moments { 8 } else { 0 };
    Ok(AdamBenchReport {
        params: n,
        threads: adam.threads(),
        isa: adam.isa().name(),
        grad: cfg.grad,
        copy: cfg.copy,
        moments: cfg.moments,
        seconds_per_step: best,
        gparams_per_s: n as f64 / best / 1e9,
        bytes_per_param,
        adam_gbps: (bytes_per_param * n) as f64 / best / 1e9,
        triad_gbps: triad,
    })
}

fn grads_elem_bytes(g: HalfOrFull) -> usize {
    if g == HalfOrFull::F32 { 4 } else { 2 }
}
