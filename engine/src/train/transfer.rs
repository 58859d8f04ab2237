//! Moving a group between host and device: uploading its working copy (gathered from the other ranks
//! first where they hold parts of it), and adding a downloaded gradient into this rank's accumulator
//! (reduce-scattered across ranks first where the stage splits gradients).

use std::time::Instant;

use anyhow::Result;
use rayon::prelude::*;
use zerostream_offload::Tier;

use super::background_io::BackgroundIo;
use super::vocab_head::HostWords;
use super::worker::{AfterChange, SharedGroup, lock};
use super::{Clock, Precision, Trainer, schedule, timed};
use crate::comm::Onto;
use crate::comm::compress::GradCompression;
use crate::device::{Backend, HalfFormat};
use crate::ops::elementwise;

impl<D: Backend> Trainer<'_, D> {
    /// Uploads group `k`'s working copy into `tensors` (the head, or a block slot). With several ranks the
    /// other ranks' slices are gathered first: once per update into the whole copy (stages 1-2), or
    /// into a temporary for this upload alone (stage 3).
    pub(super) fn upload_group(&self, k: usize, tensors: &[&D::Tensor], clock: &mut Clock) -> Result<()> {
        let tensors: Vec<Option<&D::Tensor>> = tensors.iter().map(|&t| Some(t)).collect();
        self.upload_group_keeping(k, &tensors, &[], Vec::new(), clock)?;
        Ok(())
    }

    /// [`Self::upload_group`] into the group's tensors that are given (`None`: not on the device), and
    /// the working-copy words of tensors `keep` (table indices) copied out for the host, in that order,
    /// into the allocations of `spares` (the last step's copies, by table index) where they fit.
    pub(super) fn upload_group_keeping(
        &self,
        k: usize,
        tensors: &[Option<&D::Tensor>],
        keep: &[usize],
        mut spares: Vec<(usize, HostWords)>,
        clock: &mut Clock,
    ) -> Result<Vec<HostWords>> {
        // Spares of tensors not kept this time go now, before the upload.
        spares.retain(|(i, _)| keep.contains(i));
        let mut spare = |i: usize| spares.iter().position(|(t, _)| *t == i).map(|at| spares.swap_remove(at).1);
        self.wait_group(k, clock)?;
        if let Some(read_ahead) = &self.read_ahead {
            // A copy read ahead is taken, and paged out after its upload like one read here.
            timed(&mut clock.io_wait, || read_ahead.settle(Some(k)))?;
        }
        let mut shared = lock(&self.shared[k]);
        let nv = self.nvme.as_deref();
        // Held since its forward upload, or kept fresh by the update: paged in already, so this reads
        // nothing.
        let held = shared.held_for_backward.take();
        if std::mem::take(&mut shared.fresh) {
            self.progress.took_fresh();
        }
        timed(&mut clock.io_wait, || shared.working.page_in(nv))?;
        let mut kept = Vec::with_capacity(keep.len());
        let format = self.train.precision.half_format();
        // Only a streamed projection's copy is uploaded again (chunk by chunk): that one is pinned.
        let streamed_projection = (!self.placement.vocab_resident).then(|| self.model.vocab_tensors().1);
        let mut keep_words = |i: usize, words: &[u8]| {
            if keep.contains(&i) {
                let pin = |n: usize| if streamed_projection == Some(i) { self.pinned_buffer(n) } else { None };
                kept.push((i, HostWords::copy_of(words, format, spare(i), pin)));
            }
        };
        let dirty = match self.train.precision {
            Precision::Fp32 => {
                self.upload_words::<f32>(k, &mut shared, tensors, clock, |i, words| keep_words(i, bytemuck::cast_slice(words)))?
            }
            Precision::Bf16 | Precision::Fp16 => {
                self.upload_words::<u16>(k, &mut shared, tensors, clock, |i, words| keep_words(i, bytemuck::cast_slice(words)))?
            }
        };
        // A copy a gather completed is held too, and written back after its backward upload.
        let dirty = dirty || held == Some(true);
        if held.is_none() && k > 0 && self.placement.cached_working_blocks.contains(&(k - 1)) {
            shared.held_for_backward = Some(dirty);
        } else {
            shared.working.page_out(nv, dirty)?;
        }
        kept.sort_by_key(|&(i, _)| keep.iter().position(|&k| k == i));
        Ok(kept.into_iter().map(|(_, w)| w).collect())
    }

    /// A buffer of `len_bytes` in the device's pinned memory where it makes one and `--no-pin-memory`
    /// is not given, for host data uploaded again and again (the kept vocabulary matrices). A refusal
    /// is said once a run (process): the copy is then kept in ordinary memory and uploaded through
    /// staging, as with `--no-pin-memory`.
    fn pinned_buffer(&self, len_bytes: usize) -> Option<zerostream_offload::AlignedBuf> {
        static REFUSAL_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !self.train.pin_memory {
            return None;
        }
        match self.dev.alloc_pinned(len_bytes)? {
            Ok(buf) => Some(buf),
            Err(why) => {
                if !REFUSAL_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!(
                        "note: the streamed output projection's kept copy ({len_bytes} bytes) is not in pinned memory ({why}); its chunks upload through staging"
                    );
                }
                None
            }
        }
    }

    /// Lets go of the working copies held for a backward upload that will not come: those held at the
    /// step's end (a later micro-batch's backward upload of a block still in its slot from the one
    /// before is taken for a forward one) or by a forward-only validation. Written back where a gather
    /// completed them. So no copy is held across an update, and every step starts with none held.
    /// Fresh copies no upload took go too, so each sweep starts with none (every step's first forward
    /// takes them all, so in the schedules run today there are none left here).
    pub(super) fn release_held(&self, clock: &mut Clock) -> Result<()> {
        let nv = self.nvme.as_deref();
        for shared in self.shared.iter() {
            let mut group = lock(shared);
            if let Some(dirty) = group.held_for_backward.take() {
                timed(&mut clock.io_wait, || group.working.page_out(nv, dirty))?;
            }
            if std::mem::take(&mut group.fresh) {
                self.progress.took_fresh();
                group.working.page_out(nv, false)?;
            }
        }
        Ok(())
    }

    /// [`Self::upload_group`] for working-copy words of type `T` (f32, or 16-bit words), each tensor's
    /// words also shown to `host(index, words)`; returns whether the resident working copy changed (it
    /// was completed by a gather).
    fn upload_words<T: bytemuck::Pod + Default>(
        &self,
        k: usize,
        shared: &mut SharedGroup,
        tensors: &[Option<&D::Tensor>],
        clock: &mut Clock,
        mut host: impl FnMut(usize, &[T]),
    ) -> Result<bool> {
        let (shard, layout) = (&self.shards[k], &self.layouts[k]);
        let busy = self.dev.is_async();
        let mut dirty = false;
        let gathered: Vec<T>;
        let whole: &[T] = if self.sharding.shards_params() {
            let mut all = vec![T::default(); shard.padded_len];
            self.gather_working(shared.working.data().as_slice::<T>(), &mut all, busy)?;
            gathered = all;
            &gathered
        } else {
            if self.sharding.gathers_working() && shared.gathered != self.adam_steps {
                let w = shared.working.data_mut().as_mut_slice::<T>();
                let mine = w[shard.owned.clone()].to_vec();
                self.gather_working(&mine, w, busy)?;
                shared.gathered = self.adam_steps;
                dirty = true;
            }
            shared.working.data().as_slice::<T>()
        };
        let t0 = Instant::now();
        let format = self.train.precision.half_format();
        for (i, (t, slot)) in tensors.iter().zip(&layout.tensors).enumerate() {
            let words = &whole[slot.range()];
            host(i, words);
            match (t, format) {
                (None, _) => {}
                (Some(t), None) => self.dev.write(t, bytemuck::cast_slice(words)),
                (Some(t), Some(format)) => self.dev.write_16bit(t, bytemuck::cast_slice(words), format)?,
            }
        }
        clock.upload += t0.elapsed();
        // Only the tensors written to the device cross the bus (a streamed projection's chunks are
        // counted as they go).
        let uploaded: usize = tensors.iter().zip(&layout.tensors).filter(|(t, _)| t.is_some()).map(|(_, slot)| slot.len).sum();
        clock.upload_bytes += (uploaded * self.train.precision.working_bytes_per_param()) as u64;
        Ok(dirty)
    }

    /// The working copy's all-gather: every rank's slice into `out` from this rank's `mine` (words of
    /// the working precision), as they are or, with `--param-compression`, encoded and decoded — then
    /// `out` holds every slice decoded, this rank's own too, so every rank computes with the same copy.
    fn gather_working<T: bytemuck::Pod>(&self, mine: &[T], out: &mut [T], busy: bool) -> Result<()> {
        let format = self.train.precision.half_format();
        // bf16 of a bf16 working copy is the words themselves: gathered as they are.
        let codec = self.train.param_compression.codec().filter(|c| !(c.mode == GradCompression::Bf16 && format == Some(HalfFormat::Bf16)));
        let Some(codec) = codec else { return self.comm.all_gather_params(mine, out, busy) };
        let n = mine.len();
        let values = &self.gather_values;
        values.borrow_mut().resize(n, 0.0);
        let encode = |bytes: &mut [u8]| {
            let mut values = values.borrow_mut();
            words_to_f32(bytemuck::cast_slice(mine), format, &mut values);
            codec.encode(&values, bytes);
        };
        let mut slices = out.chunks_exact_mut(n.max(1));
        let decode = |bytes: &[u8]| {
            let (slice, mut values) = (slices.next().expect("a slice of the working copy per rank"), values.borrow_mut());
            codec.decode(bytes, &mut values);
            f32_to_words(&values, format, bytemuck::cast_slice_mut(slice));
        };
        self.comm.all_gather_encoded(codec.encoded_bytes(n), encode, decode, busy)
    }

    /// Makes block `l`'s parameters resident in a slot for this step; returns the slot.
    pub(super) fn ensure_block(&mut self, l: usize, clock: &mut Clock) -> Result<usize> {
        let slots = self.device.slots.len();
        let slot = l % slots;
        if self.device.slot_holds[slot] != Some((l, self.step)) {
            let tensors: Vec<&D::Tensor> = self.device.slots[slot].iter().collect();
            self.upload_group(1 + l, &tensors, clock)?;
            self.device.slot_holds[slot] = Some((l, self.step));
        }
        Ok(slot)
    }

    /// Starts reading block `l`'s working copy ahead of the `Fetch` that follows, where that fetch
    /// will read it: its slot does not hold it this step and its update for this step is done (before
    /// that, the sweep writes the copy). A copy already resident is left as it is.
    pub(super) fn read_ahead(&self, l: usize) -> Result<()> {
        let Some(read_ahead) = &self.read_ahead else { return Ok(()) };
        let in_slot = self.device.slot_holds[l % self.device.slots.len()] == Some((l, self.step));
        if in_slot || self.progress.lock().updated[1 + l] < self.adam_steps {
            return Ok(());
        }
        read_ahead.begin(1 + l)
    }

    /// Finishes a gradient group's download and adds it into this rank's accumulator (or stores it, for
    /// the step's `first` contribution; `last` is the step's last): with several ranks, reduce-scattered
    /// onto it (stages 2-3), or whole (stage 1, reduced at the end of the step; stage 0, all-reduced
    /// with the step's last). Returns whether any value would overflow 16-bit storage (checked in fp16
    /// only).
    pub(super) fn accumulate(&mut self, k: usize, pending: D::PendingRead, first: bool, last: bool, clock: &mut Clock) -> Result<bool> {
        // Added straight out of the device's read-back memory where it lends it (the gpu device's
        // mapping): no host copy of the gradient between the link and the accumulator.
        let t0 = Instant::now();
        let dev = self.dev;
        dev.finish_read_with(pending, |downloaded| {
            clock.download += t0.elapsed();
            clock.download_bytes += downloaded.iter().map(|d| 4 * d.len() as u64).sum::<u64>();
            self.add_grads(k, downloaded, first, last, clock)
        })
    }

    /// [`Self::accumulate`] for group `k`'s gradient already on the host, one vector per tensor in
    /// table order.
    pub(super) fn add_grads<V: AsRef<[f32]>>(
        &mut self,
        k: usize,
        downloaded: &[V],
        first: bool,
        last: bool,
        clock: &mut Clock,
    ) -> Result<bool> {
        let layout = &self.layouts[k];
        let check = self.train.precision == Precision::Fp16;
        let mut overflow = false;
        if check {
            for data in downloaded {
                overflow |= data.as_ref().iter().any(|g| !g.is_finite() || g.abs() > schedule::F16_MAX);
            }
        }
        let add = |acc: &mut [f32], data: &[f32]| {
            if first {
                elementwise::copy(acc, data);
            } else {
                elementwise::add_into(acc, data);
            }
        };
        let nv = self.nvme.clone();
        let nv = nv.as_deref();
        // A block's write overlaps the next block's backward, the head's the next micro-batch's
        // forward (or, after the step's last, the update's wait for it: `Op::Update` settles it).
        let write_behind = self.write_behind.as_ref();
        // The gradient's read-modify-write on NVMe (the addition included) is the device thread's wait
        // for its tier.
        let io_wait = if self.train.gradients_tier() == Tier::Nvme { Some(&mut clock.io_wait) } else { None };
        if self.sharding.world == 1 || self.sharding.replicates() {
            // One rank, or stage 0: each rank sums its micro-batches into its whole accumulator, and
            // (stage 0) the step's sum is all-reduced once, with the last micro-batch.
            let all_reduce = last && self.sharding.replicates();
            let (exchange, comm, updates, busy) = (&mut self.exchange, &self.comm, self.adam_steps, self.dev.is_async());
            let local = &mut self.reduce_scratch.0;
            change_grads_behind(write_behind, &self.shared, k, nv, first, last, io_wait, |acc| {
                for (data, slot) in downloaded.iter().zip(&layout.tensors) {
                    add(&mut acc[slot.range()], data.as_ref());
                }
                if all_reduce {
                    local.clear();
                    local.extend_from_slice(acc);
                    exchange.reduce(comm, nv, updates, k, local, acc, busy)?;
                }
                Ok(())
            })?;
        } else if !self.stage1_grads[k].is_empty() {
            for (data, slot) in downloaded.iter().zip(&layout.tensors) {
                add(&mut self.stage1_grads[k][slot.range()], data.as_ref());
            }
        } else {
            let shard = &self.shards[k];
            let (whole, mine) = &mut self.reduce_scratch;
            // The tensors cover 0..len; the padding after them must be zero (an earlier, longer group may
            // have left values there).
            whole.resize(shard.padded_len, 0.0);
            whole[shard.len..].fill(0.0);
            for (data, slot) in downloaded.iter().zip(&layout.tensors) {
                whole[slot.range()].copy_from_slice(data.as_ref());
            }
            let busy = self.dev.is_async();
            if self.exchange.plain_reduce_scatter(k, self.adam_steps) {
                // Exchanged first (beside the previous group's write-behind), then added onto the
                // accumulator one rank at a time, so this micro-batch's contributions land in the
                // order of their global index, as on one rank: the world size never changes a bit
                // (`tests/ranks.rs`).
                self.comm.exchange_slices(whole, shard.slice_len(), busy)?;
                let (comm, onto) = (&self.comm, if first { Onto::Replace } else { Onto::Add });
                change_grads_behind(write_behind, &self.shared, k, nv, first, last, io_wait, |acc| comm.sum_exchanged(acc, onto))?;
            } else {
                // Compressed, the sum is near the gradients' only: reduced, then added.
                mine.resize(shard.slice_len(), 0.0);
                self.exchange.reduce(&self.comm, nv, self.adam_steps, k, whole, mine, busy)?;
                change_grads_behind(write_behind, &self.shared, k, nv, first, last, io_wait, |acc| {
                    add(acc, mine);
                    Ok(())
                })?;
            }
        }
        Ok(overflow)
    }

    /// Stage 1 with several ranks: reduce-scatters each group's whole gradient (this rank's micro-batches
    /// summed) into this rank's slice.
    pub(super) fn reduce_stage1_grads(&mut self) -> Result<()> {
        let nv = self.nvme.clone();
        for k in 0..self.layouts.len() {
            if self.stage1_grads[k].is_empty() {
                continue;
            }
            let whole = &self.stage1_grads[k];
            let (comm, exchange, updates) = (&self.comm, &mut self.exchange, self.adam_steps);
            lock(&self.shared[k]).change_grads(nv.as_deref(), true, true, AfterChange::PageOut, |mine| {
                exchange.reduce(comm, nv.as_deref(), updates, k, whole, mine, false)
            })?;
        }
        Ok(())
    }
}

