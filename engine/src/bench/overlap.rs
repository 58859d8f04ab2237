//! `zerostream bench overlap`: whether host-to-device copies run while kernels do. wgpu gives one
//! queue; the trainer records a block's kernels, submits them, and then issues the next block's
//! upload (`GpuDevice::upload`, before the next submission), hoping the copy engine moves it while the
//! compute units work. Whether a driver overlaps the two on one queue decides the design of the
//! staging path (issue #22 item 4), so this measures it directly, for each way of moving the bytes:
//! the copy alone, a run of matmuls alone (as many as take about as long as the copy, so a full
//! overlap would halve the pair), and the matmuls submitted first with the copy issued behind them.
//! `hidden` is the share of the shorter of the two that the pair saved: 1 when it ran wholly under the
//! other, 0 when they ran one after the other. Every copy's bytes are read back and checked. Last, the
//! same for the way back: the trainer's gradient download (`Backend::begin_read`, finished by
//! `finish_read`) issued behind the matmuls. Then, on each copy queue a Vulkan device has beside
//! wgpu's (`gpu/copy_queue.rs`), a copy each way while the matmuls run on wgpu's queue: whether a
//! second queue hides what one serialises.

use std::time::Instant;

use anyhow::{Result, bail};

use crate::device::gpu::CopyQueueKind;
use crate::device::gpu::GpuTensor;
use crate::device::transfer::TransferMethod;
use crate::device::{Backend, GpuDevice, MatmulShape};

/// What `bench overlap` moves and computes.
#[derive(Clone, Debug)]
pub struct OverlapConfig {
    /// Bytes of each copy (a block's working copy: GPT-2 124M's is 28 MB in fp32).
    pub bytes: u64,
    /// The matmul run beside it: C (m, n) = A (m, k) @ B (k, n).
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Timed repetitions of each measurement; the best is kept.
    pub reps: usize,
}

impl OverlapConfig {
    /// A GPT-2 124M block's working copy (fp32, rounded to 32 MiB) beside its MLP's first product at
    /// B=4, T=1024.
    pub fn gpt2() -> Self {
        OverlapConfig { bytes: 32 << 20, m: 4096, n: 3072, k: 768, reps: 3 }
    }
}

/// One transfer method's measurement.
#[derive(Clone, Debug)]
pub struct OverlapRun {
    /// `h2d Direct`, `h2d Parallel`, `h2d StagingRing`, `h2d HostRing`, `h2d Pinned`, `h2d Prestaged` or
    /// `d2h begin_read`.
    pub method: String,
    pub bytes: u64,
    /// Matmuls in the run beside the copy.
    pub matmuls: usize,
    pub copy_s: f64,
    pub kernels_s: f64,
    pub both_s: f64,
}

impl OverlapConfig {
    /// Refuses, by flag, a copy or a matmul no run can make (before anything is printed or allocated).
    pub fn check(&self) -> Result<()> {
        if self.bytes == 0 || !self.bytes.is_multiple_of(4 * wgpu::COPY_BUFFER_ALIGNMENT) {
            bail!("--bytes {}: must be a positive multiple of 16", self.bytes);
        }
        if [self.m, self.n, self.k].contains(&0) {
            bail!("the matmul's --m, --n and --k must be positive (got {} x {} x {})", self.m, self.n, self.k);
        }
        Ok(())
    }
}

impl OverlapRun {
    /// The share of the shorter part hidden under the longer: (copy + kernels - both) / min(copy,
    /// kernels). Near 1: they overlap; near 0 (or below, with noise): they serialise. Above 1 only by
    /// noise: both together timed shorter than the longer part alone.
    pub fn hidden(&self) -> f64 {
        (self.copy_s + self.kernels_s - self.both_s) / self.copy_s.min(self.kernels_s)
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "method": self.method, "bytes": self.bytes, "matmuls": self.matmuls,
            "copy_s": self.copy_s, "kernels_s": self.kernels_s, "both_s": self.both_s, "hidden": self.hidden(),
        })
    }
}

/// A row's timings (see [`OverlapRun`]).
struct Timings {
    matmuls: usize,
    copy_s: f64,
    kernels_s: f64,
    both_s: f64,
}

impl OverlapRun {
    fn new(method: String, bytes: u64, t: Timings) -> Self {
        OverlapRun { method, bytes, matmuls: t.matmuls, copy_s: t.copy_s, kernels_s: t.kernels_s, both_s: t.both_s }
    }
}

