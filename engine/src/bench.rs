//! `zerostream bench ...`: measurements of each link of the offload path: `adam` (the CPU AdamW against
//! the machine's memory bandwidth measured in the same run) and `h2d`/`d2h` (host<->device through
//! wgpu). `bench io` is in [`crate::bench_io`].

use std::time::Instant;

use anyhow::{Result, bail};
use half::{bf16, f16};
use rayon::prelude::*;
use zerostream_offload::adam::{self, AdamConfig, AdamW, DEFAULT_CHUNK_ELEMS, Grads, ParamCopy};
use zerostream_offload::membw;

use crate::device::GpuDevice;
use crate::device::transfer::TransferMethod;

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
    pub reps: usize,
}

#[derive(Clone, Debug)]
pub struct AdamBenchReport {
    pub params: usize,
    pub threads: usize,
    pub isa: &'static str,
    pub grad: HalfOrFull,
    pub copy: HalfOrFull,
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
    let (mut p, mut m, mut v) = (filled(0.5), filled(0.0), filled(0.0));
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
        let start = Instant::now();
        adam.step(&mut p, &mut m, &mut v, grads, copy, step, 1.0, true);
        let t = start.elapsed().as_secs_f64();
        if step > 1 {
            best = best.min(t); // the first step faults pages in
        }
    }
    eprintln!("bench adam: measuring memory bandwidth (triad)...");
    drop((g16, gb16, copy16, copyb16));
    let triad = membw::triad_gbps(&pool, n.max(1 << 24), cfg.reps.max(3));
    let copy_bytes = if cfg.copy == HalfOrFull::F32 { 0 } else { 2 };
    let bytes_per_param = adam::bytes_per_param(grads_elem_bytes(cfg.grad), copy_bytes);
    Ok(AdamBenchReport {
        params: n,
        threads: adam.threads(),
        isa: adam.isa().name(),
        grad: cfg.grad,
        copy: cfg.copy,
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

/// Which way bytes cross.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    HostToDevice,
    DeviceToHost,
}

/// One size and method of `bench h2d` / `bench d2h`: the best of its repetitions.
#[derive(Clone, Debug)]
pub struct TransferRun {
    pub link: Link,
    pub method: TransferMethod,
    pub bytes: u64,
    pub gbps: f64,
}

impl TransferRun {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "link": if self.link == Link::HostToDevice { "h2d" } else { "d2h" },
            "method": format!("{:?}", self.method), "bytes": self.bytes, "gbps": self.gbps,
        })
    }
}

/// Host<->device GB/s for each size and method, best of `reps`; the data is checked once per size.
pub fn bench_transfer(
    dev: &GpuDevice,
    link: Link,
    sizes: &[u64],
    reps: usize,
    mut on_run: impl FnMut(&TransferRun),
) -> Result<Vec<TransferRun>> {
    let mut runs = Vec::new();
    for &bytes in sizes {
        if bytes == 0 || bytes % wgpu::COPY_BUFFER_ALIGNMENT != 0 {
            bail!("transfer size {bytes} bytes: must be a positive multiple of {} (wgpu's copy alignment)", wgpu::COPY_BUFFER_ALIGNMENT);
        }
        let mut host: Vec<u8> = (0..bytes).map(|i| (i % 253) as u8).collect();
        // A download has no parallel variant (one copy out of the mapped read-back buffer).
        let methods: &[TransferMethod] = match link {
            Link::HostToDevice => &[TransferMethod::Direct, TransferMethod::Parallel, TransferMethod::StagingRing],
            Link::DeviceToHost => &[TransferMethod::Direct, TransferMethod::StagingRing],
        };
        for &method in methods {
            let mut best = f64::INFINITY;
            for _ in 0..reps.max(1) {
                let seconds = match link {
                    Link::HostToDevice => dev.time_h2d(&host, method)?,
                    Link::DeviceToHost => {
                        let expected = host.clone();
                        let s = dev.time_d2h(&mut host, method)?;
                        if host != expected {
                            bail!("d2h {method:?} of {bytes} bytes returned different data");
                        }
                        s
                    }
                };
                best = best.min(seconds);
            }
            let run = TransferRun { link, method, bytes, gbps: bytes as f64 / best / 1e9 };
            on_run(&run);
            runs.push(run);
        }
    }
    Ok(runs)
}