/// Group `k`'s gradient changed with `f` ([`SharedGroup::change_grads`]), its write-back to NVMe handed
/// to `write_behind` where there is one, so the write overlaps what the device thread does next; the
/// previous group's write is waited for first. The time it all takes is added to `io_wait` if given.
#[allow(clippy::too_many_arguments)]
fn change_grads_behind(
    write_behind: Option<&BackgroundIo>,
    shared: &[std::sync::Mutex<SharedGroup>],
    k: usize,
    nvme: Option<&zerostream_offload::NvmeDir>,
    first: bool,
    last: bool,
    io_wait: Option<&mut std::time::Duration>,
    f: impl FnOnce(&mut [f32]) -> Result<()>,
) -> Result<()> {
    let start = Instant::now();
    if let Some(writes) = write_behind {
        writes.settle(None)?;
    }
    let after = if write_behind.is_some() { AfterChange::LeaveResident } else { AfterChange::PageOut };
    lock(&shared[k]).change_grads(nvme, first, last, after, f)?;
    if let Some(writes) = write_behind {
        writes.begin(k)?;
    }
    if let Some(total) = io_wait {
        *total += start.elapsed();
    }
    Ok(())
}

/// Elements per parallel task of the word conversions around `--param-compression`.
const CONVERT_TASK_ELEMS: usize = 1 << 14;

