//! Device time of recorded work, for `zerostream bench kernels`: GPU timestamps written between the
//! repetitions of an op, in the device's own command stream, where the adapter has timestamp queries;
//! otherwise the wall clock around each repetition's submit-and-wait. Also the device-to-device copy
//! bandwidth, the measured ceiling of the memory-bound kernels.

use std::sync::mpsc::{Receiver, channel};
use std::time::Instant;

use anyhow::{Result, anyhow, bail};

use super::gpu::GpuDevice;

/// How a time was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// Timestamp queries on the device: the op's own time, no submission or CPU wait in it.
    GpuTimestamps,
    /// The host clock around submit and wait: includes the submission and wake-up latency of each repetition.
    WallClock,
}

impl Timer {
    pub fn name(self) -> &'static str {
        match self {
            Timer::GpuTimestamps => "gpu-timestamps",
            Timer::WallClock => "wall-clock",
        }
    }
}

/// The time of each repetition of an op.
#[derive(Clone, Debug)]
pub struct Timing {
    pub timer: Timer,
    pub rep_seconds: Vec<f64>,
}

impl Timing {
    /// The median repetition: robust to the one that straddles a submission.
    pub fn median_s(&self) -> f64 {
        let mut s = self.rep_seconds.clone();
        s.sort_by(f64::total_cmp);
        if s.is_empty() { f64::NAN } else { s[s.len() / 2] }
    }
}

/// Most timestamps one query set holds (wgpu's limit).
const MAX_QUERIES: usize = wgpu::QUERY_SET_MAX_QUERIES as usize;

impl GpuDevice {
    /// GPU timestamps if this device writes them (wgpu's `TIMESTAMP_QUERY`, requested whenever the
    /// adapter has it), else the wall clock.
    pub fn best_timer(&self) -> Timer {
        if self.device.features().contains(wgpu::Features::TIMESTAMP_QUERY) { Timer::GpuTimestamps } else { Timer::WallClock }
    }

    /// Runs `op` (which records work on this device) `reps` times after everything recorded so far, and
    /// returns the time of each repetition, taken with `timer` (GPU timestamps only where [`Self::best_timer`] has them).
    pub fn time_reps(&self, reps: usize, timer: Timer, mut op: impl FnMut()) -> Result<Timing> {
        let reps = reps.clamp(1, MAX_QUERIES - 1);
        if timer == Timer::WallClock || self.best_timer() == Timer::WallClock {
            let mut rep_seconds = Vec::with_capacity(reps);
            self.synchronize();
            for _ in 0..reps {
                let start = Instant::now();
                op();
                self.synchronize();
                rep_seconds.push(start.elapsed().as_secs_f64());
            }
            return Ok(Timing { timer: Timer::WallClock, rep_seconds });
        }
        let queries = reps + 1;
        let set = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("bench timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: queries as u32,
        });
        let bytes = (queries * 8) as u64;
        let resolved = self.plain_buffer(bytes, wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, "timestamps");
        let readback = self.plain_buffer(bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, "timestamps read-back");
        self.synchronize();
        self.mark(&set, 0);
        for i in 0..reps {
            op();
            self.mark(&set, i as u32 + 1);
        }
        self.record(|e| {
            e.resolve_query_set(&set, 0..queries as u32, &resolved, 0);
            e.copy_buffer_to_buffer(&resolved, 0, &readback, 0, bytes);
        });
        self.synchronize();
        let ticks: Vec<u64> = {
            self.wait_for_map(map_read(&readback))?;
            let view = readback.slice(..).get_mapped_range().map_err(|e| anyhow!("reading timestamps: {e}"))?;
            bytemuck::cast_slice::<u8, u64>(&view).to_vec()
        };
        readback.unmap();
        let ns_per_tick = self.queue.get_timestamp_period() as f64;
        let rep_seconds = ticks.windows(2).map(|w| w[1].wrapping_sub(w[0]) as f64 * ns_per_tick * 1e-9).collect();
        Ok(Timing { timer: Timer::GpuTimestamps, rep_seconds })
    }

    /// Device-to-device copy of `bytes` (at most the adapter's largest buffer), GB/s of the median of
    /// `reps` counting bytes read plus written; returns the rate and the bytes copied.
    pub fn copy_gbps(&self, bytes: u64, reps: usize, timer: Timer) -> Result<(f64, u64)> {
        if bytes == 0 || !bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
            bail!("copy size {bytes} bytes: must be a positive multiple of {}", wgpu::COPY_BUFFER_ALIGNMENT);
        }
        let bytes = bytes.min(self.device.limits().max_buffer_size / wgpu::COPY_BUFFER_ALIGNMENT * wgpu::COPY_BUFFER_ALIGNMENT);
        let _charges = (self.budget.charge(bytes, "copy source")?, self.budget.charge(bytes, "copy target")?);
        let src = self.plain_buffer(bytes, wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST, "copy source");
        let dst = self.plain_buffer(bytes, wgpu::BufferUsages::COPY_DST, "copy target");
        // Not zeros: some devices move zeros faster than data.
        let pattern: Vec<u32> = (0..(bytes / 4).min(1 << 22) as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        let pattern_bytes: &[u8] = bytemuck::cast_slice(&pattern);
        for offset in (0..bytes).step_by(pattern_bytes.len()) {
            let n = (bytes - offset).min(pattern_bytes.len() as u64) as usize;
            self.queue.write_buffer(&src, offset, &pattern_bytes[..n]);
        }
        let copy = || self.record(|e| e.copy_buffer_to_buffer(&src, 0, &dst, 0, bytes));
        copy(); // warm-up
        let timing = self.time_reps(reps, timer, copy)?;
        Ok((2.0 * bytes as f64 / timing.median_s() / 1e9, bytes))
    }

    /// A timestamp after every command recorded so far: an empty compute pass whose start writes it
    /// (needs only `TIMESTAMP_QUERY`, not the inside-encoder or inside-pass features).
    fn mark(&self, set: &wgpu::QuerySet, index: u32) {
        self.record(|e| {
            let _pass = e.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("timestamp"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: set,
                    beginning_of_pass_write_index: Some(index),
                    end_of_pass_write_index: None,
                }),
            });
        });
    }

    fn plain_buffer(&self, bytes: u64, usage: wgpu::BufferUsages, label: &str) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size: bytes, usage, mapped_at_creation: false })
    }

    fn wait_for_map(&self, rx: Receiver<Result<(), wgpu::BufferAsyncError>>) -> Result<()> {
        loop {
            if let Ok(r) = rx.try_recv() {
                return r.map_err(|e| anyhow!("mapping the timestamp buffer failed: {e}"));
            }
            Self::wait_for_submission(&self.device, None)?;
        }
    }
}

fn map_read(buffer: &wgpu::Buffer) -> Receiver<Result<(), wgpu::BufferAsyncError>> {
    let (tx, rx) = channel();
    buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    rx
}