/// Single-thread memcpy GB/s over `bytes`: the ceiling of a staging copy on the host side.
pub fn memcpy_gbps(bytes: usize, reps: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best / 1e9
}

/// What a link of `bench all` is measured against.
#[derive(Clone, Debug)]
pub struct Ceiling {
    pub name: String,
    pub gbps: f64,
    /// Why a link can come out above this ceiling (it is a reference measured in the same run, not a
    /// physical bound), printed whenever one does.
    pub exceeded_because: String,
}

/// One row of `bench all`: a link, its GB/s and the ceiling it is held against (none for a row that is
/// itself the ceiling of others).
#[derive(Clone, Debug)]
pub struct LinkRow {
    pub link: String,
    pub gbps: f64,
    pub ceiling: Option<Ceiling>,
}

impl LinkRow {
    /// The link as a fraction of its ceiling, when it has one that was measured.
    pub fn fraction(&self) -> Option<f64> {
        self.ceiling.as_ref().filter(|c| c.gbps.is_finite() && c.gbps > 0.0).map(|c| self.gbps / c.gbps)
    }

    /// The ceiling column: "name (85%)", with the reason when the link is above it.
    pub fn ceiling_text(&self) -> String {
        match (&self.ceiling, self.fraction()) {
            (None, _) => "(a ceiling itself)".to_string(),
            (Some(c), None) => format!("{} (not measured)", c.name),
            (Some(c), Some(f)) if f > 1.0 => format!("{} ({:.0}%: above it, because {})", c.name, 100.0 * f, c.exceeded_because),
            (Some(c), Some(f)) => format!("{} ({:.0}%)", c.name, 100.0 * f),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "link": self.link, "gbps": self.gbps });
        if let Some(c) = &self.ceiling {
            v["ceiling"] = c.name.clone().into();
            v["ceiling_gbps"] = if c.gbps.is_finite() { c.gbps.into() } else { serde_json::Value::Null };
            if let Some(f) = self.fraction() {
                v["fraction_of_ceiling"] = f.into();
                if f > 1.0 {
                    v["above_ceiling_because"] = c.exceeded_because.clone().into();
                }
            }
        }
        v
    }
}

/// `bench all`'s table: each link once, beside its own ceiling.
pub fn links_table(rows: &[LinkRow]) -> String {
    let mut out = format!("{:<60} {:>9} {:>9}  ceiling\n", "link", "GB/s", "ceiling");
    for r in rows {
        let ceiling_gbps = r.ceiling.as_ref().map_or(String::new(), |c| format!("{:.2}", c.gbps));
        out += &format!("{:<60} {:>9.2} {:>9}  {}\n", r.link, r.gbps, ceiling_gbps, r.ceiling_text());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(link: &str, gbps: f64, ceiling_gbps: f64) -> LinkRow {
        LinkRow {
            link: link.into(),
            gbps,
            ceiling: Some(Ceiling { name: "fio".into(), gbps: ceiling_gbps, exceeded_because: "noise".into() }),
        }
    }

    #[test]
    fn a_link_above_its_ceiling_says_why_and_each_link_is_printed_once() {
        let rows = [
            LinkRow { link: "RAM".into(), gbps: 10.0, ceiling: None },
            row("NVMe read", 1.2, 1.0),
            row("NVMe write", 0.9, 1.0),
            row("h2d", 1.0, f64::NAN),
        ];
        let table = links_table(&rows);
        assert!(table.contains("fio (120%: above it, because noise)"), "{table}");
        assert!(table.contains("fio (90%)") && !table.contains("90%: above"), "{table}");
        assert!(table.contains("(a ceiling itself)") && table.contains("fio (not measured)"), "{table}");
        for r in &rows {
            assert_eq!(table.matches(&format!("{} ", r.link)).count(), 1, "{} printed more than once:\n{table}", r.link);
        }
        assert_eq!(rows[1].to_json()["above_ceiling_because"], "noise");
        assert!(rows[2].to_json().get("above_ceiling_because").is_none());
    }
}