/// Working-copy words (f32, or 16-bit words of `format`) as f32 values, on rayon's threads.
fn words_to_f32(words: &[u8], format: Option<HalfFormat>, out: &mut [f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    let Some(format) = format else { return out.copy_from_slice(bytemuck::cast_slice(words)) };
    let words = bytemuck::cast_slice::<u8, u16>(words);
    out.par_chunks_mut(CONVERT_TASK_ELEMS).zip(words.par_chunks(CONVERT_TASK_ELEMS)).for_each(|(o, w)| match format {
        HalfFormat::Bf16 => o.iter_mut().zip(w).for_each(|(o, &w)| *o = half::bf16::from_bits(w).to_f32()),
        // By slice: F16C checked once, 8 at a time (element by element it is checked for every one).
        HalfFormat::F16 => w.reinterpret_cast::<half::f16>().convert_to_f32_slice(o),
    });
}

/// f32 values as working-copy words (rounded to nearest even for 16-bit formats), on rayon's threads.
fn f32_to_words(values: &[f32], format: Option<HalfFormat>, words: &mut [u8]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    let Some(format) = format else { return words.copy_from_slice(bytemuck::cast_slice(values)) };
    let words = bytemuck::cast_slice_mut::<u8, u16>(words);
    words.par_chunks_mut(CONVERT_TASK_ELEMS).zip(values.par_chunks(CONVERT_TASK_ELEMS)).for_each(|(w, v)| match format {
        HalfFormat::Bf16 => w.iter_mut().zip(v).for_each(|(w, &v)| *w = half::bf16::from_f32(v).to_bits()),
        HalfFormat::F16 => w.reinterpret_cast_mut::<half::f16>().convert_from_f32_slice(v),
    });
}