/// The matmul run and the copy's target, allocated once.
struct Work<'d> {
    dev: &'d GpuDevice,
    shape: MatmulShape,
    c: GpuTensor,
    a: GpuTensor,
    b: GpuTensor,
    dst: GpuTensor,
}

impl Work<'_> {
    fn record_matmuls(&self, count: usize) {
        for _ in 0..count {
            self.dev.matmul(&self.c, &self.a, &self.b, None, &self.shape, false);
        }
    }

    /// A row's three timings: `copy` alone (after one untimed run), a matmul run of about its length
    /// alone, and both at once, after `before_both` (untimed).
    fn time_beside<T>(
        &self,
        reps: usize,
        one_matmul: f64,
        mut copy: impl FnMut() -> Result<T>,
        before_both: impl FnOnce() -> Result<()>,
    ) -> Result<Timings> {
        self.best(1, &mut copy)?;
        let copy_s = self.best(reps, &mut copy)?;
        let matmuls = ((copy_s / one_matmul).round() as usize).clamp(1, 1000);
        let kernels_s = self.best(reps, || {
            self.record_matmuls(matmuls);
            Ok(())
        })?;
        before_both()?;
        let both_s = self.best(reps, || {
            self.record_matmuls(matmuls);
            self.dev.submit_recorded();
            copy()
        })?;
        Ok(Timings { matmuls, copy_s, kernels_s, both_s })
    }

    /// Best seconds of `reps` runs of `f`, each from an idle device to an idle device (what `f`
    /// returns lives until the device is idle again).
    fn best<T>(&self, reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            self.dev.synchronize();
            let start = Instant::now();
            let in_flight = f()?;
            self.dev.synchronize();
            best = best.min(start.elapsed().as_secs_f64());
            drop(in_flight);
        }
        Ok(best)
    }
}

/// Times each transfer method alone, beside a matmul run of about its length, and both together;
/// `on_run` sees each as it is measured.
pub fn bench_overlap(dev: &GpuDevice, cfg: &OverlapConfig, mut on_run: impl FnMut(&OverlapRun)) -> Result<Vec<OverlapRun>> {
    cfg.check()?;
    let words = (cfg.bytes / 4) as usize;
    let work = Work {
        dev,
        shape: MatmulShape::row_major(cfg.m, cfg.n, cfg.k),
        c: dev.alloc(cfg.m * cfg.n, "overlap C")?,
        a: dev.alloc(cfg.m * cfg.k, "overlap A")?,
        b: dev.alloc(cfg.k * cfg.n, "overlap B")?,
        dst: dev.alloc(words, "overlap copy target")?,
    };
    dev.fill(&work.a, 0.5);
    dev.fill(&work.b, 0.25);
    // Untimed: the first matmul compiles its pipeline.
    work.record_matmuls(1);
    dev.synchronize();
    let one_matmul = work.best(cfg.reps, || {
        work.record_matmuls(1);
        Ok(())
    })?;
    let mut runs = Vec::new();
    let mut on_row = |run: OverlapRun| {
        on_run(&run);
        runs.push(run);
    };
    let mut last_written = Vec::new();
    for (i, method) in crate::bench::transfer::h2d_methods(dev, cfg.bytes).into_iter().enumerate() {
        let (run, written) = upload_run(&work, cfg, one_matmul, method, i as u32)?;
        on_row(run);
        last_written = written;
    }
    // The way back: what the last upload left in the target, downloaded as the trainer downloads a
    // block's gradients while the next block's backward runs.
    let mut got = Vec::new();
    let download = || -> Result<()> {
        got = dev.finish_read(dev.begin_read(&[&work.dst]));
        Ok(())
    };
    let timings = work.time_beside(cfg.reps, one_matmul, download, || Ok(()))?;
    let got_words: Vec<u32> = got.concat().iter().map(|x| x.to_bits()).collect();
    if got_words != last_written {
        bail!("bench overlap: the download did not return the bytes on the device");
    }
    on_row(OverlapRun::new("d2h begin_read".into(), cfg.bytes, timings));
    for (i, kind) in dev.copy_queue_kinds().into_iter().enumerate() {
        queue_runs(&work, cfg, one_matmul, kind, i as u32)?.into_iter().flatten().for_each(&mut on_row);
    }
    Ok(runs)
}

