//! How long the gpu device's kernels kept it busy, from GPU timestamps: every compute pass writes one at
//! its start and one at its end (where the adapter has `TIMESTAMP_QUERY`), each submission's pairs are
//! resolved and copied to a small read-back buffer, and [`GpuDevice::kernel_seconds`] adds up the union
//! of the passes' intervals once their submissions have run. The trainer reports it per step
//! (`time.gpu_kernels_s`, `gpu_busy_fraction`): the device's own clock, not the host's view of it.
//!
//! A child module of `gpu`: it uses the pending encoder's private hooks.

use std::cell::{Cell, RefCell};
use std::sync::mpsc::{Receiver, channel};

use super::{GpuDevice, MAX_PENDING_PASSES};

type MapResult = Receiver<Result<(), wgpu::BufferAsyncError>>;

pub(super) struct BusyClock {
    /// Two timestamps per pass of the pending encoder (at most MAX_PENDING_PASSES of them).
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    passes: Cell<u32>,
    /// Read-back buffers of submitted work, with their pass counts, waiting to be mapped.
    in_flight: RefCell<Vec<(wgpu::Buffer, u32, MapResult)>>,
    spare: RefCell<Vec<wgpu::Buffer>>,
    busy_ns: Cell<f64>,
    ns_per_tick: f64,
}

impl BusyClock {
    /// None where the device has no timestamp queries.
    pub(super) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Option<Self> {
        if !device.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
            return None;
        }
        let count = 2 * MAX_PENDING_PASSES as u32;
        let set = device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("busy clock"), ty: wgpu::QueryType::Timestamp, count });
        let resolved = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("busy clock resolved"),
            size: count as u64 * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Some(BusyClock {
            set,
            resolved,
            passes: Cell::new(0),
            in_flight: RefCell::default(),
            spare: RefCell::default(),
            busy_ns: Cell::new(0.0),
            ns_per_tick: queue.get_timestamp_period() as f64,
        })
    }

    /// The timestamp writes of the next pass of the pending encoder.
    pub(super) fn next_pass(&self) -> wgpu::ComputePassTimestampWrites<'_> {
        let i = self.passes.get();
        assert!((i as usize) < MAX_PENDING_PASSES, "more passes than the busy clock's query set holds");
        self.passes.set(i + 1);
        wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        }
    }

    /// Records, at the end of the pending encoder, the copy of its passes' timestamps into a read-back
    /// buffer; returns it (to map once submitted) with the pass count.
    pub(super) fn before_submit(&self, device: &wgpu::Device, encoder: &mut wgpu::CommandEncoder) -> Option<(wgpu::Buffer, u32)> {
        let passes = self.passes.replace(0);
        if passes == 0 {
            return None;
        }
        let bytes = 2 * MAX_PENDING_PASSES as u64 * 8;
        let readback = self.spare.borrow_mut().pop().unwrap_or_else(|| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("busy clock read-back"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        encoder.resolve_query_set(&self.set, 0..2 * passes, &self.resolved, 0);
        encoder.copy_buffer_to_buffer(&self.resolved, 0, &readback, 0, 2 * passes as u64 * 8);
        Some((readback, passes))
    }

    /// Starts mapping a submitted read-back (it completes when its submission has run).
    pub(super) fn after_submit(&self, readback: wgpu::Buffer, passes: u32) {
        let (tx, rx) = channel();
        readback.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.in_flight.borrow_mut().push((readback, passes, rx));
    }

    /// Adds the read-backs whose mapping finished (all of them after a wait); keeps the others.
    fn collect(&self) {
        let mut in_flight = self.in_flight.borrow_mut();
        let mut still = Vec::new();
        for (buffer, passes, rx) in in_flight.drain(..) {
            match rx.try_recv() {
                Ok(Ok(())) => {
                    let ticks: Vec<u64> = {
                        let view = buffer.slice(..).get_mapped_range().expect("a mapped read-back");
                        bytemuck::cast_slice::<u8, u64>(&view)[..2 * passes as usize].to_vec()
                    };
                    buffer.unmap();
                    self.busy_ns.set(self.busy_ns.get() + union_ticks(&ticks) as f64 * self.ns_per_tick);
                    self.spare.borrow_mut().push(buffer);
                }
                Ok(Err(_)) => {} // a lost device: its time is lost with it
                Err(_) => still.push((buffer, passes, rx)),
            }
        }
        *in_flight = still;
    }
}

/// Ticks covered by the union of the passes' [begin, end] intervals (passes of one submission may
/// overlap on the GPU; an interval whose end precedes its begin, as a driver may report for an empty
/// pass, counts nothing).
fn union_ticks(pairs: &[u64]) -> u64 {
    let mut spans: Vec<(u64, u64)> = pairs.chunks_exact(2).filter(|p| p[1] > p[0]).map(|p| (p[0], p[1])).collect();
    spans.sort_unstable();
    let (mut total, mut open): (u64, Option<(u64, u64)>) = (0, None);
    for (b, e) in spans {
        open = match open {
            Some((ob, oe)) if b <= oe => Some((ob, oe.max(e))),
            Some((ob, oe)) => {
                total += oe - ob;
                Some((b, e))
            }
            None => Some((b, e)),
        };
    }
    total + open.map_or(0, |(b, e)| e - b)
}

impl GpuDevice {
    /// Seconds the device's kernels have kept it busy since it was opened, by GPU timestamps, for all
    /// work recorded so far (waits for it to run); None where the adapter has no timestamp queries.
    pub fn kernel_seconds(&self) -> Option<f64> {
        let clock = self.busy.as_ref()?;
        self.synchronize();
        clock.collect();
        Some(clock.busy_ns.get() * 1e-9)
    }
}

#[cfg(test)]
mod tests {
    use super::union_ticks;

    #[test]
    fn union_of_intervals() {
        assert_eq!(union_ticks(&[]), 0);
        assert_eq!(union_ticks(&[10, 20, 30, 35]), 15);
        assert_eq!(union_ticks(&[10, 20, 15, 25]), 15, "overlapping passes count once");
        assert_eq!(union_ticks(&[30, 35, 10, 20, 12, 14]), 15, "unsorted and nested");
        assert_eq!(union_ticks(&[10, 5, 1, 2]), 1, "a reversed pair counts nothing");
    }
}