/// The row of one upload method (`bench h2d`'s), and the words it left in the target.
fn upload_run(work: &Work<'_>, cfg: &OverlapConfig, one_matmul: f64, method: TransferMethod, seed: u32) -> Result<(OverlapRun, Vec<u32>)> {
    let dev = work.dev;
    // Different bytes per method, so a copy that never happened cannot pass for the last one's.
    let host_words: Vec<u32> = (0..cfg.bytes / 4).map(|w| (w as u32).wrapping_mul(2654435761).wrapping_add(seed)).collect();
    let host: &[u8] = bytemuck::cast_slice(&host_words);
    // A prestaged copy's bytes wait in staging memory filled here, untimed.
    let staged = if method == TransferMethod::Prestaged { Some(dev.prestage(host)?) } else { None };
    // A pinned copy's bytes wait in pinned host memory, likewise.
    let pinned = if method == TransferMethod::Pinned { Some(dev.pinned_copy_of(host)?) } else { None };
    let issue = || match (&staged, &pinned) {
        (Some(staged), _) => dev.issue_prestaged_into(&work.dst, staged),
        (None, Some(pinned)) => dev.issue_h2d_into(&work.dst, pinned.bytes(), method),
        (None, None) => dev.issue_h2d_into(&work.dst, host, method),
    };
    // The first copy of a method is untimed (wgpu grows its staging memory on it); the target is
    // cleared before the last, so the check below sees what it delivered.
    let clear = || {
        dev.fill(&work.dst, 0.0);
        Ok(())
    };
    let timings = work.time_beside(cfg.reps, one_matmul, issue, clear)?;
    if dev.read_words(&work.dst) != host_words {
        bail!("bench overlap: the {method:?} copy did not deliver its bytes");
    }
    Ok((OverlapRun::new(format!("h2d {method:?}"), cfg.bytes, timings), host_words))
}

/// The rows of one copy queue (`gpu/copy_queue.rs`): a copy from host memory into the target, then
/// the target's bytes back into host memory, each on that queue beside matmuls on wgpu's. Each copy's
/// bytes are checked: the upload's read back on the same queue, and on wgpu's where the queue is of
/// wgpu's family. None (and a warning) where the adapter makes no host buffer.
fn queue_runs(work: &Work<'_>, cfg: &OverlapConfig, one_matmul: f64, kind: CopyQueueKind, seed: u32) -> Result<Option<[OverlapRun; 2]>> {
    let dev = work.dev;
    let bytes = cfg.bytes;
    let host_words: Vec<u32> = (0..bytes / 4).map(|w| (w as u32).wrapping_mul(40503).wrapping_add(0x5eed + seed)).collect();
    let host_bytes: &[u8] = bytemuck::cast_slice(&host_words);
    let (mut src, mut back) = match (dev.host_buffer(bytes as usize), dev.host_buffer(bytes as usize)) {
        (Ok(src), Ok(back)) => (src, back),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("bench overlap: no rows for the {}: {e:#}", kind.name());
            return Ok(None);
        }
    };
    src.write(dev, host_bytes)?;
    let zeros = vec![0; bytes as usize];
    let mut rows = Vec::new();
    for direction in ["h2d", "d2h"] {
        // Cleared, so a copy down that never happened cannot pass.
        back.write(dev, &zeros)?;
        let copy = || match direction {
            "h2d" => dev.copy_host_to_tensor_on(kind, &src, &work.dst, bytes),
            _ => dev.copy_tensor_to_host_on(kind, &work.dst, &mut back, bytes),
        };
        let timings = work.time_beside(cfg.reps, one_matmul, copy, || Ok(()))?;
        if direction == "h2d" {
            // The target read on wgpu's queue (what its kernels would see: not for a transfer-only
            // family's queue, whose writes are undefined there without an ownership transfer), then
            // on the same queue into cleared host memory.
            if kind != CopyQueueKind::TransferFamily {
                let on_wgpu: Vec<u32> = dev.finish_read(dev.begin_read(&[&work.dst])).concat().iter().map(|x| x.to_bits()).collect();
                if on_wgpu != host_words {
                    bail!("bench overlap: wgpu's queue did not see the bytes the {} copied up", kind.describe());
                }
            }
            back.write(dev, &zeros)?;
            dev.copy_tensor_to_host_on(kind, &work.dst, &mut back, bytes)?;
        }
        if back.bytes(dev)? != host_bytes {
            bail!("bench overlap: the copy {direction} on {} did not deliver its bytes", kind.describe());
        }
        rows.push(OverlapRun::new(format!("{direction} {}", kind.name()), bytes, timings));
    }
    Ok(Some(rows.try_into().expect("two directions")))
}
